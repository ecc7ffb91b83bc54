"""Start-up cost: `import hf_vit_plus` and the command line's help, against transformers on the same machine.

    python scripts/benchmarks/bench_import.py                  # 5 fresh processes per row, interleaved
    python scripts/benchmarks/bench_import.py --repeats 9 --output results/import_time.csv

Each row is a command run in a fresh Python process (`python -c ...`, or the `hf-vit-plus` launcher with its
arguments), `--repeats` times; the rows take turns (one run of each, then again), so that a machine that slows down
meanwhile slows every row alike. The table gives the median wall time of the whole process and, for our rows, the
difference to the peer row:

- `import hf_vit_plus` against `from transformers import ViTForImageClassification` (the target: at most +0.25 s;
  registering the Auto classes needs the model classes, so the peer is transformers' own model class), with
  `import transformers` (lazy, no torch) for scale;
- `hf-vit-plus --help` and every `hf-vit-plus COMMAND --help` against the target of 1.0 s; `explain pattern --help`
  is shown without a target: its choices are the registered sparse patterns, whose module imports torch.

The results go to `--output` (CSV: row, peer, median_s, min_s, max_s, repeats, python, torch, transformers, machine).
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hf_vit_plus.cli_utils import CommandParser

IMPORT_ROWS = {
    "import transformers": None,
    "from transformers import ViTForImageClassification": None,
    "import hf_vit_plus": "from transformers import ViTForImageClassification",
}
HELP_COMMANDS = [
    "", "convert", "explain", "train", "train vit", "demo", "push", "export", "export onnx", "translate", "sample",
    "env",
]  # fmt: skip
# help that lists what only torch-backed modules know (the registered sparse patterns): timed, no target
TORCH_HELP_COMMANDS = ["explain pattern"]
IMPORT_TARGET_S = 0.25  # `import hf_vit_plus` at most this much over transformers' model class
HELP_TARGET_S = 1.0


def _command(row: str) -> list[str]:
    if row.startswith("hf-vit-plus"):
        args = row.split()[1:]
        # what the installed `hf-vit-plus` script runs (the program's name defers the Auto registration)
        code = "import sys; sys.argv[0] = 'hf-vit-plus'; from hf_vit_plus.cli import main; sys.exit(main())"
        return [sys.executable, "-c", code, *args]
    return [sys.executable, "-c", row]


def _time(row: str, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(_command(row), env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(rows: list[str], repeats: int, env: dict) -> dict[str, list[float]]:
    for row in rows:  # warm the file cache once, unmeasured
        _time(row, env)
    times: dict[str, list[float]] = {row: [] for row in rows}
    for _ in range(repeats):
        for row in rows:
            times[row].append(_time(row, env))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per row")
    parser.add_argument("--output", type=Path, default=Path("results/import_time.csv"), help="CSV of the results")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    help_rows = [f"hf-vit-plus {command} --help".replace("  ", " ") for command in HELP_COMMANDS + TORCH_HELP_COMMANDS]
    rows = [*IMPORT_ROWS, *help_rows]
    times = measure(rows, args.repeats, env)
    medians = {row: statistics.median(values) for row, values in times.items()}

    torch, transformers = importlib.metadata.version("torch"), importlib.metadata.version("transformers")
    print(f"{args.repeats} fresh processes per row, medians; Python {platform.python_version()}, torch {torch}, "
          f"transformers {transformers}, {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'command':<58} {'median s':>9} {'vs peer':>9}  target")
    failed = []
    for row in rows:
        peer = IMPORT_ROWS.get(row)
        extra, target = "", ""
        if peer is not None:
            delta = medians[row] - medians[peer]
            extra, target = f"{delta:+.2f} s", f"<= +{IMPORT_TARGET_S} s"
            if delta > IMPORT_TARGET_S:
                failed.append(row)
        elif row.startswith("hf-vit-plus") and not any(f" {c} " in row for c in TORCH_HELP_COMMANDS):
            target = f"< {HELP_TARGET_S} s"
            if medians[row] >= HELP_TARGET_S:
                failed.append(row)
        print(f"{row:<58} {medians[row]:>9.2f} {extra:>9}  {target}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w", newline="") as file:
        writer = csv.writer(file)
        from hf_vit_plus.models.cpu_isa import isa_capped, isa_label

        isa = [isa_label(), str(isa_capped()).lower()]  # what every result row records
        writer.writerow(["row", "peer", "median_s", "min_s", "max_s", "repeats", "python", "torch", "transformers",
                         "machine", "isa", "isa_capped"])  # fmt: skip
        for row in rows:
            writer.writerow([row, IMPORT_ROWS.get(row) or "", f"{medians[row]:.3f}", f"{min(times[row]):.3f}",
                             f"{max(times[row]):.3f}", args.repeats, platform.python_version(), torch, transformers,
                             f"{platform.machine()}, {os.cpu_count()} CPUs", *isa])  # fmt: skip
    print(f"wrote {args.output}")
    if failed:
        print("over target: " + "; ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
