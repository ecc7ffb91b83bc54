"""Peak memory per process when FSDP2 fine-tunes a pretrained checkpoint, with and without cpu_ram_efficient_loading.

Saves two pretrained checkpoints once (in --workdir, default a temporary folder): a ViT-B/16 (ViTPlusConfig's
defaults, 10 classes) and a Sparse LM of the same size (hidden 768, 12 layers, 12 heads, the byte tokenizer). For
each, each number of processes (--processes) and each setting of FSDP_CPU_RAM_EFFICIENT_LOADING (as `accelerate
launch` gives it from an accelerate config's fsdp_cpu_ram_efficient_loading), it starts N CPU processes with torchrun
(gloo), each running the library's own set-up (`create_accelerator`, `prepare_run`: data, model, sharding, and with
the flag the weights sent from the main process) and a few updates (`training_step`), and reads its resident memory
(/proc/self/status) at three points: before the model is built (the libraries, the process group), after the set-up
(the peak so far), and after the updates (the peak of the run, with the gradients and Adam's moments).

The table gives, per process kind (the main process, and the largest of the others), the set-up peak minus the
memory before the model, counted in the size of the pretrained weights (the checkpoint's model.safetensors): what
loading the weights cost that process. The target of the flag (issue 46): the other processes at most 0.6x the main
process. The run's peak (after the updates) is given the same way: there each process also holds its shard of the
gradients and Adam's moments. The workers map each allocation of 1 MiB or more on its own (MALLOC_MMAP_THRESHOLD_,
as in bench_sharding.py), so that the resident memory follows the tensors alive.

    python scripts/benchmarks/bench_ram_efficient_loading.py                  # both models, 2 and 4 processes
    python scripts/benchmarks/bench_ram_efficient_loading.py --models vit --processes 2 --steps 1

The rows go to --output (CSV, default results/ram_efficient_loading.csv) and the table to the standard output.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hf_vit_plus.cli_utils import CommandParser

MODELS = ("vit", "sparse-lm")
# a Sparse LM of ViT-B/16's size (GPT-2 small's layers on the byte tokenizer's vocabulary)
SPARSE_LM = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, attention_type="strided",
    sparse_stride=32, max_position_embeddings=1024,
)  # fmt: skip
FIELDS = (
    "model", "processes", "flag", "rank", "weights_bytes", "base_rss", "set_up_peak", "run_peak", "reads", "isa",
    "isa_capped",
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vit,sparse-lm", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--processes", default="2,4", help="comma-separated numbers of CPU processes")
    parser.add_argument("--steps", type=int, default=2, help="optimizer updates per run")
    parser.add_argument("--workdir", type=Path, default=None, help="where the checkpoints are saved (default: temp)")
    parser.add_argument("--output", type=Path, default=Path("results/ram_efficient_loading.csv"), help="CSV rows")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # the model, in a torchrun process
    parser.add_argument("--checkpoint", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--report", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.model_names = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in args.model_names if name not in MODELS]
    if unknown or not args.model_names:
        parser.error(f"--models must name some of {', '.join(MODELS)}, got {args.models!r}")
    try:
        args.process_counts = [int(n) for n in args.processes.split(",")]
    except ValueError:
        parser.error(f"--processes must be comma-separated integers, got {args.processes!r}")
    if not args.process_counts or min(args.process_counts) < 2:
        parser.error(f"--processes must be 2 or more each (sharding needs several), got {args.processes!r}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    return args


def save_checkpoints(workdir: Path, models: list[str]) -> dict[str, Path]:
    """The pretrained checkpoints, made once (weights drawn at random: their values do not change the memory)."""
    import torch

    paths = {}
    for name in models:
        path = workdir / name
        paths[name] = path
        if (path / "model.safetensors").exists():
            continue
        torch.manual_seed(0)
        if name == "vit":
            from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification

            labels = {i: str(i) for i in range(10)}  # the digits, the vit family's default data
            model = ViTPlusForImageClassification(ViTPlusConfig(num_labels=10, id2label=labels))
            model.save_pretrained(path)
        else:
            from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM
            from hf_vit_plus.data.text import byte_tokenizer

            tokenizer = byte_tokenizer()
            config = SparseTransformerConfig(
                vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                **SPARSE_LM,
            )  # fmt: skip
            SparseTransformerForCausalLM(config).save_pretrained(path)
            tokenizer.save_pretrained(path)
    return paths


def _rss(field: str) -> int:
    """/proc/self/status's VmRSS (resident now) or VmHWM (its peak) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(args: argparse.Namespace) -> None:
    """One process of a torchrun launch: the library's set-up of a fine-tuning run under FSDP2, a few updates; its
    resident memory at three points goes to --report (one JSON line per process)."""
    from hf_vit_plus.training.args import family_arguments
    from hf_vit_plus.training.loop import create_accelerator, plan_the_run, prepare_run, training_step
    from hf_vit_plus.training.plan import decide_launch
    from hf_vit_plus.training.tasks import get_task

    family = get_task(args.worker)
    reads = []
    original = family.auto_model_class.__dict__["from_pretrained"]

    def counting(cls, *a, **k):  # whether this process read the checkpoint
        reads.append(1)
        return original.__func__(cls, *a, **k)

    family.auto_model_class.from_pretrained = classmethod(counting)
    extra = dict(block_size=128) if args.worker == "sparse-lm" else {}
    with tempfile.TemporaryDirectory() as output_dir:
        run_args = family_arguments(
            args.worker, output_dir=output_dir, report_to="none", write_card=False, fsdp=True, save_steps="none",
            model_name_or_path=args.checkpoint, per_device_train_batch_size=1, max_steps=args.steps,
            max_train_samples=64, max_eval_samples=4, **extra,
        )  # fmt: skip
        launch = decide_launch(run_args, family)
        accelerator = create_accelerator(run_args, launch)
        base = _rss("VmRSS")  # the libraries and the process group, no model yet
        plan, data = plan_the_run(accelerator, run_args, family, launch)
        run = prepare_run(accelerator, plan, family, data)
        set_up_peak = _rss("VmHWM")
        run.model.train()
        for _, batch in zip(range(args.steps), run.train_dataloader):
            training_step(run, batch)
        report = {
            "rank": accelerator.process_index,
            "base_rss": base,
            "set_up_peak": set_up_peak,
            "run_peak": _rss("VmHWM"),
            "reads": len(reads),
        }
        with open(args.report, "a") as handle:
            handle.write(json.dumps(report) + "\n")
        accelerator.wait_for_everyone()
        accelerator.end_training()


