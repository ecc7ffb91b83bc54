"""Training-curve figures for model cards, drawn from a `Trainer`-style log history."""

from __future__ import annotations

import math
from numbers import Real
from pathlib import Path

from ..utils.extras import require

# Keys of a log-history entry that are bookkeeping, not curves.
_NOT_CURVES = ("epoch", "step", "total_flos", "learning_rate", "grad_norm")
_BOOKKEEPING_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second", "_preparation_time")


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _curves(log_history: list[dict]) -> tuple[dict[str, list], dict[str, list]]:
    """(losses, eval metrics), each name -> [(step, value)]."""
    losses: dict[str, list] = {}
    metrics: dict[str, list] = {}
    for i, entry in enumerate(log_history):
        if not isinstance(entry, dict):
            raise ValueError(f"log_history[{i}] must be a dict, got {type(entry).__name__}.")
        if "train_runtime" in entry:  # the summary Trainer appends at the end of training
            continue
        step = entry.get("step", i)
        if not _is_number(step):
            raise ValueError(f"log_history[{i}] has a non-numeric step {step!r}.")
        for key, value in entry.items():
            if key in _NOT_CURVES or key.endswith(_BOOKKEEPING_SUFFIXES) or not _is_number(value):
                continue
            if key == "loss" or key.endswith("_loss"):
                losses.setdefault(key, []).append((step, value))
            elif key.startswith("eval_"):
                metrics.setdefault(key, []).append((step, value))
    return losses, metrics


def plot_training_curves(log_history: list[dict], path: str | Path) -> Path:
    """Plot the training/eval loss and the eval metrics against the step, and save a PNG at `path`.

    Args:
        log_history: `trainer.state.log_history`-style entries: dicts with "step" and "loss" (training logs) or
            "eval_*" values (evaluation logs). Bookkeeping keys (runtime, throughput, learning rate) are skipped.
        path: where the PNG goes (parent folders are created).

    Returns:
        The path of the PNG.

    Raises:
        ValueError: no loss and no eval metric to plot, or malformed entries.
    """
    require("train", "The training-curve figure", ("matplotlib",))
    # The Agg canvas directly, without pyplot: no global backend switch, no GUI, safe off the main thread.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not isinstance(log_history, (list, tuple)):
        raise ValueError(f"log_history must be a list of dicts, got {type(log_history).__name__}.")
    losses, metrics = _curves(log_history)
    if not losses and not metrics:
        raise ValueError("log_history has no loss and no eval metric to plot.")
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"The figure is written as PNG: give a path ending in .png, got {str(path)!r}.")

    panels = [("loss", losses)] + ([("eval metrics", metrics)] if metrics else [])
    fig = Figure(figsize=(5.5 * len(panels), 4.0), dpi=100)
    FigureCanvasAgg(fig)
    for i, (title, curves) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for name, points in sorted(curves.items()):
            steps, values = zip(*sorted(points))
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=name)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if curves:
            ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
