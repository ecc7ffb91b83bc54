"""The prepared GPU check, on the CPU: `scripts/benchmarks/bench_gpu.py --quick` writes every part's JSON, and
`scripts/gpu_check.sh` refuses bad settings and records a GPU whose torch cannot use it (`make gpu-check` itself runs
the gpu tests: see the README, "GPU check")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.utils import REPO_ROOT, load_script

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"


def _bench():
    return load_script("scripts/benchmarks/bench_gpu.py")


def test_quick_cpu_run_writes_every_part(tmp_path, capsys):
    bench = _bench()
    assert bench.main(["--quick", "--device", "cpu", "--out_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for part in bench.PARTS:
        data = json.loads((tmp_path / f"bench_gpu_{part}.json").read_text())
        assert data["part"] == part and data["device"] == "cpu" and data["quick"] is True
        assert data["failed"] == [] and data["rows"], part
        assert data["seconds"] > 0
        assert f"-> {tmp_path / f'bench_gpu_{part}.json'}" in out
    vit = json.loads((tmp_path / "bench_gpu_vit.json").read_text())["rows"]
    engines = {"hf_vit_plus", "timm", "transformers"}
    for case in ("fp32 logits against timm's", "inference bf16, batch 2", "training step bf16, batch 2"):
        assert {row["engine"] for row in vit if row["case"] == case} == engines, case
    # the same weights: the same function as timm's
    assert all(row["max_abs_diff"] < 1e-4 for row in vit if "max_abs_diff" in row)
    assert all(row["images_per_s"] > 0 and row["median_s"] > 0 for row in vit if "images_per_s" in row)
    sparse = json.loads((tmp_path / "bench_gpu_sparse.json").read_text())
    assert {"what": "sparse_flex forward + backward", "why": "flex_attention has no backward on the CPU"} in sparse[
        "skipped"
    ]
    timed = [row for row in sparse["rows"] if "median_s" in row]
    assert {row["engine"] for row in timed} == {"sdpa dense causal", "sparse_block", "sparse_flex"}
    assert all(row["time_vs_dense"] == 1.0 for row in timed if row["engine"] == "sdpa dense causal")
    assert all(row["max_abs_diff"] < 1e-4 for row in sparse["rows"] if "max_abs_diff" in row)  # flex = block
    decoding = json.loads((tmp_path / "bench_gpu_decoding.json").read_text())["rows"]
    assert {row["case"] for row in decoding} == {"greedy, batch 1", "greedy, batch 2", "beam 4, batch 2"}
    # every float32 engine holds Marian's weights: Marian's tokens
    assert {row["engine"] for row in decoding} >= {"marian", "ours", "ours-compiled", "ours-fast"}
    assert all(row["agreement_with_marian"] == 1.0 for row in decoding), decoding


def test_bench_refuses_bad_input(capsys):
    bench = _bench()
    for argv, message in (
        (["--parts", "vit", "graphs"], "unknown part(s) graphs"),
        (["--device", "cpu", "--repeats", "0"], "--repeats must be at least 1"),
        (["--device", "tpu"], "--device must be cuda or cpu"),
    ):
        with pytest.raises(SystemExit) as stop:
            bench.main(argv)
        assert stop.value.code == 2
        assert message in capsys.readouterr().err


def _check(tmp_path, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    full_env.update(env)
    return subprocess.run(["bash", str(SCRIPT)], env=full_env, capture_output=True, text=True, timeout=120)


def test_the_check_refuses_bad_settings(tmp_path):
    proc = _check(tmp_path, GPU_CHECK_BUDGET="ten", OUT=str(tmp_path))
    assert proc.returncode == 2
    assert "GPU_CHECK_BUDGET must be a whole number of seconds" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine this would run the whole check")
def test_a_gpu_that_torch_cannot_use_is_a_failed_step(tmp_path):
    """A machine whose nvidia-smi lists a GPU, with an environment already installed whose torch sees no CUDA device:
    the check says so, runs nothing else, writes gpu_check.json and exits 1."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\necho "GPU 0: Test GPU (UUID: GPU-0)"\n')
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for path in (fake / "nvidia-smi", venv / "bin" / "python"):
        path.chmod(0o755)
    (venv / ".stamp-test").touch()  # installed already: no pip
    out = tmp_path / "results"
    proc = _check(tmp_path, PATH=f"{fake}:{os.environ['PATH']}", GPU_VENV=str(venv), OUT=str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "CUDA GPU(s) found" in proc.stdout and "Test GPU" in proc.stdout
    assert "cannot use the GPU" in proc.stdout and "no install" in proc.stdout
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["gpu"] is True and summary["install_s"] == 0
    assert [(s["name"], s["outcome"]) for s in summary["steps"]] == [("torch sees the GPU", "failed")]
    assert "step 'torch sees the GPU': failed" in summary["skipped"]
    assert not (out / "pytest_gpu.xml").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine this would run the whole check")
@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs to run from a venv (as the GPU image's python3 is)")
def test_the_gpu_venv_sees_the_packages_of_the_venv_python_belongs_to(tmp_path):
    """The lent machine's python3 is a venv's (/opt/torch/.venv): a venv made from it with --system-site-packages
    would see the base interpreter's packages, not that venv's CUDA torch. The check's venv sees them (a .pth file),
    before its own; offline with nothing to install from, the install fails fast and the check goes on."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\necho "GPU 0: Test GPU (UUID: GPU-0)"\n')
    (fake / "nvidia-smi").chmod(0o755)
    gpu_venv, out = tmp_path / "gpu-venv", tmp_path / "results"
    proc = _check(
        tmp_path, PATH=f"{fake}:{os.environ['PATH']}", PYTHON=sys.executable, GPU_VENV=str(gpu_venv),
        WHEELHOUSE=str(tmp_path / "no-wheelhouse"), OUT=str(out), PIP_NO_INDEX="1", GPU_CHECK_INSTALL_TIMEOUT="60",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no " in proc.stdout and "installing from the package index" in proc.stdout
    found = subprocess.run(
        [str(gpu_venv / "bin" / "python"), "-c", "import sys, torch; print(sys.prefix); print(torch.__file__)"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    assert found[0] == str(gpu_venv)
    assert found[1].startswith(sys.prefix), found  # the torch of the venv the check was given, not the base's
    steps = [(s["name"], s["outcome"]) for s in json.loads((out / "gpu_check.json").read_text())["steps"]]
    assert steps == [("install", "failed"), ("torch sees the GPU", "failed")]
