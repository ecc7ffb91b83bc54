"""One training run per output folder: the run's main process holds a lock file, `OUTPUT_DIR/.hf_vit_plus-run.lock`,
from before it reads or writes the folder until its last file is written.

Why: two runs training into one folder interleave their training states in one `checkpoints/` folder (each one's
--save_total_limit prunes the other's, `--resume_from_checkpoint latest` picks up either) and both save a final
model there: the last writer's model wins, next to a card, metrics and logs of the two mixed. `output_dir_lock`
refuses the second run with a `UsageError` naming the first (pid, host, start time) and the ways out.

Only the main process takes the lock (`is_main_process=False` does nothing, not even a check): the processes of one
distributed run share the folder by design, and every one of them checking would find the main's lock (on a shared
filesystem, as the lock of another host) and refuse.

The lock file is JSON:

    {"pid": 1234, "host": "node-1", "started": "2025-06-01T12:00:00+02:00", "argv": ["hf-vit-plus", "train", ...],
     "pid_start_ticks": 5531234}

`pid_start_ticks` (Linux only, else absent) is the process's start in clock ticks after boot (/proc/PID/stat): a live
process under that pid with another start is an unrelated process that got the pid of a dead run. The file is written
under a temporary name, then linked to its own name, which fails when that name exists: no run sees a half-written
lock, and of two runs started together exactly one gets it. Checking a lock and taking it over happen under a
`flock` of the folder, held for milliseconds, so that of two runs finding the same stale lock one takes it and the
other then finds the first one's. A lock is taken over, with one warning, when

- its process is gone (killed by SIGKILL or the OOM killer, the machine crashed): same host, pid not alive;
- it cannot be read as a lock (empty, truncated, not JSON);
- `overwrite=True` (--overwrite_output_dir) and it belongs to a live run on the local host, or to a run on another
  host, whose process cannot be checked from here (without `overwrite`, such a lock is refused like a live one).

On exit (normal, an exception, KeyboardInterrupt) the lock is removed if it is still this run's: a run whose lock
was taken over leaves the new holder's alone.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..errors import UsageError

logger = logging.getLogger(__name__)

LOCK_FILE_NAME = ".hf_vit_plus-run.lock"
# Temporary files are named ".tmp-*", which the Hub push already leaves out (hub.push.RUN_IGNORE_PATTERNS).
_TMP_PREFIX = ".tmp-hf_vit_plus-run-lock-"
# Each try ends with another run having changed the lock between our read and our move: a few runs started at the
# same moment onto a stale lock settle within as many tries.
_MAX_TRIES = 20
# How long a run waits for another one's check of the lock (milliseconds of work) before going on without the guard.
_GUARD_WAIT_S = 10.0
_WAY_OUT = "wait for it, use another --output_dir, or pass --overwrite_output_dir to take the folder over"

# The locks this process holds (resolved path -> content written): a nested entry for the same folder by the run
# holding it re-enters instead of refusing itself.
_held: dict[str, bytes] = {}


@dataclass(frozen=True)
class LockHolder:
    """The run a lock file names."""

    pid: int
    host: str
    started: str
    argv: tuple[str, ...] = ()
    pid_start_ticks: int | None = None

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started}"


@contextmanager
def output_dir_lock(
    output_dir: str | os.PathLike, *, overwrite: bool, is_main_process: bool = True
) -> Iterator[Path | None]:
    """Hold `output_dir/.hf_vit_plus-run.lock` for the duration of the block, so no other run trains into the folder.

    Args:
        output_dir: The run's output folder; created if missing (by the main process).
        overwrite: Take the folder over from a live run on the local host or a run on another host, with a warning,
            instead of refusing (--overwrite_output_dir). Stale and unreadable locks are taken over either way.
        is_main_process: Whether this is the run's main process (`accelerator.is_main_process`); other processes
            neither take nor check the lock.

    Returns:
        A context manager yielding the lock file's path on the main process, None on the others.

    Raises:
        UsageError: Another live run on the local host, or a run on another host, holds the lock and `overwrite` is
            False.
    """
    if not is_main_process:
        yield None
        return
    folder = Path(output_dir).expanduser()
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE_NAME
    key = str(path.resolve())
    if key in _held:  # re-entered by the run that holds it: the outer block removes it
        yield path
        return
    with _guard(folder):
        content = _acquire(path, overwrite)
    _held[key] = content
    try:
        yield path
    finally:
        del _held[key]
        with _guard(folder):
            _release(path, content)
        if created and not any(folder.iterdir()):  # a run stopped before writing anything leaves no folder
            folder.rmdir()


def read_lock(path: str | os.PathLike) -> LockHolder | None:
    """The run a lock file names.

    Args:
        path: The lock file.

    Returns:
        Its holder, or None when the file is not a lock (unreadable, not JSON, fields missing or of another type).

    Raises:
        FileNotFoundError: There is no lock file.
    """
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError:
        return None
    return _parse(raw)


@contextmanager
def _guard(folder: Path) -> Iterator[None]:
    """An exclusive `flock` of `folder` for the block: the runs checking and taking over one lock take turns.

    Without it (Windows, a filesystem without flock, a guard held past `_GUARD_WAIT_S`) the lock still works, as
    the creation is atomic and a takeover moves the old lock aside and compares it first; only runs that take over
    the same stale lock at the same moment could then both think they hold it."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + _GUARD_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    logger.debug(f"{str(folder)!r} stayed flocked for {_GUARD_WAIT_S:.0f} s: going on unguarded.")
                    break
                time.sleep(0.01)
            except OSError:  # flock not supported here (some network filesystems)
                break
        yield
    finally:
        os.close(fd)  # releases the flock


