"""How each family trains inside the one loop (`hf_vit_plus.training.loop`), its training task: one module per
family (`vit.py`, `seq2seq.py`, `sparse_lm.py`, `image_lm.py`), each a `TrainingTask` subclass (data, model, loss,
metrics), on the shared base (`base.py`: the steps the loop calls, the data helpers) and the --config_overrides
checks (`overrides.py`). What a family is (its classes, flags, defaults, card) is its record in `hf_vit_plus.families`.

`get_task(name)` finds a family's task through its record, whose `task` names the class: this package imports no
family module itself, so a new family is its own module plus its record.
"""

from __future__ import annotations

import importlib

from ...families import get_family as get_record
from .base import TrainingData, TrainingTask, weight_decay_groups, weights_from_main_process
from .overrides import check_config_overrides, config_fields, config_value_errors, parse_overrides


def get_task(name: str) -> TrainingTask:
    """The training task of the family `name` (a new instance), as its record's `task` names it.

    Args:
        name: a family id ("vit", "vit-mpp", "seq2seq", "sparse-lm", "image-lm").

    Returns:
        A new instance of the family's `TrainingTask` subclass.

    Raises:
        ValueError: an unknown family.
    """
    record = get_record(name)
    module, _, class_name = record.task.partition(":")
    return getattr(importlib.import_module(module), class_name)()


__all__ = [
    "TrainingData",
    "TrainingTask",
    "check_config_overrides",
    "config_fields",
    "config_value_errors",
    "get_task",
    "parse_overrides",
    "weight_decay_groups",
    "weights_from_main_process",
]
