"""scripts/benchmarks/bench_small_data.py: the rows it trains, in which order and with which flags, the table it
prints, and what it refuses. (A run trains for minutes per row on Fashion-MNIST: results/small_data.csv, not
asserted here.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.utils import load_script


def _bench():
    return load_script("scripts/benchmarks/bench_small_data.py")


def test_every_row_is_a_train_run_of_the_issues_table():
    bench = _bench()
    out = Path("/runs")
    assert bench.ROWS[0] == "cnn"  # the teacher is trained first
    assert bench.row_runs("cnn", out) == [("vit", {"model_type": "resnet", "recipe": "deit"})]
    assert bench.row_runs("vit-plain", out) == [("vit", {"recipe": "none"})]
    assert bench.row_runs("vit-deit-distilled", out) == [("vit", {"recipe": "deit", "teacher": "/runs/cnn"})]
    pre, tune = bench.row_runs("vit-mpp-then-deit", out)
    assert pre[0] == "vit-mpp" and tune[1]["model_name_or_path"] == pre[1]["output_dir"]
    assert bench.row_runs("transformers-vit-deit", out) == [("vit", {"model_type": "vit", "recipe": "deit"})]
    with pytest.raises(ValueError, match="Unknown row 'mae'"):
        bench.row_runs("mae", out)


def test_vit_config_overrides_shape_every_fresh_vit_but_not_the_cnn_or_a_loaded_encoder():
    bench = _bench()
    out = Path("/runs")
    assert bench.row_runs("cnn", out, "patch_size=7") == [("vit", {"model_type": "resnet", "recipe": "deit"})]
    assert bench.row_runs("vit-deit", out, "patch_size=7") == [
        ("vit", {"recipe": "deit", "config_overrides": "patch_size=7"})
    ]
    pre, tune = bench.row_runs("vit-mpp-then-deit", out, "patch_size=7")
    assert pre[1]["config_overrides"] == "patch_size=7"  # the pre-trained encoder is shaped once, then loaded
    assert "config_overrides" not in tune[1]
    assert bench.row_runs("vit-plain", out) == [("vit", {"recipe": "none"})]  # nothing given: the default shape


def test_vit_flags_change_the_classifier_run_and_name_the_row(capsys, tmp_path):
    bench = _bench()
    out = Path("/runs")
    flags = bench.parse_flags(["auto_augment=none", "mixup_alpha=0", "random_erasing_prob=0.5"])
    assert flags == {"auto_augment": "none", "mixup_alpha": 0, "random_erasing_prob": 0.5}  # typed, as the CLI's
    from hf_vit_plus.training.args import family_arguments

    typed = family_arguments("vit", output_dir=str(tmp_path), **flags)  # refuses '0.5' (a string) for a number
    assert typed.random_erasing_prob == 0.5 and typed.auto_augment == "none"
    pre, tune = bench.row_runs("vit-mpp-then-deit", out, "patch_size=7", flags)
    assert "auto_augment" not in pre[1] and tune[1]["auto_augment"] == "none"
    assert bench.row_runs("cnn", out, None, flags) == [("vit", {"model_type": "resnet", "recipe": "deit"})]
    args = type("Args", (), dict(vit_config_overrides="patch_size=7", vit_flags=flags))()
    assert bench.row_label("vit-deit", args) == (
        "vit-deit (patch_size=7, auto_augment=none, mixup_alpha=0, random_erasing_prob=0.5)"
    )
    assert bench.row_label("cnn", args) == "cnn"
    with pytest.raises(SystemExit):
        bench.main(["--vit_flags", "auto_augment", "--output_dir", str(tmp_path)])
    assert "KEY=VALUE items, got 'auto_augment'" in capsys.readouterr().err


def test_the_table_gives_accuracy_minutes_and_the_heads(capsys):
    bench = _bench()
    args = type("Args", (), dict(minutes_per_row=2.0, batch_size=128, threads=1))()
    results = [
        dict(row="vit-deit-distilled", test_accuracy=0.8512, minutes=2.04, updates=[300], epochs=[0.64],
             metrics={"accuracy": 0.8512, "cls_head_accuracy": 0.84, "distillation_head_accuracy": 0.85}),
        dict(row="vit-mpp-then-deit", test_accuracy=0.8, minutes=1.9, updates=[100, 120], epochs=[0.2, 0.25],
             metrics={"accuracy": 0.8, "online_accuracy": 0.79}),
    ]  # fmt: skip
    text = bench.table(results, args)
    assert "2 training minutes per row" in text
    assert "| vit-deit-distilled | 85.12% | 2.0 | 300 | 0.64 |" in text
    assert "| vit-mpp-then-deit | 80.00% | 1.9 | 100 + 120 | 0.20 + 0.25 |" in text
    assert "cls_head_accuracy 84.00%" in text and "online_accuracy 79.00%" in text


def test_the_distilled_row_needs_its_teacher(tmp_path, capsys):
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.main(["--rows", "vit-deit-distilled", "--output_dir", str(tmp_path)])
    assert "needs the CNN teacher" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--mpp_share", "1.5", "--output_dir", str(tmp_path)])
    assert "--mpp_share must be in (0, 1)" in capsys.readouterr().err


def test_plot_only_prints_the_table_and_draws_the_loss_by_minutes(tmp_path, capsys):
    """`--plot_only` trains nothing: it reads results.json, prints the table and draws curves.png; each row's loss is
    placed at its training minutes (updates x the run's time per update), the MPP row's after its pre-training."""
    import json

    bench = _bench()
    for name, steps in (("vit-deit", 4), ("tuned", 2)):
        (tmp_path / name).mkdir()
        history = [{"step": s, "loss": 2.0 / s} for s in range(1, steps + 1)] + [{"step": steps, "eval_accuracy": 0.5}]
        (tmp_path / name / "log_history.json").write_text(json.dumps(history))
    results = [
        dict(row="vit-deit", test_accuracy=0.9, minutes=2.0, updates=[4], epochs=[0.01], metrics={}),  # no outputs:
        dict(row="vit-mpp-then-deit", test_accuracy=0.8, minutes=3.0, updates=[3, 2], epochs=[0.01, 0.01], metrics={},
             outputs=[str(tmp_path / "pre"), str(tmp_path / "tuned")], seconds=[60.0, 120.0]),
    ]  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    minutes, losses = bench.loss_curve(results[0], tmp_path)  # an older results.json: the row's own folder
    assert minutes == [0.5, 1.0, 1.5, 2.0] and losses == [2.0, 1.0, 2.0 / 3, 0.5]
    minutes, _ = bench.loss_curve(results[1], tmp_path)
    assert minutes == [2.0, 3.0]  # 1 minute of pre-training, then 1 minute per update
    bench.main(["--plot_only", "--output_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| vit-deit | 90.00% | 2.0 | 4 | 0.01 |" in out and "curves.png" in out
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_time_augmentation_prints_the_per_batch_table(capsys):
    bench = _bench()
    threads = torch.get_num_threads()
    bench.main(["--time_augmentation", "--batch_size", "8"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "ms per batch" not in line]
    assert len(rows) == 6 and "batched" in rows[1] and "BatchAutoAugment" in rows[3]
    assert rows[1].endswith("| 1.0 |")  # the batched row is the unit of the ratios
    assert all(float(row.split("|")[2]) > 0 for row in rows)
    assert torch.get_num_threads() == threads  # timed on one thread, the caller's setting restored


def test_time_precision_prints_fp32_against_bf16_per_update(capsys):
    bench = _bench()
    threads = torch.get_num_threads()
    bench.main(["--time_precision", "--batch_size", "4", "--threads", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| width")]
    assert len(rows) == 3 and "native bf16 products:" in out
    for row in rows:
        fp32, bf16, ratio = (float(cell) for cell in row.split("|")[2:5])
        assert fp32 > 0 and bf16 > 0
        # the times are printed to 0.1 ms and the ratio to 0.01, each from the unrounded times
        low, high = (fp32 - 0.05) / (bf16 + 0.05), (fp32 + 0.05) / max(bf16 - 0.05, 1e-9)
        assert low - 0.005 <= ratio <= high + 0.005
    assert torch.get_num_threads() == threads  # the caller's setting restored


def test_the_calibration_times_the_full_runs_recipe(monkeypatch, tmp_path):
    """The recipe scales RandAugment's share of the images with the run's length, so a short probe alone times a
    cheaper run than the final one: the next two probes are the estimated full run, stopped after the calibration's
    updates and after three times as many, and their time per update sets the final run's length."""
    bench = _bench()
    calls = []

    def fake_run_once(family, flags, threads):
        calls.append(dict(flags))
        if flags["max_steps"] == 10 and "stop_after_steps" not in flags:
            return {"seconds": 10 * 0.05, "updates": 10}  # the short probe: cheap augmentation
        if flags.get("stop_after_steps"):  # the full run's recipe, stopped early
            return {"seconds": flags["stop_after_steps"] * 0.08, "updates": flags["stop_after_steps"]}
        return {"seconds": flags["max_steps"] * 0.08, "updates": flags["max_steps"], "metrics": {"accuracy": 0.9}}

    monkeypatch.setattr(bench, "run_once", fake_run_once)
    result = bench.train_row("vit-deit", _calibration_args(), tmp_path)
    first, second, third, final = calls
    assert first["max_steps"] == 10 and "stop_after_steps" not in first
    assert second["max_steps"] == third["max_steps"] == 1200  # the first's estimate
    assert (second["stop_after_steps"], third["stop_after_steps"]) == (10, 30)
    assert final["max_steps"] == 750 and "stop_after_steps" not in final  # 60 s at the full run's 0.08 s an update
    assert second["recipe"] == final["recipe"] == "deit"
    assert result["minutes"] == pytest.approx(1.0)


def test_the_calibration_counts_a_compilation_once(monkeypatch, tmp_path):
    """A run that first compiles (--torch_compile: 20-25 s before the first update) costs that once, not once per
    update: the probes' mean time per update (0.08 + 20 / 10 s) would fit 29 updates in a minute; the line through
    the two probes of the full run fits (60 - 20) / 0.08 = 500."""
    bench = _bench()
    calls = []

    def fake_run_once(family, flags, threads):
        calls.append(dict(flags))
        updates = flags.get("stop_after_steps") or flags["max_steps"]
        return {"seconds": 20.0 + updates * 0.08, "updates": updates, "metrics": {"accuracy": 0.9}}

    monkeypatch.setattr(bench, "run_once", fake_run_once)
    bench.train_row("vit-deit", _calibration_args(vit_flags={"torch_compile": True}), tmp_path)
    assert calls[-1]["max_steps"] == 500 and calls[-1]["torch_compile"] is True


def _calibration_args(**changes):
    fields = dict(minutes_per_row=1.0, calibration_steps=10, batch_size=128, threads=1, seed=0,
                  vit_config_overrides=None, vit_flags=None, mpp_share=0.5)  # fmt: skip
    return type("Args", (), {**fields, **changes})()
