"""The benchmarks write their rows to result files (scripts/benchmarks/result_rows.py): each row carries its
measurements and the run's context. Tiny runs of bench_vit.py and bench_sparse_attention.py (speed itself is measured
on a quiet machine, not asserted here), and bench_small_data.py's rows from a finished run's results.json."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from tests.utils import REPO_ROOT, load_script

CONTEXT = {"command", "date", "hf_vit_plus", "python", "torch", "transformers", "device", "isa", "isa_capped",
           "threads", "machine"}  # fmt: skip


@pytest.fixture(scope="module")
def preloaded():
    """The interpreter the scripts fork from (tests/preloaded_python.py): torch, transformers and hf_vit_plus imported
    once, not once per script (a script capped with --isa starts a fresh interpreter itself, as it does alone)."""
    from tests.preloaded_python import PreloadedPython

    server = PreloadedPython(dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    yield server
    server.close()


def _run(preloaded, script: str, *argv: str, cwd) -> None:
    proc = preloaded.run([str(REPO_ROOT / "scripts" / "benchmarks" / script), *argv], cwd, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def _rows(path) -> list[dict]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _context_is_this_run(row: dict, script: str, isa: str | None = None) -> None:
    """The row's context is this run's: versions, device, command, date, and the instruction set (`isa`: the level
    the run was capped at; default this process's)."""
    from hf_vit_plus.models.cpu_isa import isa_capped, isa_label

    assert row["torch"] == torch.__version__.split("+")[0] and row["hf_vit_plus"] and row["device"]
    assert (row["isa"], row["isa_capped"]) == (isa_label(isa), str(isa_capped(isa)).lower())
    assert row["command"].startswith("python ") and script in row["command"] and len(row["date"]) == 10


def test_bench_vit_writes_its_throughput_rows(preloaded, tmp_path):
    """At `--isa avx2` where the CPU has AVX2: the script starts again capped, and its rows say so."""
    from hf_vit_plus.models.cpu_isa import supported_isa

    isa = None if supported_isa() == "generic" else "avx2"
    _run(
        preloaded,
        "bench_vit.py",
        *(["--isa", isa] if isa else []),
        "--preset",
        "tiny-patch16-224",
        "--batch_sizes",
        "1",
        "2",
        "--precisions",
        "fp32",
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--output",
        str(tmp_path / "vit.csv"),
        cwd=tmp_path,
    )
    rows = _rows(tmp_path / "vit.csv")
    assert [(row["precision"], row["batch"]) for row in rows] == [("fp32", "1"), ("fp32", "2")]
    for row in rows:
        assert float(row["ours_images_per_s"]) > 0 and float(row["timm_images_per_s"]) > 0
        ratio = float(row["ours_images_per_s"]) / float(row["timm_images_per_s"])
        assert abs(float(row["vs_timm"]) - ratio) < 0.01 * ratio
        assert row["threads"] == "1"
        _context_is_this_run(row, "bench_vit.py", isa)


def test_bench_vit_times_a_training_step_of_each_model(preloaded, tmp_path):
    """--training_step: one fp32 update (forward, backward, AdamW) of each model on its own copy of the weights."""
    _run(preloaded,
         "bench_vit.py", "--training_step", "--preset", "tiny-patch16-224", "--batch_sizes", "2", "--repeats", "1",
         "--warmup", "1", "--threads", "1", "--output", str(tmp_path / "step.csv"), cwd=tmp_path)  # fmt: skip
    (row,) = _rows(tmp_path / "step.csv")
    assert (row["precision"], row["batch"], row["fp32_matmul_opt_in"]) == ("fp32-training-step", "2", "False")
    ratio = float(row["ours_images_per_s"]) / float(row["timm_images_per_s"])
    assert abs(float(row["vs_timm"]) - ratio) < 0.01 * ratio and 0 < float(row["ours_share_of_gemm_peak"]) < 1.5
    _context_is_this_run(row, "bench_vit.py")


def test_bench_sparse_attention_writes_its_rows(preloaded, tmp_path):
    _run(preloaded, "bench_sparse_attention.py", "--max_n", "1024", "--repeats", "1", "--no_memory", "--no_flex",
         "--output", str(tmp_path / "sparse.csv"), cwd=tmp_path)  # fmt: skip
    rows = _rows(tmp_path / "sparse.csv")
    kernels = {row["kernel"] for row in rows}
    assert {"sdpa", "sparse_block"} <= kernels and {row["n"] for row in rows} == {"1024"}
    sdpa = next(row for row in rows if row["kernel"] == "sdpa")
    assert float(sdpa["fwd_vs_sdpa"]) == 1.0 and sdpa["peak_mb"] == ""
    _context_is_this_run(rows[0], "bench_sparse_attention.py")


def test_bench_sparse_lm_writes_its_rows(preloaded, tmp_path):
    _run(preloaded,
         "bench_sparse_lm.py", "--patterns", "strided,dense", "--steps", "4", "--layers", "1", "--hidden_size", "16",
         "--heads", "2", "--train_bytes", "60000", "--heldout_bytes", "10000", "--eval_windows", "1", "--threads", "1",
         "--output", str(tmp_path / "lm.csv"), cwd=tmp_path)  # fmt: skip
    rows = _rows(tmp_path / "lm.csv")
    assert [row["attention"] for row in rows] == ["strided", "dense"]
    for row in rows:
        assert 0 < float(row["held_out_bits_per_byte"]) < 9 and float(row["s_per_step"]) > 0
        assert row["context"] == "2048" and 0 < float(row["unigram_bits_per_byte"]) < 8
    assert float(rows[1]["speed_vs_dense"]) == 1.0
    _context_is_this_run(rows[0], "bench_sparse_lm.py")
    committed = _rows(REPO_ROOT / "results" / "sparse_lm.csv")[0]  # a run with --output can replace the file
    assert [key for key in committed if key not in CONTEXT] == [key for key in rows[0] if key not in CONTEXT]


def test_bench_sharding_writes_its_rows(preloaded, tmp_path):
    overrides = "num_hidden_layers=1,hidden_size=32,num_attention_heads=2,intermediate_size=64,patch_size=8"
    _run(preloaded,
         "bench_sharding.py", "--processes", "2", "--steps", "1", "--image_size", "32", "--config_overrides",
         overrides, "--output", str(tmp_path / "sharding.csv"), cwd=tmp_path)  # fmt: skip
    rows = _rows(tmp_path / "sharding.csv")
    assert [(row["processes"], row["run"]) for row in rows] == [("2", "DDP"), ("2", "FSDP2")]
    ddp, fsdp = rows
    assert float(ddp["state_vs_ddp"]) == 1.0
    # FSDP2 on 2 processes holds about half the parameters, gradients and Adam state of DDP in each process
    assert float(fsdp["state_mib"]) < 0.7 * float(ddp["state_mib"])
    parts = ("params_mib", "grads_mib", "adam_state_mib")
    assert abs(float(ddp["state_mib"]) - sum(float(ddp[key]) for key in parts)) < 0.003
    # the columns of the committed file, so that a run with --output can replace it
    committed = _rows(REPO_ROOT / "results" / "sharding_memory.csv")[0]
    assert [key for key in committed if key not in CONTEXT] == [key for key in ddp if key not in CONTEXT]
    _context_is_this_run(ddp, "bench_sharding.py")


def test_bench_small_data_writes_the_rows_of_a_finished_run(preloaded, tmp_path):
    """`--plot_only --output` trains nothing: the rows of results.json become rows with the columns of
    results/small_data.csv (accuracies in percent, a two-run row's updates joined), each with the run's context."""
    for folder in ("cnn", "hybrid", "pre", "tuned"):
        (tmp_path / folder).mkdir()
        history = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}]
        (tmp_path / folder / "log_history.json").write_text(json.dumps(history))
    results = [
        dict(row="cnn", name="cnn", model="ResNet", config_overrides=None, recipe="deit", flags="", budget_minutes=2.0,
             test_accuracy=0.6391, minutes=1.3, updates=[121], epochs=[0.258], metrics={"online_accuracy": 0.6388},
             outputs=[str(tmp_path / "cnn")], seconds=[78.0]),
        dict(row="vit-deit-distilled (conv_stem_layers=3, auto_augment=none)", name="vit-deit-distilled",
             model="ViTPlus hybrid", config_overrides="conv_stem_layers=3", recipe="deit", flags="auto_augment=none",
             budget_minutes=2.0, test_accuracy=0.5, minutes=2.0, updates=[40], epochs=[0.085],
             metrics={"cls_head_accuracy": 0.51, "distillation_head_accuracy": 0.49},
             outputs=[str(tmp_path / "hybrid")], seconds=[120.0]),
        # as an older results.json wrote it: the name and settings come from the command line
        dict(row="vit-mpp-then-deit", test_accuracy=0.2051, minutes=1.5, updates=[40, 45], epochs=[0.09, 0.1],
             metrics={}, outputs=[str(tmp_path / "pre"), str(tmp_path / "tuned")], seconds=[40.0, 50.0]),
    ]  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    _run(preloaded, "bench_small_data.py", "--plot_only", "--output_dir", str(tmp_path), "--minutes_per_row", "2",
         "--vit_config_overrides", "patch_size=4", "--output", str(tmp_path / "small.csv"), cwd=tmp_path)  # fmt: skip
    rows = _rows(tmp_path / "small.csv")
    with open(REPO_ROOT / "results" / "small_data.csv", newline="") as file:
        assert list(rows[0]) == next(csv.reader(file))  # the committed file's columns, in its order
    cnn, hybrid, mpp = rows
    assert (cnn["row"], cnn["model"], cnn["config_overrides"], cnn["recipe"]) == ("cnn", "ResNet", "", "deit")
    assert (cnn["test_accuracy_pct"], cnn["ema_last_accuracy_pct"], cnn["minutes"]) == ("63.91", "63.88", "1.30")
    assert (hybrid["row"], hybrid["model"], hybrid["flags"]) == ("vit-deit-distilled", "ViTPlus hybrid",
                                                                 "auto_augment=none")  # fmt: skip
    assert (hybrid["cls_head_accuracy_pct"], hybrid["distillation_head_accuracy_pct"]) == ("51.00", "49.00")
    assert (mpp["row"], mpp["model"], mpp["config_overrides"]) == ("vit-mpp-then-deit", "ViTPlus", "patch_size=4")
    assert (mpp["updates"], mpp["epochs"], mpp["budget_minutes"]) == ("40 + 45", "0.09 + 0.10", "2")
    for row in rows:
        assert row["threads"] == "1"
        _context_is_this_run(row, "bench_small_data.py")


