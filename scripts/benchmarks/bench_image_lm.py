"""Sparse against dense attention on images: the Sparse Transformer paper's CIFAR-10 comparison, scaled down to
Fashion-MNIST (28 x 28 grey, 784 pixels per image).

Trains one image model per attention type (dense, strided, fixed), all of the same size, on the same batches in the
same order, in lockstep: each step trains every model once, in an order that rotates from step to step, so that load
on the machine affects all alike. Every `--eval_every` steps each model's bits per dim are measured on the same test
images. Prints a table (seconds per step, its ratio to dense, test bits/dim, the step and the training time at which
each model first reached dense's final bits/dim) and writes, to `--output_dir`:

- `curves.json`: every evaluation (step, training seconds so far, bits/dim) per model, the settings and the floors;
- `curves.png`: test bits/dim against steps and against training time, one plot with two panels;
- `MODEL/`: each trained model (`save_pretrained`), to sample from (`hf-vit-plus sample`) or explain.

    python scripts/benchmarks/bench_image_lm.py --output_dir runs/patterns           # defaults (about an hour, 1 core)
    python scripts/benchmarks/bench_image_lm.py --dataset digits --steps 200 --output_dir /tmp/quick   # a check

The paper (CIFAR-10, 128 layers): strided 2.80 bits/dim at 0.38 s per iteration against dense 2.82 at 0.54 s. Sparse
layers run the exact block-sparse CPU kernel ("sparse_block"), dense layers SDPA with the causal flag. The time per
step is the median over the steps after the first few; the evaluation is not part of it. The floors printed beside
the models are computed on the same split: uniform (8 bits/dim) and each pixel's own histogram over the training
images.

This is an experiment with its own minimal loop (AdamW, warmup then cosine decay, nothing else in the step), not a
training entry point: `hf-vit-plus train image-lm` trains, evaluates and saves a model with its card.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from hf_vit_plus import SparseTransformerConfig, SparseTransformerForImageGeneration
from hf_vit_plus.cli_utils import CommandParser
from hf_vit_plus.data.images import IMAGE_DATASETS, load_image_arrays
from hf_vit_plus.data.pixel_baselines import pixel_floors
from hf_vit_plus.training.schedules import get_warmup_cosine_schedule


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="fashion-mnist", choices=list(IMAGE_DATASETS), help="images")
    parser.add_argument("--patterns", default="dense,strided,fixed", help="comma-separated attention types")
    parser.add_argument(
        "--mode", default="heads", choices=["merged", "interleaved", "heads"], help="how sparse layers combine parts"
    )
    parser.add_argument("--steps", type=int, default=1500, help="training steps per model")
    parser.add_argument("--batch_size", type=int, default=16, help="images per step")
    parser.add_argument("--hidden_size", type=int, default=64, help="model width")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=100, help="warmup steps")
    parser.add_argument("--eval_every", type=int, default=100, help="steps between evaluations")
    parser.add_argument("--eval_images", type=int, default=1000, help="test images of each evaluation")
    parser.add_argument("--final_eval_images", type=int, default=10000, help="test images of the final evaluation")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--output_dir", type=Path, required=True, help="where curves, plot and models go")
    return parser.parse_args(argv)


def load_images(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) uint8 arrays (N, H, W)."""
    return load_image_arrays(dataset, "train"), load_image_arrays(dataset, "test")


def build_model(args: argparse.Namespace, attention_type: str, height: int, width: int):
    torch.manual_seed(args.seed)
    config = SparseTransformerConfig.for_images(
        height,
        width,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden_size,
        attention_type=attention_type,
        sparse_pattern_mode=args.mode,
    )
    return SparseTransformerForImageGeneration(config)


