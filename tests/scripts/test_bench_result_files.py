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


def test_bench_sparse_lm_writes_its_rows(tmp_path):
    _run("bench_sparse_lm.py", "--patterns", "strided,dense", "--steps", "4", "--layers", "1", "--hidden_size", "16",
         "--heads", "2", "--train_bytes", "60000", "--heldout_bytes", "10000", "--eval_windows", "1", "--threads", "1",
         "--output", str(tmp_path / "lm.csv"), cwd=tmp_path)  # fmt: skip
    rows = _rows(tmp_path / "lm.csv")
    assert [row["attention"] for row in rows] == ["strided", "dense"]
    for row in rows:
        assert 0 < float(row["heldout_bpb"]) < 9 and float(row["step_s"]) > 0 and row["context"] == "2048"
    assert float(rows[1]["speed_vs_dense"]) == 1.0
    _context_is_this_run(rows[0], "bench_sparse_lm.py")


def test_bench_sharding_writes_its_rows(tmp_path):
    overrides = "num_hidden_layers=1,hidden_size=32,num_attention_heads=2,intermediate_size=64,patch_size=8"
    _run("bench_sharding.py", "--processes", "2", "--steps", "1", "--image_size", "32", "--config_overrides",
         overrides, "--output", str(tmp_path / "sharding.csv"), cwd=tmp_path)  # fmt: skip
    rows = _rows(tmp_path / "sharding.csv")
    assert [(row["processes"], row["run"]) for row in rows] == [("2", "DDP"), ("2", "FSDP2")]
    ddp, fsdp = rows
    assert float(ddp["state_vs_ddp"]) == 1.0
    # FSDP2 on 2 processes holds about half the parameters, gradients and Adam state of DDP in each process
    assert int(fsdp["state_bytes"]) < 0.7 * int(ddp["state_bytes"])
    parts = ("parameters_bytes", "gradients_bytes", "optimizer_bytes")
    assert int(ddp["state_bytes"]) == sum(int(ddp[key]) for key in parts)
    _context_is_this_run(ddp, "bench_sharding.py")
