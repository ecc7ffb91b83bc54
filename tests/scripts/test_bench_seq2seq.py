"""scripts/benchmarks/bench_seq2seq.py runs every kind of engine and prints its tables (speed is measured by the
script on a quiet machine, not asserted here). FastDecoding runs uncompiled to keep the check short."""

from __future__ import annotations

import pytest

from tests.utils import REPO_ROOT, load_script

pytest.importorskip("ctranslate2")


def _bench():
    return load_script("scripts/benchmarks/bench_seq2seq.py")


def test_quick_run_prints_the_tables(capsys, tmp_path):
    bench = _bench()
    argv = [
        "--output",
        str(tmp_path / "speed.csv"),
        "--quick",
        "--engines",
        "marian,ours,ours-fast,ours-fast-full,ours-fast-int8,ct2-fp32,ct2-export",
        "--fast_backend",
        "eager",
        "--vocab_size",
        "300",
        "--d_model",
        "32",
        "--layers",
        "2",
        "--heads",
        "2",
        "--ffn_dim",
        "64",
        "--threads",
        "1",
        "2",
    ]
    summary = bench.main(argv)
    out = capsys.readouterr().out
    assert "| generate greedy, batch 1" in out and "| generate beam 2, batch 2" in out
    assert "compilation: first call of each shape" in out
    for label in ("generate greedy, batch 1", "generate beam 2, batch 2"):
        engines = {"marian", "ours", "ours-fast", "ours-fast-full", "ours-fast-int8", "ct2-fp32", "ct2-export"}
        assert set(summary[label]) == engines
    # each engine at its fastest of 1 and 2 threads, both measured; ours against CTranslate2 at the same precision
    for label in ("generate greedy, batch 1", "generate beam 2, batch 2"):
        for entry in summary[label].values():
            assert set(entry["rates_by_threads"]) == {1, 2}
            assert entry["rate"] == max(entry["rates_by_threads"].values())
            assert entry["threads"] in (1, 2) and entry["rates_by_threads"][entry["threads"]] == entry["rate"]
        fast = summary[label]["ours-fast"]
        assert fast["ctranslate2_peer"] == "ct2-fp32"
        assert fast["vs_ctranslate2"] == pytest.approx(fast["rate"] / summary[label]["ct2-fp32"]["rate"])
        assert f"summary | {label} | ours-fast " in out
    assert "vs_ctranslate2" not in summary["generate greedy, batch 1"]["ours-fast-int8"]  # no ct2-int8 in this run
    assert "load average (1 minute" in out
    # the same weights in every float32 engine: the greedy tokens agree
    agreement = summary["agreement"]
    assert agreement["marian"]["ours"] == agreement["marian"]["ours-fast"] == 1.0
    assert agreement["ours-fast"]["ct2-export"] == agreement["ours-fast"]["ours-fast-full"] == 1.0
    # float32 greedy at batch 1 chose through the output screen, where torch has FBGEMM's float16 linear
    from hf_vit_plus.models.fast_kernels import fbgemm_fp16_available

    if fbgemm_fp16_available():
        assert "greedy steps chose through the output screen" in out
        assert summary["screen"]["ours-fast"][0] > 0 and "ours-fast-full" not in summary["screen"]
    # --output: the table's rows with the run's context (scripts/benchmarks/result_rows.py)
    import csv

    import torch

    with open(tmp_path / "speed.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    generation = [row for row in rows if row["case"].startswith("generate")]
    assert len(generation) == 4 * 7 and {row["engine"] for row in generation} == engines
    marian = [row for row in rows if row["engine"] == "marian"]
    assert all(float(row["vs_marian"]) == 1.0 for row in marian)
    first = rows[0]
    assert first["torch"] == torch.__version__.split("+")[0] and first["d_model"] == "32"
    fast = {row["case"]: row for row in generation if row["engine"] == "ours-fast"}
    for row in generation:
        assert row["threads"] == str(summary[row["case"]][row["engine"]]["threads"]) and row["load_average"]
    assert float(fast["generate greedy, batch 1"]["vs_ctranslate2"]) > 0
    assert all(row["vs_ctranslate2"] == "" for row in generation if row["engine"] != "ours-fast")
    assert first["command"].startswith("python ") and len(first["date"]) == 10 and first["device"]
    # the columns of the committed result file the docs' Results page shows, so that a rerun with --output replaces it
    with open(REPO_ROOT / "results" / "fast_decoding.csv", newline="") as file:
        assert list(first) == next(csv.reader(file))


def test_the_output_keeps_the_other_presets_rows(tmp_path):
    """--output replaces the file's rows of the run's preset and keeps the others, with their own run's context."""
    import csv

    bench = _bench()
    path = tmp_path / "speed.csv"
    path.write_text(
        "case,engine,tokens_per_s,preset,command,date,device,threads\n"
        "old small,marian,1,small,python old,2026-01-01,old cpu,1\n"
        "old opus,marian,2,opus-mt,python old,2026-01-02,old cpu,2\n"
    )
    args = bench.parse_args(["--output", str(path)])
    args.repeats, args.load_averages = 1, [0.5, 1.5]
    entry = dict(rate=3.0, ratio=1.0, range=(1.0, 1.0), threads=2, vs_ctranslate2=1.25, vs_ctranslate2_range=(1, 2))
    bench.write_speed_rows(args, {"agreement": {}, "generate greedy, batch 1": {"ours-fast": entry}})
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert [(row["case"], row["preset"]) for row in rows] == [
        ("generate greedy, batch 1", "small"),
        ("old opus", "opus-mt"),
    ]
    new, old = rows
    assert (new["threads"], new["vs_ctranslate2"], new["load_average"]) == ("2", "1.25", "0.50-1.50")
    assert (old["command"], old["date"], old["device"], old["threads"]) == ("python old", "2026-01-02", "old cpu", "2")
    assert old["vs_ctranslate2"] == "" and list(rows[0])[-1] == "threads"


def test_presets():
    bench = _bench()
    args = bench.parse_args(["--preset", "opus-mt"])
    assert (args.vocab_size, args.d_model, args.layers, args.ffn_dim, args.threads) == (58000, 512, 6, 2048, [1, 2])
    args = bench.parse_args(["--preset", "opus-mt", "--threads", "1", "--layers", "2"])
    assert (args.threads, args.layers, args.d_model) == ([1], 2, 512)
    assert bench.parse_args([]).threads == [1, 2]  # each engine at its fastest of 1 and 2 threads
    assert bench.parse_args([]).d_model == 256


def test_profile_helpers():
    """The profile's floor (a plain read's rate) and the --quality engine lists."""
    bench = _bench()
    rate = bench.memory_read_rate(megabytes=8)
    assert 1e8 < rate < 1e13  # bytes per second: between 0.1 GB/s and 10 TB/s
    assert bench._names("float32, int8,,") == ["float32", "int8"] and bench._names("") == []
    args = bench.parse_args(["--quality", "x", "--quality_precisions", "int8", "--quality_ctranslate2", ""])
    assert args.quality_precisions == ["int8"] and args.quality_ctranslate2 == []
    assert bench.parse_args([]).quality_ctranslate2 == ["float32", "int8"]
    with pytest.raises(SystemExit):  # an unknown precision is refused before any model is loaded
        bench.parse_args(["--quality", "x", "--quality_precisions", "int9"])