def _acquire(path: Path, overwrite: bool) -> bytes:
    """Create the lock file, taking a stale one (or, with `overwrite`, anyone's) over; return what was written."""
    mine = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
        "argv": list(sys.argv),
    }
    ticks = _start_ticks(os.getpid())
    if ticks is not None:
        mine["pid_start_ticks"] = ticks
    content = (json.dumps(mine, indent=2) + "\n").encode()
    takeover = None  # the warning for a lock moved aside, logged once ours is in place
    for _ in range(_MAX_TRIES):
        if _create(path, content):
            if takeover:
                logger.warning(takeover)
            return content
        try:
            found = path.read_bytes()
        except FileNotFoundError:  # released between our try and the read: try again
            continue
        except OSError:
            found = None
        reason = _takeover_reason(path, found, overwrite)  # raises when refused
        if _remove_if_unchanged(path, found):
            takeover = reason
    raise UsageError(
        f"Cannot take the run lock {str(path)!r}: other runs keep taking it over. Start one run per --output_dir."
    )


def _takeover_reason(path: Path, found: bytes | None, overwrite: bool) -> str:
    """The one-line warning for taking over the lock whose content is `found`; a `UsageError` when it is refused."""
    folder = str(path.parent)
    holder = _parse(found) if found is not None else None
    if holder is None:
        return (
            f"Taking over the run lock {str(path)!r}: it is unreadable or not a lock (a run stopped while writing "
            "it, or another program wrote it)."
        )
    here = socket.gethostname()
    if holder.host != here:
        if overwrite:
            return (
                f"Taking over {folder!r} from another run ({holder.describe()}) as --overwrite_output_dir asks; its "
                f"process, on another host, cannot be checked from {here}: stop it if it still runs."
            )
        raise UsageError(
            f"another run ({holder.describe()}) may be training into {folder!r}; it runs on another host, so "
            f"whether it is still alive cannot be checked from {here}: {_WAY_OUT}."
        )
    if holder.pid != os.getpid() and _alive(holder):
        if overwrite:
            return (
                f"Taking over {folder!r} from a live run ({holder.describe()}) as --overwrite_output_dir asks: "
                "both now write into it, stop the other one."
            )
        raise UsageError(f"another run ({holder.describe()}) is training into {folder!r}: {_WAY_OUT}.")
    # Our own pid, not in `_held`: an earlier process that had this pid (pid namespaces hand out the same small
    # pids to each container) or a lock of this process that could not be removed; stale either way.
    return (
        f"Taking over the run lock of {folder!r} from pid {holder.pid} (started {holder.started}), which is no "
        "longer running: that run stopped without finishing (killed or crashed)."
    )


