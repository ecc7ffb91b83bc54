"""The benchmarks' result files: one CSV per benchmark under results/, one row per measurement, each row carrying
what it was measured with (the command, the date, the package and dependency versions, the CPU or GPU, the threads),
so that a file read alone says where its numbers come from. `scripts/docs/results_pages.py` renders them as the
docs' Results pages.

    from result_rows import write_rows
    write_rows("results/seq2seq_speed.csv", rows, threads=1)   # rows: dicts of the measured fields
"""

from __future__ import annotations

import csv
import datetime
import os
import shlex
import sys
from pathlib import Path

# The columns every row ends with, after the benchmark's own.
CONTEXT_FIELDS = ("command", "date", "hf_vit_plus", "python", "torch", "transformers", "device", "threads")


def context(threads: int | None = None) -> dict[str, str]:
    """The fields of `CONTEXT_FIELDS` for this process: the command line as run, today's date (UTC), the versions
    (`hf_vit_plus.utils.environment`), the GPU or the CPU model with its logical cores, and the threads."""
    import torch

    from hf_vit_plus.utils.environment import cpu_description, device_description, framework_versions

    versions = framework_versions()
    device = device_description()
    if not torch.cuda.is_available():
        device = f"CPU: {cpu_description()[0]}, {os.cpu_count()} logical cores"
    return {
        "command": shlex.join(["python", *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "hf_vit_plus": versions["hf_vit_plus"],
        "python": versions["Python"],
        "torch": versions["torch"],
        "transformers": versions["transformers"],
        "device": device,
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
