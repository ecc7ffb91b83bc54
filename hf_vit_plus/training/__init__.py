"""Training on Accelerate: one loop (`loop.train`) for the three families, their per-family pieces
(`families`), the shared command-line arguments (`args`), the `train` / `demo` sub-commands (`cli`) and the
learning-rate schedules of the papers (`schedules`).

Importing this package is cheap: the loop and the families import their heavy dependencies when used.
"""

from .args import FAMILIES, TrainingArguments, family_arguments, parse_args

__all__ = ["FAMILIES", "TrainingArguments", "family_arguments", "parse_args", "train"]


def train(args: TrainingArguments):
    """Run the training loop (see `hf_vit_plus.training.loop.train`)."""
    from .loop import train as _train

    return _train(args)
