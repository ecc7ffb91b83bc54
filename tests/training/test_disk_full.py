"""A full disk while training: one line, status 3, nothing half-written, and `--resume_from_checkpoint latest`
finishes the run once there is room. With real faults: a small tmpfs that fills (where the host lets the test
mount one: root, Linux), and a file-size limit (RLIMIT_FSIZE, `ulimit -f`) everywhere on POSIX."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.utils import REPO_ROOT, TINY_VIT_OVERRIDES

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="tmpfs and RLIMIT_FSIZE: Linux")

# The run: a tiny ViT on the digits, a checkpoint every 2 updates, 6 updates (no card: only the model folder).
TRAIN = [
    "train", "vit", "--config_overrides", TINY_VIT_OVERRIDES, "--report_to", "none", "--max_train_samples", "64",
    "--max_eval_samples", "16", "--per_device_train_batch_size", "16", "--max_steps", "6", "--save_steps", "2",
    "--write_card", "false",
]  # fmt: skip

LAUNCH = """
import resource, signal, sys
limit = int(sys.argv[1])
if limit:
    # over the limit a write fails with EFBIG instead of the process being killed by SIGXFSZ
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["hf-vit-plus", *sys.argv[2:]]  # the installed script's program name: the command registers the classes
from hf_vit_plus.cli import main
sys.exit(main())
"""


def _train(output_dir: Path, *extra: str, file_limit: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)})
    command = [sys.executable, "-c", textwrap.dedent(LAUNCH), str(file_limit), *TRAIN, "--output_dir", str(output_dir)]
    return subprocess.run([*command, *extra], capture_output=True, text=True, env=env, timeout=600)


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if ": error: " in line or "Traceback" in line]


def _leftovers(output_dir: Path) -> list[str]:
    return sorted(p.name for p in output_dir.rglob("*") if p.name.startswith(".tmp"))


def test_a_file_size_limit_stops_the_run_with_one_line_and_status_3(tmp_path):
    """Under `ulimit -f` smaller than the optimiser's state, the first checkpoint cannot be written: one line
    naming the folder and that no checkpoint is complete yet, status 3, nothing half-written left."""
    output_dir = tmp_path / "run"
    proc = _train(output_dir, file_limit=100_000)  # the tiny model's weights fit, its optimiser state does not
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = _error_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("hf-vit-plus train vit: error: Could not write checkpoint-2"), lines
    assert str(output_dir) in lines[0] and "(a file-size limit: ulimit -f)" in lines[0]
    assert "no checkpoint was complete yet" in lines[0]
    assert _leftovers(output_dir) == []


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 600 KB mounted on a fresh folder (skips where mounting is not allowed); unmounted at the end."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_disk_that_fills_stops_with_one_line_and_resume_latest_finishes(small_disk):
    """The disk holds the first checkpoint, not the second: one line (status 3) naming the folder, the space and the
    checkpoint to resume from; no half-written checkpoint. After room is made, `--resume_from_checkpoint latest`
    resumes from that checkpoint and finishes the run."""
    output_dir = small_disk / "run"
    proc = _train(output_dir)
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = _error_lines(proc)
    assert len(lines) == 1, lines
    assert lines[0].startswith("hf-vit-plus train vit: error: Could not write checkpoint-4"), lines
    assert "no space left on the disk (needs about" in lines[0] and "free)" in lines[0], lines
    assert "resume from" in lines[0] and "checkpoint-2 with --resume_from_checkpoint latest" in lines[0], lines
    assert _leftovers(output_dir) == []
    complete = sorted(p.name for p in (output_dir / "checkpoints").iterdir())
    assert complete == ["checkpoint-2"], complete

    subprocess.run(["mount", "-o", "remount,size=50m", str(small_disk)], check=True)  # room is made
    resumed = _train(output_dir, "--resume_from_checkpoint", "latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from" in resumed.stderr and "checkpoint-2 at update 2" in resumed.stderr
    assert (output_dir / "model.safetensors").is_file()
    assert json.loads((output_dir / "eval_results.json").read_text())["eval_samples"] == 16


def test_the_start_warns_when_the_disk_cannot_hold_the_checkpoints(small_disk):
    """Before the first update: one warning that the disk's free space will not hold the checkpoints kept and the
    final model (the run goes on, and stops on the full disk as above)."""
    proc = _train(small_disk / "run", "--save_total_limit", "5")
    warning = [line for line in proc.stderr.splitlines() if "this run needs about" in line]
    assert len(warning) == 1 and "5 checkpoint(s)" in warning[0], proc.stderr[-3000:]
    first_update = proc.stderr.find("%|")  # the progress bar's first line
    assert first_update == -1 or proc.stderr.find(warning[0]) < first_update