def _parse(raw: bytes) -> LockHolder | None:
    try:
        data = json.loads(raw)
    except ValueError:  # not UTF-8 or not JSON
        return None
    if not isinstance(data, dict):
        return None
    pid, host, started = data.get("pid"), data.get("host"), data.get("started", "at an unknown time")
    argv, ticks = data.get("argv", []), data.get("pid_start_ticks")
    # bool is an int; pid 0 or below would make os.kill signal a process group
    if type(pid) is not int or pid <= 0 or not isinstance(host, str) or not isinstance(started, str):
        return None
    if not isinstance(argv, list) or (ticks is not None and type(ticks) is not int):
        return None
    return LockHolder(pid, host, started, tuple(str(a) for a in argv), ticks)


def _alive(holder: LockHolder) -> bool:
    """Whether the lock's process (on the local host) still runs: the pid exists, is not a zombie, and, where Linux
    tells, started when the lock's process did (else the pid was reused by an unrelated process)."""
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process there: assume alive, refusing is safe
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        pass
    except OSError:  # cannot tell: refusing is the safe side, --overwrite_output_dir the way out
        return True
    stat = _stat_fields(holder.pid)
    if stat is None:  # no /proc (macOS) or gone meanwhile: the signal said it exists
        return True
    if stat[0] == "Z":  # killed, not yet reaped by its parent
        return False
    if holder.pid_start_ticks is not None and _field_int(stat, 19) not in (None, holder.pid_start_ticks):
        return False
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first: field 3), or None where not readable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces and parentheses.
    return stat.rpartition(")")[2].split() or None


def _field_int(fields: list[str], index: int) -> int | None:
    try:
        return int(fields[index])
    except (IndexError, ValueError):
        return None


def _start_ticks(pid: int) -> int | None:
    """The start of process `pid` in clock ticks after boot (/proc/PID/stat field 22), or None off Linux."""
    fields = _stat_fields(pid)
    return _field_int(fields, 19) if fields else None


def _create(path: Path, content: bytes) -> bool:
    """Create `path` holding `content` unless it exists; whether it was created.

    The content goes to a temporary file first, then a hard link gives it its name: the link fails if the name
    exists, and a reader never sees the file half-written. Where the filesystem has no hard links, an exclusive
    create (O_EXCL) of the file itself."""
    tmp = path.with_name(f"{_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "xb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())  # after a crash, the lock names its run instead of being empty
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some FUSE, SMB or FAT filesystems)
            pass
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _remove_if_unchanged(path: Path, expected: bytes | None) -> bool:
    """Remove the lock file if it still holds `expected` (None: unreadable); whether it was removed.

    The file is first moved aside under a name of our own, then compared, so that a lock another run wrote after
    `expected` was read is never deleted: it is put back under its name instead."""
    aside = path.with_name(f"{_TMP_PREFIX}old-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        try:
            moved = aside.read_bytes()
        except OSError:
            moved = None
        if moved == expected:
            return True
        # Another run's lock: back under its name, unless a third run took the name meanwhile.
        if moved is not None:
            _create(path, moved)
        return False
    finally:
        aside.unlink(missing_ok=True)


def _release(path: Path, content: bytes) -> None:
    """Remove the lock if it is still ours. Runs in a `finally`: an error is logged, not raised over the run's."""
    try:
        if not _remove_if_unchanged(path, content):
            try:
                holder = read_lock(path)
            except FileNotFoundError:
                holder = None
            if holder is not None:
                logger.warning(
                    f"The run lock of {str(path.parent)!r} was taken over by another run ({holder.describe()}) "
                    "during this one: left to it."
                )
    except OSError as error:
        logger.warning(f"Could not remove the run lock {str(path)!r} ({error}): remove it by hand.")


__all__ = ["LOCK_FILE_NAME", "LockHolder", "output_dir_lock", "read_lock"]