@torch.no_grad()
def bits_per_dim(model, images: torch.Tensor, batch_size: int = 100) -> float:
    model.eval()
    total = 0.0
    for start in range(0, len(images), batch_size):
        batch = images[start : start + batch_size]
        total += model(pixel_values=batch).loss.item() * len(batch)
    model.train()
    return total / len(images) / math.log(2)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    train_images, test_images = load_images(args.dataset)
    height, width = train_images.shape[1:]
    train = torch.from_numpy(train_images.copy())
    test = torch.from_numpy(test_images.copy())
    eval_set = test[: args.eval_images]
    floors = pixel_floors(train_images, test_images)
    patterns = args.patterns.split(",")
    models = {name: build_model(args, name, height, width).train() for name in patterns}
    optimizers = {
        name: torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
        for name, model in models.items()
    }
    schedules = {
        name: get_warmup_cosine_schedule(optimizer, min(args.warmup, args.steps), args.steps)
        for name, optimizer in optimizers.items()
    }
    step_times = {name: [] for name in patterns}
    curves = {name: [] for name in patterns}
    generator = torch.Generator().manual_seed(args.seed)
    print(
        f"{args.dataset}: {len(train)} train / {len(test)} test images of {height}x{width}; {args.layers} layers, "
        f"width {args.hidden_size}, {args.heads} heads, sparse mode {args.mode!r}, batch {args.batch_size}, "
        f"{args.steps} steps, {args.threads} thread(s)",
        flush=True,
    )
    for name, model in models.items():
        curves[name].append({"step": 0, "seconds": 0.0, "bits_per_dim": bits_per_dim(model, eval_set)})
    for step in range(1, args.steps + 1):
        batch = train[torch.randint(0, len(train), (args.batch_size,), generator=generator)]
        order = patterns[step % len(patterns) :] + patterns[: step % len(patterns)]
        for name in order:
            start = time.perf_counter()
            loss = models[name](pixel_values=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(models[name].parameters(), 1.0)
            optimizers[name].step()
            schedules[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            step_times[name].append(time.perf_counter() - start)
            if not math.isfinite(loss.item()):
                raise RuntimeError(f"{name}: the loss is {loss.item()} at step {step}.")
        if step % args.eval_every == 0 or step == args.steps:
            line = [f"step {step:5d}"]
            for name, model in models.items():
                point = {"step": step, "seconds": sum(step_times[name]), "bits_per_dim": bits_per_dim(model, eval_set)}
                curves[name].append(point)
                line.append(f"{name} {point['bits_per_dim']:.3f}")
            print("  ".join(line), flush=True)

    final = {}
    for name, model in models.items():
        final[name] = bits_per_dim(model, test[: args.final_eval_images])
        model.save_pretrained(args.output_dir / name)
    settle = min(5, args.steps // 2)
    seconds = {name: statistics.median(times[settle:]) for name, times in step_times.items()}
    reference = "dense" if "dense" in patterns else patterns[0]
    target = curves[reference][-1]["bits_per_dim"]
    reached = {}
    for name in patterns:
        hit = next((point for point in curves[name] if point["bits_per_dim"] <= target), None)
        reached[name] = hit
    results = {
        "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "floors": floors,
        "seconds_per_step": seconds,
        "final_bits_per_dim": final,
        "curves": curves,
        "reached_reference": reached,
        "torch": torch.__version__,
    }
    (args.output_dir / "curves.json").write_text(json.dumps(results, indent=1))
    plot(results, args.output_dir / "curves.png", args)

    uniform, histogram = floors["uniform_bits_per_dim"], floors["pixel_histogram_bits_per_dim"]
    print(
        f"\ntest bits/dim on {min(args.final_eval_images, len(test))} test images; floors on the same split: "
        f"uniform {uniform:.2f}, per-pixel histogram {histogram:.3f}"
    )
    print(f"| attention | s/step | vs {reference} | test bits/dim | reaches {reference}'s final {target:.3f} at |")
    print("|---|---|---|---|---|")
    for name in patterns:
        hit = reached[name]
        when = f"step {hit['step']} ({hit['seconds']:.0f} s)" if hit else "not reached"
        ratio = seconds[name] / seconds[reference]
        print(f"| {name} | {seconds[name]:.3f} | {ratio:.2f}x | {final[name]:.3f} | {when} |")
    return results


def plot(results: dict, path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for name, points in results["curves"].items():
        points = [p for p in points if p["step"] > 0]
        label = f"{name} ({results['seconds_per_step'][name]:.2f} s/step)"
        by_step.plot([p["step"] for p in points], [p["bits_per_dim"] for p in points], marker=".", label=label)
        by_time.plot([p["seconds"] / 60 for p in points], [p["bits_per_dim"] for p in points], marker=".", label=label)
    for axis in (by_step, by_time):
        floor = results["floors"]["pixel_histogram_bits_per_dim"]
        axis.axhline(floor, color="grey", linestyle=":", label="per-pixel histogram")
        axis.grid(alpha=0.3)
    by_step.set_xlabel("training step")
    by_time.set_xlabel("training time (minutes, 1 thread)")
    by_step.set_ylabel(f"test bits/dim ({args.eval_images} images)")
    by_step.legend()
    fig.suptitle(
        f"{args.dataset}: dense vs sparse attention, {args.layers} layers x width {args.hidden_size}, batch "
        f"{args.batch_size}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
