"""How each family trains inside the one loop (`hf_vit_plus.training.loop`): one module per family (`vit.py`,
`seq2seq.py`, `sparse_lm.py`, `image_lm.py`), each a `TrainingFamily` subclass, on the shared base (`base.py`: the
steps the loop calls, the data helpers) and the --config_overrides checks (`overrides.py`).

`get_family(name)` finds a family's recipe through its record (`hf_vit_plus.families`, whose `trainer` names the
class): this package imports no family module itself, so a new family is its own module plus its record.
"""

from __future__ import annotations

import importlib

from ...families import get_family as get_record
from .base import TrainingData, TrainingFamily, warmup_steps, weight_decay_groups, weights_from_main_process
from .overrides import check_config_overrides, config_fields, config_value_errors, parse_overrides


def get_family(name: str) -> TrainingFamily:
    """The training recipe of the family `name` (a new instance), as its record's `trainer` names it.

    Args:
        name: a family id ("vit", "vit-mpp", "seq2seq", "sparse-lm", "image-lm").

    Returns:
        A new instance of the family's `TrainingFamily` subclass.

    Raises:
        ValueError: an unknown family.
    """
    record = get_record(name)
    module, _, class_name = record.trainer.partition(":")
    return getattr(importlib.import_module(module), class_name)()


__all__ = [
    "TrainingData",
    "TrainingFamily",
    "check_config_overrides",
    "config_fields",
    "config_value_errors",
    "get_family",
    "parse_overrides",
    "warmup_steps",
    "weight_decay_groups",
    "weights_from_main_process",
]
