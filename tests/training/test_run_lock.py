"""One run per output folder (hf_vit_plus.training.run_lock), with real processes: a live holder is refused (or, with
--overwrite_output_dir, taken over), a SIGKILLed run's lock is taken over, an interrupted run removes its lock, a
lock of another host is refused, a corrupt one taken over, and of runs started together exactly one gets the lock."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_vit_plus.errors import UsageError
from hf_vit_plus.training import run_lock
from hf_vit_plus.training.run_lock import LOCK_FILE_NAME, output_dir_lock, read_lock

LOGGER = "hf_vit_plus.training.run_lock"
PACKAGE_DIR = Path(run_lock.__file__).resolve().parents[1]

# The package's __init__ imports torch and transformers (seconds per process): the child processes import the very
# same run_lock module (and the errors module it imports) under empty stand-ins for the two packages above it.
STAND_INS = {"hf_vit_plus": str(PACKAGE_DIR), "hf_vit_plus.training": str(PACKAGE_DIR / "training")}
# Takes the lock on argv[1] and holds it until killed; with argv[2], says "ready" and waits for that file to appear
# first (runs started together). Prints "held PID" or "refused MESSAGE". Ctrl-C (SIGINT) raises KeyboardInterrupt
# in it even where the tests run in a background job, which a shell starts with SIGINT ignored, inherited.
HOLDER = f"""
import os, signal, sys, time, types
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)
for name, folder in {STAND_INS!r}.items():
    package = types.ModuleType(name)
    package.__path__ = [folder]
    sys.modules[name] = package
from hf_vit_plus.errors import UsageError
from hf_vit_plus.training.run_lock import output_dir_lock

if len(sys.argv) > 2:
    print("ready", flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.001)
try:
    with output_dir_lock(sys.argv[1], overwrite=False):
        print("held", os.getpid(), flush=True)
        time.sleep(600)
except UsageError as error:
    print("refused", error, flush=True)
"""


@pytest.fixture
def spawn():
    """Start a lock holder (`HOLDER`) on a folder; every one still running is killed at the end of the test."""
    processes = []

    def start(output_dir: Path, go: Path | None = None) -> subprocess.Popen:
        command = [sys.executable, "-c", HOLDER, str(output_dir), *([str(go)] if go else [])]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=60)


def read_line(process: subprocess.Popen, timeout: float = 60) -> str:
    """The process's next line of output; fails (with its stderr) when it exits or stays silent."""
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if not line:
        process.kill()
        pytest.fail(f"no line from the lock holder: {process.communicate(timeout=60)[1]}")
    return line.strip()


def start_holder(spawn, output_dir: Path) -> subprocess.Popen:
    process = spawn(output_dir)
    assert read_line(process) == f"held {process.pid}"
    return process


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def lock_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def write_lock(output_dir: Path, **fields) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / LOCK_FILE_NAME
    path.write_text(json.dumps({"host": socket.gethostname(), "started": "2025-01-01T00:00:00+00:00", **fields}))
    return path


def test_a_live_run_is_refused_naming_it(tmp_path, spawn):
    output_dir = tmp_path / "run"
    holder = start_holder(spawn, output_dir)
    lock = output_dir / LOCK_FILE_NAME
    before = lock.read_bytes()

    with pytest.raises(UsageError) as caught:
        with output_dir_lock(output_dir, overwrite=False):
            pytest.fail("entered a folder another live run holds")

    message = str(caught.value)
    assert f"another run (pid {holder.pid} on host {socket.gethostname()}, started " in message
    assert f"is training into {str(output_dir)!r}" in message
    assert "use another --output_dir, or pass --overwrite_output_dir" in message
    assert "\n" not in message
    # the holder's lock is untouched, and no temporary file is left behind
    assert lock.read_bytes() == before
    assert [p.name for p in output_dir.iterdir()] == [LOCK_FILE_NAME]
    holder_lock = read_lock(lock)
    assert holder_lock.argv[:1] == ("-c",)  # sys.argv of `python -c`
    assert holder.poll() is None


