"""Memory per process under DDP and under FSDP2, on CPU: what sharding saves, measured.

Starts the library's training set-up (`create_accelerator`, `sharding.prepare_model`, `accelerator.prepare`, AdamW)
on N CPU processes with torchrun (gloo), once as plain data parallelism (DDP) and once sharded (`--fsdp`), for each
N of --processes, and runs a few updates of a ViT-B/16 (86M parameters; ViTPlusConfig's defaults) on random images.
Then prints, per process (the largest over the processes), the bytes of parameters, gradients and optimizer state
that the process holds (`sharding.local_bytes`, measured after an update, before the gradients are freed) and its
peak resident memory (ru_maxrss), with FSDP2's ratio to DDP at the same number of processes.

    python scripts/benchmarks/bench_sharding.py                      # ViT-B/16, 2 and 4 processes, 3 updates
    python scripts/benchmarks/bench_sharding.py --processes 2 --image_size 64 --steps 2

The state bytes are exact (they count tensors). Resident memory also holds what both runs share: the Python and torch
libraries (about 0.9 GB per process), activations, and, under DDP, the gradient buckets (another copy of the
gradients); "RSS after set-up" is a process's resident size once the model is prepared (and, under FSDP2, split),
before the first step. glibc's malloc keeps freed blocks resident: FSDP2 allocates and frees a layer's gathered
weights and full gradients at every layer of every step, and with glibc's default (a mapping threshold that grows
to 32 MiB) those blocks stay in its arenas, and the peak RSS of FSDP2 can come out above DDP's although it holds
half the state. The workers therefore run with MALLOC_MMAP_THRESHOLD_=1 MiB (each allocation of 1 MiB or more mapped
on its own and returned when freed), so that the RSS follows the tensors alive; --malloc_default measures glibc's
default. `--output FILE.csv` writes the table's rows (MiB) with the run's context
(scripts/benchmarks/result_rows.py), for the docs' Results page.

    python scripts/benchmarks/bench_sharding.py --output results/sharding_memory.csv
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hf_vit_plus.cli_utils import CommandParser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", default="2,4", help="comma-separated numbers of CPU processes")
    parser.add_argument("--steps", type=int, default=3, help="optimizer updates per run")
    parser.add_argument("--batch_size", type=int, default=1, help="images per process and update")
    parser.add_argument("--image_size", type=int, default=224, help="image side (the parameters barely depend on it)")
    parser.add_argument("--config_overrides", default="", help="ViTPlusConfig fields, e.g. num_hidden_layers=24")
    parser.add_argument(
        "--malloc_default",
        action="store_true",
        help="leave glibc's malloc as it is (by default the workers map each allocation of 1 MiB or more on its own)",
    )
    parser.add_argument("--output", type=Path, default=None, help="write the table's rows to this CSV (results/)")
    parser.add_argument("--worker", choices=["ddp", "fsdp"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--report", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.process_counts = [int(n) for n in args.processes.split(",")]
    except ValueError:
        parser.error(f"--processes must be comma-separated integers, got {args.processes!r}")
    if not args.process_counts or min(args.process_counts) < 2:
        parser.error(f"--processes must be 2 or more each (sharding needs several), got {args.processes!r}")
    for name in ("steps", "batch_size", "image_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def _config(args: argparse.Namespace):
    from hf_vit_plus import ViTPlusConfig
    from hf_vit_plus.training.tasks.overrides import parse_overrides

    overrides = parse_overrides(args.config_overrides) if args.config_overrides else {}
    return ViTPlusConfig(image_size=args.image_size, num_labels=1000, **overrides)


def _rss(field: str) -> int:
    """/proc/self/status's VmRSS (resident now) or VmHWM (its peak) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(args: argparse.Namespace) -> None:
    """One process of a torchrun launch: the library's Accelerator (DDP, or FSDP2 with --fsdp), a ViT, AdamW, a few
    updates; this process's bytes and peak RSS go to --report (one JSON line per process)."""
    import torch

    from hf_vit_plus import ViTPlusForImageClassification
    from hf_vit_plus.training.args import family_arguments
    from hf_vit_plus.training.loop import create_accelerator
    from hf_vit_plus.training.plan import decide_launch
    from hf_vit_plus.training.sharding import local_bytes, prepare_model
    from hf_vit_plus.training.tasks import get_task

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as output_dir:
        run_args = family_arguments(
            "vit", output_dir=output_dir, report_to="none", fsdp=args.worker == "fsdp", write_card=False
        )
        accelerator = create_accelerator(run_args, decide_launch(run_args, get_task("vit")))
        model = ViTPlusForImageClassification(_config(args))
        if accelerator.is_fsdp2:
            prepare_model(accelerator, model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, optimizer = accelerator.prepare(model, optimizer)
        config = _config(args)
        set_up_rss = _rss("VmRSS")  # libraries, model (sharded or not), optimizer (no state yet)
        held = {}
        for step in range(args.steps):
            pixels = torch.randn(args.batch_size, 3, config.image_size, config.image_size)
            labels = torch.randint(0, config.num_labels, (args.batch_size,))
            loss = model(pixel_values=pixels, labels=labels).loss
            accelerator.backward(loss)
            optimizer.step()
            if step == args.steps - 1:
                held = local_bytes(model, optimizer)  # gradients still here, Adam's moments allocated
            optimizer.zero_grad(set_to_none=True)
        report = {
            "rank": accelerator.process_index,
            "world": accelerator.num_processes,
            "distributed": str(accelerator.distributed_type),
            "parameters_total": sum(p.numel() for p in model.parameters()),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # KiB on Linux
            "set_up_rss": set_up_rss,
            **held,
        }
        with open(args.report, "a") as handle:
            handle.write(json.dumps(report) + "\n")
        accelerator.wait_for_everyone()
        accelerator.end_training()


def launch(args: argparse.Namespace, mode: str, processes: int, report: Path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    if not args.malloc_default:
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))  # see the module's docstring
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
        __file__, "--worker", mode, "--report", str(report), "--steps", str(args.steps),
        "--batch_size", str(args.batch_size), "--image_size", str(args.image_size),
        "--config_overrides", args.config_overrides,
    ]  # fmt: skip
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the {mode} run on {processes} processes failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    if len(rows) != processes:
        raise SystemExit(f"the {mode} run on {processes} processes reported {len(rows)} processes")
    return rows


