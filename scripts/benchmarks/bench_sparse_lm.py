"""Sparse against dense attention on real text: the Sparse Transformer's enwik8 comparison, scaled down.

Trains one byte-level language model per attention type (strided, fixed, dense), all of the same size, for the same
number of steps on the same batches of the Python standard library's sources, with a context of at least 2,048
bytes, then prints a table of held-out bits per byte and time per training step, and the ratio of each pattern's
step time to dense attention's. `--output FILE.csv` writes the table's rows with the run's context
(scripts/benchmarks/result_rows.py), for the docs' Results page.

    python scripts/benchmarks/bench_sparse_lm.py              # defaults: context 2048, 600 steps (minutes on 1 core)
    python scripts/benchmarks/bench_sparse_lm.py --output results/sparse_lm.csv
    python scripts/benchmarks/bench_sparse_lm.py --steps 2000 --layers 6 --hidden_size 256 --context 4096

Sparse layers run the exact block-sparse CPU kernel ("sparse_block") in training, dense layers run SDPA with the
causal flag. The time per step is the median over the steps after the first few; run it on an otherwise idle
machine (`--threads` fixes the torch threads) and compare the ratios of one run, not absolute seconds. A few hundred
steps are far from convergence (the paper trained for days): the bits/byte compare the patterns early in training.

This is a timing experiment with its own minimal loop (random windows, one-cycle schedule, nothing else in the
step), not a training entry point: `hf-vit-plus train sparse-lm` trains and saves a model.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM
from hf_vit_plus.cli_utils import CommandParser
from hf_vit_plus.data.text import (
    BYTE_VOCAB_SIZE,
    load_stdlib_text,
    random_windows,
    sequential_windows,
    unigram_entropy_bits,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patterns", default="strided,fixed,dense", help="comma-separated attention types")
    parser.add_argument("--context", type=int, default=2048, help="bytes per training sequence")
    parser.add_argument("--steps", type=int, default=600, help="training steps per model")
    parser.add_argument("--batch_size", type=int, default=1, help="sequences per step")
    parser.add_argument("--hidden_size", type=int, default=128, help="model width")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--stride", type=int, default=64, help="l; the paper takes it close to sqrt(context)")
    parser.add_argument("--summary_size", type=int, default=16, help="c of the fixed pattern (the paper: l/4)")
    parser.add_argument(
        "--mode", default="merged", choices=["merged", "interleaved", "heads"], help="how layers use the pattern"
    )
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate of the one-cycle schedule")
    parser.add_argument("--train_bytes", type=int, default=4_000_000, help="bytes of training text")
    parser.add_argument("--heldout_bytes", type=int, default=200_000, help="bytes of held-out text")
    parser.add_argument("--eval_windows", type=int, default=24, help="held-out windows of --context bytes")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights and the batches")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--output", type=Path, default=None, help="write the table's rows to this CSV (results/)")
    for name in ("batch_size", "hidden_size", "summary_size", "train_bytes", "heldout_bytes", "eval_windows"):
        # the dashed spellings of version 0.1.0, accepted and hidden
        parser.add_argument(
            f"--{name.replace('_', '-')}", dest=name, type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    args = parser.parse_args(argv)
    if args.context < 2048:
        parser.error(f"--context must be at least 2048 bytes for this comparison, got {args.context}.")
    return args


def build_model(args: argparse.Namespace, attention_type: str) -> SparseTransformerForCausalLM:
    config = SparseTransformerConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden_size,
        max_position_embeddings=args.context,
        attention_type=attention_type,
        sparse_stride=args.stride,
        sparse_summary_size=args.summary_size,
        sparse_pattern_mode=args.mode,
    )
    return SparseTransformerForCausalLM(config)


def train_one(args, accelerator: Accelerator, attention_type: str, text: dict) -> dict:
    set_seed(args.seed)  # same initial weights (same shapes) and same batches for every attention type
    model = build_model(args, attention_type)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(args.seed)
    step_times, losses = [], []
    model.train()
    for _ in range(args.steps):
        batch = random_windows(text["train"], args.context, args.batch_size, generator).to(accelerator.device)
        start = time.perf_counter()
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        step_times.append(time.perf_counter() - start)
        losses.append(loss.item() / math.log(2))

    model.eval()
    windows = sequential_windows(text["heldout"], args.context, max_windows=args.eval_windows)
    total_bits, total_tokens = 0.0, 0
    with torch.no_grad():
        for window in windows.split(args.batch_size):
            window = window.to(accelerator.device)
            tokens = window.numel() - window.shape[0]  # the first byte of each window has no target
            total_bits += model(window, labels=window).loss.item() / math.log(2) * tokens
            total_tokens += tokens
    settled = step_times[min(3, len(step_times) - 1) :]
    return {
        "attention": attention_type,
        "params": sum(p.numel() for p in accelerator.unwrap_model(model).parameters()),
        "train_bpb": statistics.mean(losses[-10:]),
        "heldout_bpb": total_bits / total_tokens,
        "step_s": statistics.median(settled),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    accelerator = Accelerator()
    set_seed(args.seed)
    with accelerator.main_process_first():
        text = load_stdlib_text(max_train_bytes=args.train_bytes, max_heldout_bytes=args.heldout_bytes)
    accelerator.print(
        f"standard-library text: {len(text['train']):,} train / {len(text['heldout']):,} held-out bytes; held-out "
        f"unigram entropy {unigram_entropy_bits(text['heldout']):.3f} bits/byte"
    )
    results = []
    for attention_type in args.patterns.split(","):
        start = time.perf_counter()
        result = train_one(args, accelerator, attention_type.strip(), text)
        result["seconds"] = time.perf_counter() - start
        accelerator.print(f"{attention_type}: done in {result['seconds']:.0f} s")
        results.append(result)

    dense = next((r for r in results if r["attention"] == "dense"), None)
    accelerator.print(
        f"\ncontext {args.context}, {args.layers} layers x {args.hidden_size} wide, {args.heads} heads, stride "
        f"{args.stride}, c {args.summary_size}, mode {args.mode}, {args.steps} steps of {args.batch_size} sequences, "
        f"{torch.get_num_threads()} threads, device {accelerator.device}\n"
    )
    header = "| attention | params | train bits/byte (last 10) | held-out bits/byte | s/step | speed vs dense |"
    accelerator.print(header)
    accelerator.print("|---|---|---|---|---|---|")
    for r in results:
        speed = f"{dense['step_s'] / r['step_s']:.2f}x" if dense else "-"
        accelerator.print(
            f"| {r['attention']} | {r['params']:,} | {r['train_bpb']:.3f} | {r['heldout_bpb']:.3f} | "
            f"{r['step_s']:.3f} | {speed} |"
        )
    if args.output is not None and accelerator.is_main_process:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from result_rows import write_rows

        unigram = unigram_entropy_bits(text["heldout"])
        rows = [
            {
                "attention": r["attention"], "held_out_bits_per_byte": f"{r['heldout_bpb']:.4f}",
                "s_per_step": f"{r['step_s']:.4f}",
                "speed_vs_dense": f"{dense['step_s'] / r['step_s']:.3f}" if dense else "",
                "layers": args.layers, "hidden_size": args.hidden_size, "heads": args.heads, "steps": args.steps,
                "context": args.context, "stride": args.stride, "summary_size": args.summary_size,
                "pattern_mode": args.mode, "unigram_bits_per_byte": f"{unigram:.4f}",
                "minutes_per_model": f"{r['seconds'] / 60:.2f}", "params": r["params"],
                "train_bits_per_byte": f"{r['train_bpb']:.4f}", "batch_size": args.batch_size,
            }
            for r in results
        ]  # fmt: skip
        accelerator.print(f"wrote {write_rows(args.output, rows, threads=torch.get_num_threads())}")
    return results


if __name__ == "__main__":
    main()