def test_bench_small_data_timings_write_their_rows(preloaded, tmp_path):
    """`--time_augmentation` and `--time_precision` write rows with the columns of the committed timing files."""
    for flag, name in (("--time_augmentation", "small_data_augmentation.csv"),
                       ("--time_precision", "small_data_update_time.csv")):  # fmt: skip
        _run(preloaded,
             "bench_small_data.py", flag, "--batch_size", "4", "--threads", "1", "--output", str(tmp_path / name),
             cwd=tmp_path)  # fmt: skip
        rows = _rows(tmp_path / name)
        with open(REPO_ROOT / "results" / name, newline="") as file:
            assert list(rows[0]) == next(csv.reader(file)), name
        assert all(float(row["ms_per_batch" if "augmentation" in name else "ms"]) > 0 for row in rows)
        assert rows[0]["threads"] == "1"
        _context_is_this_run(rows[0], "bench_small_data.py")
    augmentation = _rows(tmp_path / "small_data_augmentation.csv")
    assert len(augmentation) == 6 and augmentation[1]["x_batched"] == "1.0" and augmentation[4]["images"] == "1"
    update = _rows(tmp_path / "small_data_update_time.csv")
    assert [row["precision"] for row in update] == ["fp32", "bf16 autocast"] * 3
    assert update[0]["config_overrides"] == ""  # the built-in shape
    assert update[2]["config_overrides"] == "hidden_size=128,intermediate_size=256"
    assert int(update[0]["parameters"]) > 0 and float(update[1]["fp32_over_bf16"]) > 0