def _mib(n: float) -> str:
    """Bytes in MiB for the result file: whole MiB as the table prints them, three decimals below 10 MiB."""
    return f"{n / 2**20:.0f}" if n >= 10 * 2**20 else f"{n / 2**20:.3f}"


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    print(
        f"ViT (ViTPlusConfig defaults{', ' + args.config_overrides if args.config_overrides else ''}), image "
        f"{args.image_size}, batch {args.batch_size} per process, AdamW fp32, {args.steps} updates, CPU (gloo); "
        "per process: the largest over the processes, MiB"
    )
    header = (
        "| processes | run | params | grads | Adam state | params+grads+state | ratio to DDP | RSS after set-up | "
        "peak RSS | ratio |"
    )
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    table = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for processes in args.process_counts:
            ddp = None
            for mode in ("ddp", "fsdp"):
                rows = launch(args, mode, processes, Path(scratch) / f"{mode}-{processes}.jsonl")
                worst = max(rows, key=lambda r: r["parameters"] + r["gradients"] + r["optimizer"])
                state = worst["parameters"] + worst["gradients"] + worst["optimizer"]
                rss = max(r["peak_rss"] for r in rows)
                if mode == "ddp":
                    ddp = (state, rss)
                name = "DDP" if mode == "ddp" else "FSDP2"
                print(
                    f"| {processes} | {name} ({worst['parameters_total'] / 1e6:.1f}M params) | "
                    f"{_mb(worst['parameters'])} | {_mb(worst['gradients'])} | {_mb(worst['optimizer'])} | "
                    f"{_mb(state)} | {state / ddp[0]:.3f}x | {_mb(max(r['set_up_rss'] for r in rows))} | {_mb(rss)} | "
                    f"{rss / ddp[1]:.2f}x |",
                    flush=True,
                )
                table.append({
                    "processes": processes, "run": name,
                    "malloc": "glibc defaults" if args.malloc_default else "MALLOC_MMAP_THRESHOLD_=1048576",
                    "params_mib": _mib(worst["parameters"]), "grads_mib": _mib(worst["gradients"]),
                    "adam_state_mib": _mib(worst["optimizer"]), "state_mib": _mib(state),
                    "state_vs_ddp": f"{state / ddp[0]:.3f}",
                    "rss_after_setup_mib": _mib(max(r["set_up_rss"] for r in rows)), "peak_rss_mib": _mib(rss),
                    "peak_rss_vs_ddp": f"{rss / ddp[1]:.2f}",
                    "model": f"ViT ({args.config_overrides or 'ViTPlusConfig defaults'})",
                    "parameters": f"{worst['parameters_total'] / 1e6:.1f}M", "optimizer": "AdamW fp32",
                    "image_size": args.image_size, "batch_per_process": args.batch_size, "updates": args.steps,
                })  # fmt: skip
    for row in table:
        row["whole_table_minutes"] = f"{(time.perf_counter() - start) / 60:.1f}"
    if args.output is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from result_rows import write_rows

        print(f"wrote {write_rows(args.output, table, threads=1)}")


if __name__ == "__main__":
    main()
