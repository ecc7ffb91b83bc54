"""Do the defaults learn? Every family's default training run (`hf-vit-plus train FAMILY --output_dir X`, nothing else
but the seed), over seeds and torch thread counts, against its target on its built-in task:

| family | built-in task | target |
|---|---|---|
| seq2seq | numbers -> English words | held-out exact match >= 95%, in at most 10 minutes |
| vit | scikit-learn's digits | accuracy >= 95% |
| sparse-lm | Python's standard library, as bytes | bits per byte at least 25% below a unigram model's |
| image-lm | digits, pixels as tokens | bits per dim below each pixel's own histogram |

Each cell is one run of the command line in a process of its own with OMP_NUM_THREADS set (the thread count changes
the order of floating-point sums, which decided whether the old seq2seq defaults learned). Runs of one thread go two
at a time (`--parallel 2` on two cores); their minutes are then those of a shared machine. Writes a CSV (one row per
cell: the metric, the baseline, the target, the minutes, the exact command) and prints the table.

    python scripts/learning_matrix.py                                   # 4 families x seeds 42, 0 x threads 1, 2
    python scripts/learning_matrix.py --families seq2seq --seeds 42 0 1 2 3 --threads 1
    python scripts/learning_matrix.py --families seq2seq --extra="--num_train_epochs 4"   # a shortened run
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hf_vit_plus.cli_utils import CommandParser

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    metric: str  # key of eval_results.json
    baseline: str | None  # key of eval_results.json, or None (a fixed threshold)
    passes: str  # description
    max_minutes: float | None = None

    def met(self, value: float, baseline: float | None, minutes: float) -> bool:
        if self.max_minutes is not None and minutes > self.max_minutes:
            return False
        if self.metric == "eval_exact_match":
            return value >= 0.95
        if self.metric == "eval_accuracy":
            return value >= 0.95
        if self.metric == "eval_bits_per_token":
            return value <= 0.75 * baseline
        if self.metric == "eval_bits_per_dim":
            return value < baseline
        raise ValueError(self.metric)


TARGETS = {
    "seq2seq": Target("eval_exact_match", None, ">= 0.95 in <= 10 min", max_minutes=10.0),
    "vit": Target("eval_accuracy", "eval_baseline_majority_class_accuracy", ">= 0.95"),
    "sparse-lm": Target("eval_bits_per_token", "eval_baseline_unigram_bits_per_token", "<= 0.75 x unigram"),
    "image-lm": Target("eval_bits_per_dim", "eval_baseline_pixel_histogram_bits_per_dim", "< pixel histogram"),
}


@dataclass
class Cell:
    family: str
    seed: int
    threads: int
    command: list[str]
    value: float | None = None
    baseline: float | None = None
    minutes: float = 0.0
    returncode: int | None = None
    learned_warning: bool = False

    @property
    def passed(self) -> bool:
        return (
            self.returncode == 0
            and self.value is not None
            and TARGETS[self.family].met(self.value, self.baseline, self.minutes)
        )


def run_cell(cell: Cell, workdir: Path, log_dir: Path | None) -> Cell:
    output = workdir / f"{cell.family}-s{cell.seed}-t{cell.threads}"
    env = {**os.environ, "OMP_NUM_THREADS": str(cell.threads), "HF_VIT_PLUS_VERBOSITY": "warning"}
    start = time.perf_counter()
    run = subprocess.run(
        [*cell.command, "--output_dir", str(output)], env=env, capture_output=True, text=True, cwd=REPO
    )
    cell.minutes = (time.perf_counter() - start) / 60
    cell.returncode = run.returncode
    cell.learned_warning = "did not learn" in run.stderr
    if log_dir is not None:
        (log_dir / f"{output.name}.log").write_text(run.stdout + run.stderr)
    results = output / "eval_results.json"
    if results.is_file():
        values = json.loads(results.read_text())
        target = TARGETS[cell.family]
        cell.value = values.get(target.metric)
        cell.baseline = values.get(target.baseline) if target.baseline else None
    elif run.returncode != 0:
        print(run.stderr[-3000:], file=sys.stderr)
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 0])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--extra", default="", help="more flags for every run (e.g. a shortened run)")
    parser.add_argument("--parallel", type=int, default=2, help="one-thread runs at once")
    parser.add_argument("--output", type=Path, default=REPO / "results" / "learning_defaults.csv")
    parser.add_argument("--logs", type=Path, default=None, help="folder for each run's output")
    args = parser.parse_args(argv)
    executable = Path(sys.executable).with_name("hf-vit-plus")
    cells = [
        Cell(
            family,
            seed,
            threads,
            [str(executable), "train", family, "--seed", str(seed), "--save_steps", "none", *shlex.split(args.extra)],
        )  # fmt: skip
        for family in args.families
        for threads in sorted(args.threads)
        for seed in args.seeds
    ]
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="learning-matrix-") as workdir:
        single = [cell for cell in cells if cell.threads == 1]
        with ThreadPoolExecutor(max(1, args.parallel)) as pool:
            list(pool.map(lambda cell: run_cell(cell, Path(workdir), args.logs), single))
        for cell in cells:
            if cell.threads != 1:
                run_cell(cell, Path(workdir), args.logs)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w", newline="") as handle:
        writer = csv.writer(handle)
        from hf_vit_plus.models.cpu_isa import isa_capped, isa_label

        isa = [isa_label(), str(isa_capped()).lower()]  # what every result row records (the runs inherit the cap)
        writer.writerow(["family", "seed", "threads", "metric", "value", "baseline", "target", "passed", "minutes",
                         "command", "isa", "isa_capped"])  # fmt: skip
        for cell in cells:
            target = TARGETS[cell.family]
            command = f"OMP_NUM_THREADS={cell.threads} hf-vit-plus " + " ".join(cell.command[1:]) + " --output_dir X"
            writer.writerow([cell.family, cell.seed, cell.threads, target.metric, cell.value, cell.baseline,
                             target.passes, cell.passed, round(cell.minutes, 2), command, *isa])  # fmt: skip
    print("| family | seed | threads | metric | value | baseline | target | passed | minutes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cell in cells:
        target = TARGETS[cell.family]
        value = "-" if cell.value is None else f"{cell.value:.4g}"
        baseline = "-" if cell.baseline is None else f"{cell.baseline:.4g}"
        print(f"| {cell.family} | {cell.seed} | {cell.threads} | {target.metric.removeprefix('eval_')} | {value} | "
              f"{baseline} | {target.passes} | {'yes' if cell.passed else 'NO'} | {cell.minutes:.2f} |")  # fmt: skip
    print(f"written: {args.output}")
    return 0 if all(cell.passed for cell in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