def test_overwrite_takes_a_live_run_over_and_the_old_run_leaves_the_new_lock(tmp_path, spawn, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    output_dir = tmp_path / "run"
    holder = start_holder(spawn, output_dir)

    with output_dir_lock(output_dir, overwrite=True) as lock:
        assert read_lock(lock).pid == os.getpid()
        # the first run stops now (Ctrl-C): its lock is no longer in the file, so it leaves ours
        holder.send_signal(signal.SIGINT)
        _, stderr = holder.communicate(timeout=60)
        assert "KeyboardInterrupt" in stderr
        assert "was taken over by another run" in stderr
        assert read_lock(lock).pid == os.getpid()

    assert not lock.exists()
    warnings = lock_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert f"from a live run (pid {holder.pid} on host {socket.gethostname()}" in warnings[0]
    assert "--overwrite_output_dir" in warnings[0]


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, spawn, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    output_dir = tmp_path / "run"
    holder = start_holder(spawn, output_dir)
    holder.kill()  # SIGKILL: no cleanup, the lock stays
    holder.communicate(timeout=60)
    lock = output_dir / LOCK_FILE_NAME
    assert read_lock(lock).pid == holder.pid

    with output_dir_lock(output_dir, overwrite=False) as path:
        assert path == lock
        assert read_lock(lock).pid == os.getpid()
        assert read_lock(lock).host == socket.gethostname()

    assert not lock.exists()
    warnings = lock_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert f"from pid {holder.pid} " in warnings[0]
    assert "no longer running" in warnings[0]


def test_an_interrupted_run_removes_its_lock(tmp_path, spawn):
    output_dir = tmp_path / "run"
    holder = start_holder(spawn, output_dir)
    holder.send_signal(signal.SIGINT)  # KeyboardInterrupt inside the block
    _, stderr = holder.communicate(timeout=60)
    assert holder.returncode != 0 and "KeyboardInterrupt" in stderr
    assert not output_dir.exists()  # the lock was all it held, in a folder made for it: both gone


def test_the_lock_is_removed_after_an_exception_and_kept_by_a_nested_entry(tmp_path):
    output_dir = tmp_path / "missing" / "run"
    with pytest.raises(RuntimeError, match="boom"):
        with output_dir_lock(output_dir, overwrite=False) as lock:
            with output_dir_lock(output_dir, overwrite=False):  # the holder itself, re-entering
                pass
            assert read_lock(lock).pid == os.getpid()  # the inner block left it
            raise RuntimeError("boom")
    assert not output_dir.exists()  # created for the lock, nothing else written: removed with it
    assert output_dir.parent.is_dir()  # only the run's own folder goes
    output_dir.mkdir()
    (output_dir / "model.safetensors").write_bytes(b"kept")
    with output_dir_lock(output_dir, overwrite=False):
        pass
    assert sorted(p.name for p in output_dir.iterdir()) == ["model.safetensors"]  # a folder it did not make stays


def test_a_pid_reused_by_another_process_is_stale(tmp_path, spawn, caplog):
    if not Path("/proc/self/stat").is_file():
        pytest.skip("process start times come from Linux's /proc")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    holder = start_holder(spawn, tmp_path / "live")
    fields = json.loads((tmp_path / "live" / LOCK_FILE_NAME).read_text())
    assert fields["pid"] == holder.pid and isinstance(fields["pid_start_ticks"], int)

    # the live pid with its own start: refused
    write_lock(tmp_path / "same", **fields)
    with pytest.raises(UsageError, match=f"pid {holder.pid} "):
        with output_dir_lock(tmp_path / "same", overwrite=False):
            pass
    # the live pid with another start: a dead run's pid now held by an unrelated process
    write_lock(tmp_path / "reused", **{**fields, "pid_start_ticks": fields["pid_start_ticks"] - 1})
    with output_dir_lock(tmp_path / "reused", overwrite=False) as lock:
        assert read_lock(lock).pid == os.getpid()
    warnings = lock_warnings(caplog)
    assert len(warnings) == 1 and f"from pid {holder.pid} " in warnings[0], warnings


def test_a_lock_from_another_host_is_refused_unless_overwrite(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    output_dir = tmp_path / "run"
    pid = dead_pid()  # dead here: only the host tells that it cannot be checked
    lock = write_lock(output_dir, pid=pid, host="elsewhere.invalid", argv=["hf-vit-plus", "train", "vit"])
    before = lock.read_bytes()

    with pytest.raises(UsageError) as caught:
        with output_dir_lock(output_dir, overwrite=False):
            pytest.fail("entered a folder a run on another host holds")
    message = str(caught.value)
    assert f"another run (pid {pid} on host elsewhere.invalid, started 2025-01-01T00:00:00+00:00)" in message
    assert f"cannot be checked from {socket.gethostname()}" in message
    assert "--overwrite_output_dir" in message and str(output_dir) in message
    assert lock.read_bytes() == before
    assert lock_warnings(caplog) == []

    with output_dir_lock(output_dir, overwrite=True):
        assert read_lock(lock).pid == os.getpid()
    assert not lock.exists()
    warnings = lock_warnings(caplog)
    assert len(warnings) == 1 and "elsewhere.invalid" in warnings[0], warnings


@pytest.mark.parametrize(
    "content",
    [b"", b'{"pid": 12', b"\xff\xfe not text", b"[1, 2]", b'{"pid": true, "host": "h"}', b'{"pid": 0, "host": "h"}'],
    ids=["empty", "truncated", "binary", "not-an-object", "bool-pid", "pid-0"],
)
def test_a_corrupt_lock_is_taken_over(tmp_path, caplog, content):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    lock = tmp_path / LOCK_FILE_NAME
    lock.write_bytes(content)
    assert read_lock(lock) is None

    with output_dir_lock(tmp_path, overwrite=False):
        assert read_lock(lock).pid == os.getpid()

    assert not lock.exists()
    warnings = lock_warnings(caplog)
    assert len(warnings) == 1 and "unreadable or not a lock" in warnings[0], warnings


def test_non_main_processes_neither_create_nor_check_the_lock(tmp_path, spawn, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    missing = tmp_path / "missing"
    with output_dir_lock(missing, overwrite=False, is_main_process=False) as lock:
        assert lock is None
    assert not missing.exists()

    # a live holder is not refused, a corrupt lock not taken over: both stay as they are
    output_dir = tmp_path / "held"
    holder = start_holder(spawn, output_dir)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / LOCK_FILE_NAME).write_bytes(b"{")
    for folder in (output_dir, corrupt):
        before = (folder / LOCK_FILE_NAME).read_bytes()
        for overwrite in (False, True):
            with output_dir_lock(folder, overwrite=overwrite, is_main_process=False):
                assert (folder / LOCK_FILE_NAME).read_bytes() == before
        assert (folder / LOCK_FILE_NAME).read_bytes() == before
    assert read_lock(output_dir / LOCK_FILE_NAME).pid == holder.pid
    assert lock_warnings(caplog) == []


@pytest.mark.parametrize("stale", [False, True], ids=["free", "stale-lock"])
def test_of_runs_started_together_exactly_one_holds_the_lock(tmp_path, spawn, stale):
    output_dir = tmp_path / "run"
    if stale:  # all of them find a dead run's lock and try to take it over at once
        write_lock(output_dir, pid=dead_pid())
    go = tmp_path / "go"
    runs = [spawn(output_dir, go) for _ in range(6)]
    for run in runs:
        assert read_line(run) == "ready"
    go.touch()
    lines = [read_line(run) for run in runs]

    held = [run for run, line in zip(runs, lines) if line == f"held {run.pid}"]
    assert len(held) == 1, lines
    refused = [line for line in lines if line.startswith("refused ")]
    assert len(refused) == len(runs) - 1, lines
    assert all(f"another run (pid {held[0].pid} " in line for line in refused), lines
    assert read_lock(output_dir / LOCK_FILE_NAME).pid == held[0].pid
    time.sleep(0.1)  # the refused runs have exited: nothing of theirs is left in the folder
    assert [p.name for p in output_dir.iterdir()] == [LOCK_FILE_NAME]
