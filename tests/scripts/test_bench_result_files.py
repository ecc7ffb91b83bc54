"""The benchmarks write their rows to result files (scripts/benchmarks/result_rows.py): each row carries its
measurements and the run's context. Tiny runs of bench_vit.py and bench_sparse_attention.py (speed itself is measured
on a quiet machine, not asserted here)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import torch

from tests.utils import REPO_ROOT


def _run(script: str, *argv: str, cwd) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "benchmarks" / script), *argv], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def _rows(path) -> list[dict]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _context_is_this_run(row: dict, script: str) -> None:
    assert row["torch"] == torch.__version__.split("+")[0] and row["hf_vit_plus"] and row["device"]
    assert row["command"].startswith("python ") and script in row["command"] and len(row["date"]) == 10


def test_bench_vit_writes_its_throughput_rows(tmp_path):
    _run("bench_vit.py", "--preset", "tiny-patch16-224", "--batch_sizes", "1", "2", "--precisions", "fp32",
         "--repeats", "1", "--warmup", "1", "--threads", "1", "--output", str(tmp_path / "vit.csv"), cwd=tmp_path)
    rows = _rows(tmp_path / "vit.csv")
    assert [(row["precision"], row["batch"]) for row in rows] == [("fp32", "1"), ("fp32", "2")]
    for row in rows:
        assert float(row["ours_images_per_s"]) > 0 and float(row["timm_images_per_s"]) > 0
        ratio = float(row["ours_images_per_s"]) / float(row["timm_images_per_s"])
        assert abs(float(row["vs_timm"]) - ratio) < 0.01 * ratio
        assert row["threads"] == "1"
        _context_is_this_run(row, "bench_vit.py")


def test_bench_sparse_attention_writes_its_rows(tmp_path):
    _run("bench_sparse_attention.py", "--max_n", "1024", "--repeats", "1", "--no_memory", "--no_flex",
         "--output", str(tmp_path / "sparse.csv"), cwd=tmp_path)  # fmt: skip
    rows = _rows(tmp_path / "sparse.csv")
    kernels = {row["kernel"] for row in rows}
    assert {"sdpa", "sparse_block"} <= kernels and {row["n"] for row in rows} == {"1024"}
    sdpa = next(row for row in rows if row["kernel"] == "sdpa")
    assert float(sdpa["fwd_vs_sdpa"]) == 1.0 and sdpa["peak_mb"] == ""
    _context_is_this_run(rows[0], "bench_sparse_attention.py")


def _bench_int8_quality():
    import importlib.util

    path = REPO_ROOT / "scripts" / "benchmarks" / "bench_int8_quality.py"
    spec = importlib.util.spec_from_file_location("bench_int8_quality", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
