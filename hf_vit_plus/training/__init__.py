"""Training on Accelerate: one loop (`loop.train`) for every family (vit, seq2seq, sparse-lm, image-lm), each
family's training task (`tasks`), the options of a run in groups (`options`, `args`; run files: `run_file`), the
plan that decides every value of a run once (`plan`), the `train` / `demo` sub-commands and their flags (`cli`,
`cli.parse_args`), the learning-rate schedules of the papers (`schedules`) and checkpoint averaging (`averaging`).

Importing this package does not import the loop (Accelerate, datasets): `train` imports it when called.
"""

from .args import FAMILIES, TrainingArguments, family_arguments

__all__ = ["FAMILIES", "TrainingArguments", "family_arguments", "train"]


def train(args: TrainingArguments):
    """Run the training loop (see `hf_vit_plus.training.loop.train`).

    Args:
        args: the run's options, e.g. from `family_arguments`.

    Returns:
        A `TrainResult`: the final evaluation and where things were written.
    """
    from ..utils.extras import require
    from .loop import train as _train

    require("train", "hf_vit_plus.training.train")

    return _train(args)
