"""DeepSpeed ZeRO-2 and ZeRO-3 on CPU processes through Accelerate, against DDP (docs/guides/sharding.md).

Accelerate's CPU runs use `Accelerator(cpu=True)`, which sets up plain DDP (`MULTI_CPU`) and drops a DeepSpeed
request, and without it each process trains alone (`num_processes` 1). This script checks, outside the library's
loop, the one way found to run ZeRO on CPU processes, which `hf-vit-plus train` now takes (`training/sharding.py`,
tests/training/test_training_deepspeed.py):
`Accelerator(deepspeed_plugin=..., kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])` without `cpu=True`,
with DeepSpeed's CPU accelerator. It trains the sparse-lm family's model (tied embeddings) for a few updates on 2
processes under DDP, ZeRO-2 and ZeRO-3, on the same batches, and prints each run's distributed type, the share of
the parameters that each process holds, whether the tie survived, and the largest relative gap to DDP's losses.

    pip install --target /tmp/ds --no-deps deepspeed hjson py-cpuinfo ninja msgpack einops
    PYTHONPATH=/tmp/ds python scripts/benchmarks/check_deepspeed_cpu.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hf_vit_plus.cli_utils import CommandParser

MODES = ("ddp", "zero2", "zero3")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="updates per run")
    parser.add_argument("--worker", choices=MODES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--report", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if importlib.util.find_spec("deepspeed") is None:
        parser.error("deepspeed is not installed (see the usage above: a --target folder on PYTHONPATH is enough)")
    return args


def worker(args: argparse.Namespace) -> None:
    import torch
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import InitProcessGroupKwargs

    from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM

    if args.worker == "ddp":
        accelerator = Accelerator(cpu=True)
    else:
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        plugin = DeepSpeedPlugin(zero_stage=int(args.worker[-1]), gradient_accumulation_steps=1, gradient_clipping=0.0)
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 4
        accelerator = Accelerator(deepspeed_plugin=plugin, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    torch.manual_seed(0)
    config = SparseTransformerConfig(
        vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        sparse_stride=8, sparse_summary_size=2, max_position_embeddings=64,
    )  # fmt: skip
    model = SparseTransformerForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for step in range(args.steps):
        ids = torch.randint(
            0, 300, (4, 32), generator=torch.Generator().manual_seed(1000 * step + accelerator.process_index)
        )
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    inner = model.module if hasattr(model, "module") else model
    local = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in inner.parameters())
    report = {
        "mode": args.worker, "rank": accelerator.process_index, "processes": accelerator.num_processes,
        "type": accelerator.distributed_type.value, "losses": losses, "share": local / total,
        "tied": inner.lm_head.weight is inner.model.embeddings.embed_tokens.weight,
    }  # fmt: skip
    with open(args.report, "a") as handle:
        handle.write(json.dumps(report) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    env.update(OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as scratch:
        runs = {}
        for mode in MODES:
            report = Path(scratch) / f"{mode}.jsonl"
            command = [
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
                "--worker", mode, "--report", str(report), "--steps", str(args.steps),
            ]  # fmt: skip
            proc = subprocess.run(command, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"the {mode} run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
            runs[mode] = {row["rank"]: row for row in map(json.loads, report.read_text().splitlines())}
    header = "| run | distributed type | processes | parameters held per process | tie kept | max loss gap to DDP"
    print(f"{header}, {args.steps} updates |")
    print("|---|---|---|---|---|---|")
    for mode, rows in runs.items():
        gap = max(
            abs(a - b) / abs(b)
            for rank, row in rows.items()
            for a, b in zip(row["losses"], runs["ddp"][rank]["losses"])
        )
        first = rows[0]
        print(
            f"| {mode} | {first['type']} | {first['processes']} | {first['share']:.1%} | {first['tied']} | {gap:.1e} |"
        )


if __name__ == "__main__":
    main()