def _bench_int8_quality():
    return load_script("scripts/benchmarks/bench_int8_quality.py")


def test_bench_int8_quality_writes_the_columns_of_its_result_file(tmp_path, monkeypatch):
    """--output's rows have the columns of the committed results/int8_quality.csv, empty where a task has no value
    (fp32 changes no prediction); with no rows (a skipped task) no file is written. No model is trained here."""
    bench = _bench_int8_quality()
    rows = [
        {"task": "digits ViT", "variant": "fp32", "metric": "accuracy %", "value": 97.5, "examples": 360,
         "seconds": 0.1},
        {"task": "digits ViT", "variant": "int8-dynamic", "metric": "accuracy %", "value": 97.2, "examples": 360,
         "seconds": 0.2, "changed_predictions": 1, "max_logit_change": 0.05},
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["scripts/benchmarks/bench_int8_quality.py", "--output", "x.csv"])
    written = _rows(bench.write_result_rows(tmp_path / "int8.csv", rows, threads=1))
    with open(REPO_ROOT / "results" / "int8_quality.csv", newline="") as file:
        committed = next(csv.reader(file))
    assert list(written[0]) == committed
    assert written[0]["changed_predictions"] == "" and written[1]["changed_predictions"] == "1"
    assert written[1]["value"] == "97.2" and written[1]["threads"] == "1"
    _context_is_this_run(written[0], "bench_int8_quality.py")

    bench.main(["--tasks", "sword", "--output_dir", str(tmp_path / "out"), "--output", str(tmp_path / "none.csv")])
    assert not (tmp_path / "none.csv").exists()