def launch(args: argparse.Namespace, model: str, checkpoint: Path, processes: int, flag: bool, report: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", FSDP_CPU_RAM_EFFICIENT_LOADING=str(flag).lower())
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))  # see the module's docstring
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
        __file__, "--worker", model, "--checkpoint", str(checkpoint), "--report", str(report),
        "--steps", str(args.steps),
    ]  # fmt: skip
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the {model} run on {processes} processes failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    rows = sorted((json.loads(line) for line in report.read_text().splitlines()), key=lambda r: r["rank"])
    if len(rows) != processes:
        raise SystemExit(f"the {model} run on {processes} processes reported {len(rows)} processes")
    return rows


def _added(row: dict, key: str, weights: int) -> float:
    """What the process added at `key` over its memory before the model, in the size of the weights."""
    return (row[key] - row["base_rss"]) / weights


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    header = (
        "| model | processes | cpu_ram_efficient_loading | read the weights | set-up: main | set-up: others (max) | "
        "others / main | run peak: main | run peak: others (max) | RSS peak main / others, GiB |"
    )
    print(
        f"FSDP2 fine-tuning on CPU (gloo), batch 1 per process, {args.steps} updates. Memory a process added over "
        "its own before the model was built, in the size of the pretrained weights (x W); the target: others / main "
        "<= 0.6 at set-up with the flag."
    )
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    out_rows = []
    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or Path(scratch) / "checkpoints"
        checkpoints = save_checkpoints(workdir, args.model_names)
        for model in args.model_names:
            weights = (checkpoints[model] / "model.safetensors").stat().st_size
            for processes in args.process_counts:
                for flag in (False, True):
                    report = Path(scratch) / f"{model}-{processes}-{flag}.jsonl"
                    rows = launch(args, model, checkpoints[model], processes, flag, report)
                    main_row, others = rows[0], rows[1:]

                    main_set_up = _added(main_row, "set_up_peak", weights)
                    set_up = max(_added(r, "set_up_peak", weights) for r in others)
                    main_run, run_peak = (
                        _added(main_row, "run_peak", weights),
                        max(_added(r, "run_peak", weights) for r in others),
                    )
                    print(
                        f"| {model} ({weights / 2**20:.0f} MiB) | {processes} | {'yes' if flag else 'no'} | "
                        f"{sum(r['reads'] for r in rows)} of {processes} | {main_set_up:.2f}x W | {set_up:.2f}x W | "
                        f"{set_up / main_set_up:.2f} | {main_run:.2f}x W | {run_peak:.2f}x W | "
                        f"{_gb(main_row['run_peak'])} / {_gb(max(r['run_peak'] for r in others))} |",
                        flush=True,
                    )
                    out_rows += [
                        dict(model=model, processes=processes, flag=flag, weights_bytes=weights, **row) for row in rows
                    ]
    from hf_vit_plus.models.cpu_isa import isa_capped, isa_label

    isa = dict(isa=isa_label(), isa_capped=str(isa_capped()).lower())  # what every result row records
    out_rows = [{**row, **isa} for row in out_rows]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(out_rows)
    print(f"rows written to {args.output}")


if __name__ == "__main__":
    main()
