"""Depth as the Sparse Transformer paper trains it: a deep, narrow image model with the paper's initialisation
(sec. 5.2: residual branch outputs scaled by 1/sqrt(2N)) and recomputation of the attention and feed-forward
activations in the backward pass (sec. 5.4, activation checkpointing).

Two measurements, printed as tables:

1. Memory of one training step (forward + backward) with and without recomputation, each in a fresh process:
   the bytes of the tensors autograd keeps for the backward pass (`torch.autograd.graph.saved_tensors_hooks`,
   each storage once; exact and independent of the allocator) and the process's peak resident memory (ru_maxrss;
   includes the interpreter, the weights and the optimiser, so it shows the saving less sharply).
2. Stability: `--steps` training steps of the deep model with recomputation on Fashion-MNIST (or digits): the
   training loss every `--log_every` steps, the gradient norm, and the test bits/dim before and after.

    python scripts/benchmarks/bench_image_lm_depth.py                 # 48 layers, width 64 (minutes on 1 core)
    python scripts/benchmarks/bench_image_lm_depth.py --layers 64 --steps 200
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from hf_vit_plus import SparseTransformerForImageGeneration
from hf_vit_plus.cli_utils import CommandParser
from hf_vit_plus.data.images import IMAGE_DATASETS
from hf_vit_plus.models.compat import enable_activation_checkpointing

sys.path.insert(0, str(Path(__file__).parent))  # bench_image_lm: the data and the model of the experiments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="fashion-mnist", choices=list(IMAGE_DATASETS), help="images")
    parser.add_argument("--layers", type=int, default=48, help="transformer blocks")
    parser.add_argument("--hidden_size", type=int, default=64, help="model width")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--attention_type", default="strided", choices=["dense", "strided", "fixed"])
    parser.add_argument("--mode", default="heads", choices=["merged", "interleaved", "heads"], help="pattern mode")
    parser.add_argument("--batch_size", type=int, default=8, help="images per step")
    parser.add_argument("--steps", type=int, default=100, help="training steps of the stability run (0: none)")
    parser.add_argument("--log_every", type=int, default=10, help="steps between loss lines")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (warmup then cosine)")
    parser.add_argument("--eval_images", type=int, default=200, help="test images for bits/dim")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0, help="seed")
    parser.add_argument("--measure", choices=["plain", "recompute"], help=argparse.SUPPRESS)  # the child process
    return parser.parse_args(argv)


def build(args: argparse.Namespace, height: int, width: int) -> SparseTransformerForImageGeneration:
    from bench_image_lm import build_model

    return build_model(args, args.attention_type, height, width).train()


def enable_recomputation(model) -> None:
    """Activation checkpointing of every block."""
    enable_activation_checkpointing(model)


def load(dataset: str) -> tuple[torch.Tensor, torch.Tensor]:
    from bench_image_lm import load_images

    train, test = load_images(dataset)
    return torch.from_numpy(train.copy()), torch.from_numpy(test.copy())


def measure_step(args: argparse.Namespace) -> dict:
    """One forward + backward in this process; the bytes saved for backward and the peak resident memory."""
    train, _ = load(args.dataset)
    model = build(args, *train.shape[1:])
    if args.measure == "recompute":
        enable_recomputation(model)
    batch = train[: args.batch_size]
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(pixel_values=batch).loss
    loss.backward()
    seconds = time.perf_counter() - start
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "saved_for_backward_bytes": sum(seen.values()),
        "parameter_bytes": parameters,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_before_step_bytes": baseline,
        "seconds": seconds,
    }


@torch.no_grad()
def bits_per_dim(model, images: torch.Tensor, batch_size: int = 50) -> float:
    model.eval()
    total = sum(
        model(pixel_values=images[i : i + batch_size]).loss.item() * len(images[i : i + batch_size])
        for i in range(0, len(images), batch_size)
    )
    model.train()
    return total / len(images) / math.log(2)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.measure:
        print(json.dumps(measure_step(args)))
        return
    argv = list(sys.argv[1:] if argv is None else argv)
    memory = {}
    for kind in ("plain", "recompute"):
        child = subprocess.run(
            [sys.executable, __file__, *argv, "--measure", kind], capture_output=True, text=True, check=True
        )
        memory[kind] = json.loads(child.stdout.strip().splitlines()[-1])
    mib = 2**20
    print(
        f"{args.layers} layers, width {args.hidden_size}, {args.heads} heads, {args.attention_type} "
        f"({args.mode}), batch {args.batch_size} of {args.dataset}; one forward + backward, fresh process each"
    )
    print("| recomputation | saved for backward (MiB) | peak RSS (MiB) | weights (MiB) | s/step |")
    print("|---|---|---|---|---|")
    for kind, row in memory.items():
        print(
            f"| {'on' if kind == 'recompute' else 'off'} | {row['saved_for_backward_bytes'] / mib:.1f} | "
            f"{row['peak_rss_bytes'] / mib:.0f} | {row['parameter_bytes'] / mib:.1f} | {row['seconds']:.2f} |"
        )
    ratio = memory["recompute"]["saved_for_backward_bytes"] / memory["plain"]["saved_for_backward_bytes"]
    print(f"recomputation keeps {ratio:.3f}x of the activations (saved-for-backward bytes)\n")
    if args.steps <= 0:
        return

    from hf_vit_plus.training.schedules import get_warmup_cosine_schedule

    train, test = load(args.dataset)
    model = build(args, *train.shape[1:])
    enable_recomputation(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    schedule = get_warmup_cosine_schedule(optimizer, max(1, args.steps // 10), args.steps)
    generator = torch.Generator().manual_seed(args.seed)
    evaluation = test[: args.eval_images]
    before = bits_per_dim(model, evaluation)
    print(f"stability run: {args.steps} steps with recomputation; test bits/dim at init {before:.3f}")
    print("| step | train bits/dim | grad norm | s/step |")
    print("|---|---|---|---|")
    window, started = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = train[torch.randint(0, len(train), (args.batch_size,), generator=generator)]
        loss = model(pixel_values=batch).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if not math.isfinite(loss.item()):
            raise RuntimeError(f"the loss diverged at step {step}: {loss.item()}")
        window.append(loss.item() / math.log(2))
        if step % args.log_every == 0 or step == args.steps:
            seconds = (time.perf_counter() - started) / len(window)
            print(f"| {step} | {sum(window) / len(window):.3f} | {norm:.2f} | {seconds:.2f} |", flush=True)
            window, started = [], time.perf_counter()
    print(f"test bits/dim after {args.steps} steps: {bits_per_dim(model, evaluation):.3f} (at init {before:.3f})")


if __name__ == "__main__":
    main()