def test_bench_input_pipeline_writes_its_rows(preloaded, tmp_path):
    """A tiny run of the image loaders (ours read whole and streamed, timm's) and the text loaders (token budget,
    fixed batches): one row each, with what they measured."""
    from hf_vit_plus.data.fashion_mnist import FASHION_MNIST_DIR
    from hf_vit_plus.data.sword import DEFAULT_SWORD_ROOTS

    if not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("Fashion-MNIST (Debian's dataset-fashion-mnist) is not installed")
    parts = "images,text" if any(Path(root, "mods.d").is_dir() for root in DEFAULT_SWORD_ROOTS) else "images"
    _run(preloaded,
         "bench_input_pipeline.py", "--parts", parts, "--images", "200", "--workers", "1", "--batch_size", "8",
         "--batches", "2", "--warmup", "0", "--rounds", "1", "--pairs", "300", "--max_tokens", "512",
         "--work_dir", str(tmp_path / "work"), "--output", str(tmp_path / "pipeline.csv"), cwd=tmp_path)  # fmt: skip
    rows = _rows(tmp_path / "pipeline.csv")
    images = [row for row in rows if row["part"] == "images"]
    assert [row["case"] for row in images] == ["timm create_loader", "ours, read whole", "ours, streamed"]
    assert all(float(row["images_per_s"]) > 0 and row["workers"] == "1" and row["examples"] == "200" for row in images)
    assert float(images[0]["vs_reference"]) == 1.0
    for row in rows:
        if row["part"] == "text":
            assert float(row["tokens_per_s"]) > 0 and 0 <= float(row["padding_fraction"]) < 1
        _context_is_this_run(row, "bench_input_pipeline.py")
    committed = _rows(REPO_ROOT / "results" / "input_pipeline.csv")[0]
    assert [key for key in committed if key not in CONTEXT] == [key for key in rows[0] if key not in CONTEXT]
