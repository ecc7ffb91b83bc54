"""Two `hf-vit-plus train` runs on one output folder, for real: the second stops at once with one line naming the
first's pid; once the first is killed (SIGKILL leaves its lock behind), the next run takes the stale lock over with a
warning and finishes; `--overwrite_output_dir` takes the folder from a live run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.utils import COMMAND_CODE, REPO_ROOT, TINY_VIT_OVERRIDES

TRAIN = [
    sys.executable, "-c", COMMAND_CODE, "train", "vit",
    "--config_overrides", TINY_VIT_OVERRIDES, "--report_to", "none", "--max_train_samples", "64",
    "--max_eval_samples", "16", "--per_device_train_batch_size", "16", "--write_card", "false",
]  # fmt: skip


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)})
    return env


def _start_long_run(output_dir) -> subprocess.Popen:
    """A run that trains for a long time, returned once its lock is taken (the run reports what it trains)."""
    proc = subprocess.Popen(
        [*TRAIN, "--output_dir", str(output_dir), "--num_train_epochs", "1000", "--save_steps", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        if line.startswith("Training vit") or time.monotonic() > deadline:
            break
    lock = output_dir / ".hf_vit_plus-run.lock"
    assert lock.is_file(), "the running run holds no lock"
    assert json.loads(lock.read_text())["pid"] == proc.pid
    return proc


def _short_run(output_dir, *extra: str) -> subprocess.CompletedProcess:
    command = [*TRAIN, "--output_dir", str(output_dir), "--max_steps", "2", "--save_steps", "none", *extra]
    return subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=600)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_second_run_on_a_folder_stops_naming_the_first_and_a_dead_runs_lock_is_taken_over(tmp_path):
    output_dir = tmp_path / "run"
    first = _start_long_run(output_dir)
    try:
        second = _short_run(output_dir)
        assert second.returncode == 2, second.stderr[-3000:]
        errors = [line for line in second.stderr.splitlines() if ": error: " in line or "Traceback" in line]
        assert len(errors) == 1 and errors[0].startswith("hf-vit-plus train vit: error: "), second.stderr[-3000:]
        assert f"pid {first.pid}" in errors[0] and "--overwrite_output_dir" in errors[0]
        assert not (output_dir / "model.safetensors").exists()  # the second run did no work
    finally:
        first.send_signal(signal.SIGKILL)  # as the OOM killer would: the lock stays behind
        first.wait(timeout=60)
    assert json.loads((output_dir / ".hf_vit_plus-run.lock").read_text())["pid"] == first.pid
    third = _short_run(output_dir)
    assert third.returncode == 0, third.stderr[-3000:]
    assert [line for line in third.stderr.splitlines() if str(first.pid) in line and "lock" in line], third.stderr
    assert (output_dir / "model.safetensors").is_file()
    assert not (output_dir / ".hf_vit_plus-run.lock").exists()  # released at the end


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_overwrite_output_dir_takes_the_folder_from_a_live_run(tmp_path):
    output_dir = tmp_path / "run"
    first = _start_long_run(output_dir)
    try:
        taken = _short_run(output_dir, "--overwrite_output_dir")
        assert taken.returncode == 0, taken.stderr[-3000:]
        assert [line for line in taken.stderr.splitlines() if str(first.pid) in line], taken.stderr[-3000:]
        assert (output_dir / "model.safetensors").is_file()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
