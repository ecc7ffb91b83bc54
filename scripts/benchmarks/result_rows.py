"""The benchmarks' result files: one CSV per benchmark under results/, one row per measurement, each row carrying
what it was measured with (the command, the date, the package and dependency versions, the CPU or GPU, the
instruction set the CPU kernels ran at and whether a cap held it below the CPU's widest, the threads), so that a file
read alone says where its numbers come from. `scripts/docs/results_pages.py` renders them as the docs' Results
pages.

    from result_rows import write_rows
    write_rows("results/seq2seq_speed.csv", rows, threads=1)   # rows: dicts of the measured fields

A benchmark with `--isa LEVEL` (`add_isa_argument`) calls `run_capped(args.isa)` first: the script starts again in a
process whose libraries are all capped at that level (`hf_vit_plus.models.cpu_isa.capped_environment`: ours, torch's
ATen, MKL, oneDNN, FBGEMM, CTranslate2; they read the variables when they load), so that what it measures and the
`isa` its rows record are that level's. `isa_summary()` is the line its output prints: a capped run on a wider CPU
runs a narrower CPU's instructions, not with that CPU's caches and clocks.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import shlex
import sys
from pathlib import Path

# the levels of `hf_vit_plus.models.cpu_isa.ISA_LEVELS` (imported only when a run is capped)
ISA_CHOICES = ("generic", "avx2", "avx512")

# The columns every row ends with, after the benchmark's own.
CONTEXT_FIELDS = (
    "command",
    "date",
    "hf_vit_plus",
    "python",
    "torch",
    "transformers",
    "device",
    "isa",
    "isa_capped",
    "threads",
)


def context(threads: int | None = None) -> dict[str, str]:
    """The fields of `CONTEXT_FIELDS` for this process: the command line as run, today's date (UTC), the versions
    (`hf_vit_plus.utils.environment`), the GPU or the CPU model with its logical cores, the instruction set in use
    (`cpu_isa.isa_label`) and whether it is capped below the CPU's widest, and the threads."""
    import torch

    from hf_vit_plus.models.cpu_isa import isa_capped, isa_label, supported_isa
    from hf_vit_plus.utils.environment import cpu_description, device_description, framework_versions

    versions = framework_versions()
    device = device_description()
    if not torch.cuda.is_available():
        device = f"CPU: {cpu_description()[0]}, {os.cpu_count()} logical cores"
        if isa_capped():  # the row's isa is the cap's: the CPU's own widest goes with the CPU
            device += f", widest instruction set {isa_label(supported_isa())}"
    return {
        "command": shlex.join(["python", *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "hf_vit_plus": versions["hf_vit_plus"],
        "python": versions["Python"],
        "torch": versions["torch"],
        "transformers": versions["transformers"],
        "device": device,
        "isa": isa_label(),
        "isa_capped": str(isa_capped()).lower(),
        "threads": str(threads if threads is not None else torch.get_num_threads()),
    }


def write_rows(path: str | Path, rows: list[dict], threads: int | None = None) -> Path:
    """Write `rows` (dicts with the same keys) to the CSV `path`, each followed by this run's `context` (a row's own
    value of a context field, e.g. rows kept from an earlier run, wins); the file is replaced (written next to it,
    then moved)."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the context's columns last, in their order, whether or not the rows carry their own values (they win)
    fields = [field for field in rows[0] if field not in CONTEXT_FIELDS] + list(CONTEXT_FIELDS)
    extra = context(threads)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({**extra, **row})
    os.replace(partial, path)
    return path


def add_isa_argument(parser: argparse.ArgumentParser) -> None:
    """`--isa LEVEL`: measure with every library capped at that instruction-set level (`run_capped`)."""
    parser.add_argument(
        "--isa",
        choices=ISA_CHOICES,
        default=None,
        help="cap every library (ours, torch, MKL, oneDNN, FBGEMM, CTranslate2) at this instruction set: the script "
        "starts again in a process capped so (default: the CPU's widest, or HF_VIT_PLUS_CPU_ISA)",
    )


def run_capped(level: str | None, from_command_line: bool = True) -> None:
    """Unless this process already runs with every library capped at `level` (None: nothing to do), start this
    script again in its place (`os.execve`, the same command line) with `cpu_isa.capped_environment(level)`. A level
    the CPU cannot meet exits with its one-line error, as does a call from Python (`from_command_line=False`: there
    is no command line to start again) in a process not capped so."""
    if level is None:
        return
    from hf_vit_plus.models.cpu_isa import capped_environment

    try:
        env = capped_environment(level)
    except ValueError as error:
        sys.exit(f"{Path(sys.argv[0]).name}: error: --isa {level}: {error}")
    if all(os.environ.get(name) == value for name, value in env.items()):
        return
    if not from_command_line:
        sys.exit(
            f"error: --isa {level} from Python needs a process started with cpu_isa.capped_environment({level!r})"
        )
    sys.stdout.flush()
    # the interpreter's own options too (-W, -X): sys.orig_argv is the command line as the interpreter got it
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def isa_summary() -> str:
    """The instruction set of this run, for its printed summary: the level, its source and, when a cap holds it
    below the CPU's widest, what a capped figure is (and is not)."""
    from hf_vit_plus.models.cpu_isa import describe_isa, isa_capped

    line = f"instruction set: {describe_isa()}"
    if isa_capped():
        line += (
            " -- a capped run on a wider CPU: the narrower set's instructions, not a narrower CPU's caches, clocks "
            "and memory bandwidth"
        )
    return line
