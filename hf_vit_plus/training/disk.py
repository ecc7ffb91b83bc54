"""Disk space for a training run: how much a checkpoint and the final model take, a warning at the start when the
output disk will not hold them, and a full disk (or a file-size limit) while saving told in one line.

A save that runs out of space raises an `OSError` (ENOSPC "No space left on device", EDQUOT "Disk quota exceeded",
EFBIG "File too large" under a file-size limit) from safetensors or Python, or a `RuntimeError` from torch's zip
writer that says only "unexpected pos ..." or "file write failed". `is_out_of_space` recognises all of them (for the
zip writer's, by the free space left on the disk); the savers then remove what they had half written and raise
`OutOfSpaceError`, which the command line prints as one line (exit status 3) naming the folder, the space needed
and free, and the last complete checkpoint to resume from.
"""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

from ..errors import StepFailedError

logger = logging.getLogger(__name__)

OUT_OF_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _save_errors() -> tuple[type[BaseException], ...]:
    # torch.distributed.checkpoint (FSDP2's sharded states) gathers every rank's failure into a CheckpointException,
    # a BaseException
    try:
        from torch.distributed.checkpoint.api import CheckpointException
    except ImportError:
        return (Exception,)
    return (Exception, CheckpointException)


# What a save that ran out of space may raise (others are re-raised unless `is_out_of_space` says so).
SAVE_ERRORS = _save_errors()
# torch's zip writer (torch.save) reports a failed write without an errno
_ZIP_WRITER_FAILURES = ("unexpected pos", "file write failed", "PytorchStreamWriter failed writing")
# Below this much free space, a failed write is taken for a full disk.
_NEARLY_FULL_BYTES = 16 * 2**20
# The checkpoints the start-of-run check asks room for when --save_total_limit leaves their number open.
UNLIMITED_CHECKPOINTS_CHECKED = 3
MB = 2**20


class OutOfSpaceError(StepFailedError):
    """A save ran out of disk space (or hit a file-size limit): nothing half-written is left, the message says where
    the last complete checkpoint is. `hf-vit-plus` prints it as one line and exits with status 3; under several
    processes every process stops, and only the main one prints the line (`main_process`)."""

    exit_status = 3

    def __init__(self, message: str, main_process: bool = True):
        super().__init__(message)
        self.main_process = main_process


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def is_out_of_space(error: BaseException, folder: str | Path) -> bool:
    """Whether `error` (or what caused it) is a write that the disk of `folder` had no room for.

    Args:
        error: the exception a save raised.
        folder: where the save wrote (its disk's free space decides for torch's errno-less zip-writer errors).

    Returns:
        True for ENOSPC / EDQUOT / EFBIG, and for torch's failed writes on a disk with almost no free space.
    """
    for cause in _chain(error):
        if isinstance(cause, OSError) and cause.errno in OUT_OF_SPACE_ERRNOS:
            return True
        message = str(cause)
        if "No space left on device" in message or "File too large" in message or "Disk quota" in message:
            return True
        if isinstance(cause, RuntimeError) and any(text in message for text in _ZIP_WRITER_FAILURES):
            return free_bytes(folder) < _NEARLY_FULL_BYTES or _file_size_limit() is not None
    return False


def _file_size_limit() -> int | None:
    """The largest file this process may write (RLIMIT_FSIZE, e.g. `ulimit -f`), or None where there is no limit."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def free_bytes(folder: str | Path) -> int:
    """The free space on the disk that holds `folder` (or its nearest existing parent)."""
    path = Path(folder).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def tensor_bytes(tensors) -> int:
    """The bytes the tensors take, each tensor object once (a tied weight is one parameter). A sharded tensor
    (FSDP2's DTensor) counts its whole size, as `numel()` gives it."""
    unique = {id(tensor): tensor for tensor in tensors}
    return sum(tensor.numel() * tensor.element_size() for tensor in unique.values())


def checkpoint_bytes(model, optimizer=None) -> int:
    """About what one training checkpoint takes: the weights and the optimiser's state, whole (all processes'
    shards together), whatever the sharding.

    Args:
        model: the model.
        optimizer: the optimiser, once it has state (else Adam's two moments per trained weight are assumed).

    Returns:
        The estimate in bytes.
    """
    parameters = list(model.parameters())
    state = [t for s in getattr(optimizer, "state", {}).values() for t in s.values() if hasattr(t, "numel")]
    moments = tensor_bytes(state) if state else 2 * tensor_bytes(p for p in parameters if p.requires_grad)
    return tensor_bytes(parameters) + moments


def describe_bytes(count: int) -> str:
    return f"{count / MB:,.1f} MB" if count < 10 * 2**30 else f"{count / 2**30:,.1f} GB"


def warn_if_short_of_space(folder: str | Path, per_checkpoint: int, checkpoints: int, final_model: int) -> bool:
    """One warning when the disk of `folder` will not hold `checkpoints` checkpoints and the final model.

    Args:
        folder: the run's output folder.
        per_checkpoint: bytes one checkpoint takes (`checkpoint_bytes`).
        checkpoints: how many are kept at once (--save_total_limit, else `UNLIMITED_CHECKPOINTS_CHECKED`; 0 when
            the run saves none).
        final_model: bytes of the final model.

    Returns:
        Whether it warned.
    """
    needed = per_checkpoint * checkpoints + final_model
    free = free_bytes(folder)
    if free >= needed:
        return False
    logger.warning(
        "The disk of %s has %s free, and this run needs about %s (%d checkpoint(s) of %s and the final model of %s): "
        "it may stop when the disk is full (the last complete checkpoint is kept, resume it after making room).",
        folder, describe_bytes(free), describe_bytes(needed), checkpoints, describe_bytes(per_checkpoint),
        describe_bytes(final_model),
    )  # fmt: skip
    return True


def out_of_space_message(what: str, folder: str | Path, needed: int | None, resume_from: str | Path | None) -> str:
    """The one line an `OutOfSpaceError` says.

    Args:
        what: what could not be written ("checkpoint-20", "the final model").
        folder: where it was written.
        needed: about how many bytes it needed, if known.
        resume_from: the last complete checkpoint (None: none yet).

    Returns:
        The message.
    """
    free, limit = free_bytes(folder), _file_size_limit()
    if limit is not None and free > max(needed or 0, _NEARLY_FULL_BYTES):
        cause = f"this process may write files of at most {describe_bytes(limit)} (a file-size limit: ulimit -f)"
    else:
        cause = "no space left on the disk (" + (f"needs about {describe_bytes(needed)}, " if needed else "")
        cause += f"{describe_bytes(free)} free)"
    after = (
        f"after making room, resume from {resume_from} with --resume_from_checkpoint latest"
        if resume_from is not None
        else "no checkpoint was complete yet: make room and start again"
    )
    return f"Could not write {what} in {folder}: {cause}. Nothing half-written is left; {after}."


__all__ = [
    "OUT_OF_SPACE_ERRNOS",
    "OutOfSpaceError",
    "SAVE_ERRORS",
    "UNLIMITED_CHECKPOINTS_CHECKED",
    "checkpoint_bytes",
    "describe_bytes",
    "free_bytes",
    "is_out_of_space",
    "out_of_space_message",
    "tensor_bytes",
    "warn_if_short_of_space",
]
