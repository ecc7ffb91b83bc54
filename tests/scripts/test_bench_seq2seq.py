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
    ]
    summary = bench.main(argv)
    out = capsys.readouterr().out
    assert "| generate greedy, batch 1" in out and "| generate beam 2, batch 2" in out
    assert "compilation: first call of each shape" in out
    for label in ("generate greedy, batch 1", "generate beam 2, batch 2"):
        engines = {"marian", "ours", "ours-fast", "ours-fast-full", "ours-fast-int8", "ct2-fp32", "ct2-export"}
        assert set(summary[label]) == engines
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
    assert first["torch"] == torch.__version__.split("+")[0] and first["threads"] == "1" and first["d_model"] == "32"
    assert first["command"].startswith("python ") and len(first["date"]) == 10 and first["device"]
    # the columns of the committed result file the docs' Results page shows, so that a rerun with --output replaces it
    with open(REPO_ROOT / "results" / "fast_decoding.csv", newline="") as file:
        assert list(first) == next(csv.reader(file))


def test_presets():
    bench = _bench()
    args = bench.parse_args(["--preset", "opus-mt"])
    assert (args.vocab_size, args.d_model, args.layers, args.ffn_dim, args.threads) == (58000, 512, 6, 2048, 2)
    args = bench.parse_args(["--preset", "opus-mt", "--threads", "1", "--layers", "2"])
    assert (args.threads, args.layers, args.d_model) == (1, 2, 512)
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
