"""A process of a multi-process run that stops answering: named in one line, instead of a traceback per process.

A process that stops without closing its connections (its machine lost power or network, the process was stopped)
leaves the others waiting in their next collective operation until the process group's timeout (`--ddp_timeout`,
transformers' name and meaning: 1800 s by default), where torch raises on each of them ("Timed out waiting ...", or
"Connection closed by peer" for a process that died). `peers_answer` then finds which processes are gone: each
process that is still running sends its rank to every other one over a process group of its own (gloo, made when the
run starts, so the failed group's state does not matter) and waits a short while for theirs. The processes that did
not answer are named, with their host, by the lowest rank that did, as one `PeerStoppedError` line; the others stop
silently. The run's complete checkpoints are left as they are (an interrupted save leaves only its temporary folder).
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ..errors import StepFailedError
from .checkpoints import complete_checkpoint_dirs

# Longest wait for the other processes' answers once a collective failed (and at most half of --ddp_timeout): those
# still running reach that point within about one update of each other; the ones that do not answer are named.
ANSWER_SECONDS = 10.0
# What torch says when a collective fails because a peer does not answer or is gone (gloo and NCCL): the errors are
# plain RuntimeErrors in places, so their text is what tells them apart from the run's own errors.
_COLLECTIVE_FAILURE = re.compile(
    r"timed out|timeout|connection (closed|reset|refused)|broken pipe|peer", flags=re.IGNORECASE
)


class PeerStoppedError(StepFailedError):
    """Processes of the run stopped answering: the run stopped, its checkpoints kept. One process (the lowest rank
    still running) prints the line (`main_process`); the command line exits with status 1."""

    def __init__(self, message: str, main_process: bool = True):
        super().__init__(message)
        self.main_process = main_process


def is_collective_failure(error: BaseException) -> bool:
    """Whether `error` is what torch raises when a collective operation fails for want of a peer.

    Args:
        error: an exception raised during the run.

    Returns:
        True for torch's distributed errors and for runtime errors whose text says a peer timed out or is gone.
    """
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and bool(_COLLECTIVE_FAILURE.search(str(error)))


def silent_ranks(group, rank: int, world_size: int, seconds: float) -> list[int]:
    """The ranks of `group` that do not answer within `seconds`: this process sends its rank to every other one and
    waits for theirs.

    Args:
        group: a gloo process group over every process of the run.
        rank: this process's rank.
        world_size: the number of processes.
        seconds: how long to wait for the answers, in all.

    Returns:
        The ranks that did not answer, in order.
    """
    mine = torch.tensor([rank], dtype=torch.int64)
    answers = {}
    for peer in range(world_size):
        if peer == rank:
            continue
        try:
            dist.isend(mine, dst=peer, group=group)
            buffer = torch.full((1,), -1, dtype=torch.int64)
            answers[peer] = (buffer, dist.irecv(buffer, src=peer, group=group))
        except RuntimeError:  # the connection to that peer is gone already
            answers[peer] = (None, None)
    deadline = time.monotonic() + seconds
    silent = []
    for peer, (buffer, work) in answers.items():
        answered = False
        if work is not None:
            try:
                work.wait(timeout=timedelta(seconds=max(0.1, deadline - time.monotonic())))
                answered = int(buffer.item()) == peer
            except RuntimeError:
                answered = False
        if not answered:
            silent.append(peer)
    return silent


@contextmanager
def peers_answer(accelerator, timeout_seconds: int, output_dir: str | Path) -> Iterator[None]:
    """Run the block; if a collective operation in it fails because processes stopped answering, raise one
    `PeerStoppedError` naming them (on every process still running; the lowest of their ranks prints it).

    Args:
        accelerator: the run's Accelerator (one process: the block runs as it is).
        timeout_seconds: the process group's timeout (`--ddp_timeout`), for the message.
        output_dir: the run's output folder, whose last complete checkpoint the message names.
    """
    if accelerator.num_processes < 2 or not dist.is_available() or not dist.is_initialized():
        yield
        return
    # A group of its own for the answers (gloo takes CPU tensors under any backend), and each process's host.
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_seconds))
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    try:
        yield
    except Exception as error:
        if not is_collective_failure(error):
            raise
        rank, world_size = dist.get_rank(), dist.get_world_size()
        silent = silent_ranks(group, rank, world_size, min(ANSWER_SECONDS, timeout_seconds / 2))
        if not silent:
            raise
        reporter = min(set(range(world_size)) - set(silent))
        raise PeerStoppedError(
            stopped_message(silent, hosts, world_size, timeout_seconds, output_dir), main_process=rank == reporter
        ) from error


def stopped_message(silent: list[int], hosts: list, world_size: int, timeout_seconds: int, output_dir) -> str:
    """The one line of a `PeerStoppedError`.

    Args:
        silent: the ranks that stopped answering.
        hosts: each rank's host name.
        world_size: the number of processes.
        timeout_seconds: `--ddp_timeout`.
        output_dir: the run's output folder.

    Returns:
        The line: who stopped answering, how long the others waited, the last complete checkpoint and how to resume.
    """
    named = ", ".join(f"{rank} (on {hosts[rank]})" for rank in silent)
    who = f"Process {named}" if len(silent) == 1 else f"Processes {named}"
    them = "it" if len(silent) == 1 else "them"
    complete = complete_checkpoint_dirs(output_dir)
    if complete:
        kept = f"its last complete checkpoint is {complete[-1]} (resume with --resume_from_checkpoint latest)"
    else:
        kept = "it had saved no checkpoint yet"
    return (
        f"{who} of the run's {world_size} stopped answering: the others waited --ddp_timeout {timeout_seconds} s "
        f"for {them} in a collective operation. The run stopped; {kept}."
    )


__all__ = ["PeerStoppedError", "is_collective_failure", "peers_answer", "silent_ranks", "stopped_message"]
