"""The model families, one `Family` record each (`record.py`): the one place that says what a family is. The Auto
classes (`hf_vit_plus.registration`), `hf-vit-plus train` (its sub-commands, flags, help and defaults), the model
cards, ONNX export and the tests' model matrix all read these records.

A family is its own files (`models/configuration_X.py` and `modeling_X.py`; its record `families/X.py`; how it trains,
`training/tasks/X.py`; its card template, `hub/templates/X.md`) plus its line in `FAMILIES` below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .image_lm import IMAGE_LM
from .record import CardSpec, Family
from .seq2seq import SEQ2SEQ
from .sparse_lm import SPARSE_LM
from .vit import VIT, VIT_MPP

# id -> record, in the order the command line lists them
FAMILIES: dict[str, Family] = {family.id: family for family in (VIT, VIT_MPP, SEQ2SEQ, SPARSE_LM, IMAGE_LM)}


def get_family(name: str) -> Family:
    """The record of the family `name`.

    Args:
        name: a family id ("vit", "vit-mpp", "seq2seq", "sparse-lm", "image-lm").

    Returns:
        The family's record.

    Raises:
        ValueError: an unknown name (the message lists the families).
    """
    if name not in FAMILIES:
        raise ValueError(f"Unknown family {name!r}; expected one of {sorted(FAMILIES)}.")
    return FAMILIES[name]


def _as_dict(config) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise ValueError(f"model_config must be a PretrainedConfig or a dict, got {type(config).__name__}.")


def family_of_config(config) -> Family | None:
    """The family of a config, by its `model_type`.

    For a model type that several families share, whether it is an image model decides, then the head its
    `architectures` names: a ViT saved by masked patch prediction is a "vit-mpp" model.

    Args:
        config: a `PretrainedConfig` or its dict.

    Returns:
        The family, or None for a model type that is not this project's.

    Raises:
        ValueError: `config` is neither a `PretrainedConfig` nor a dict.
    """
    config = _as_dict(config)
    matching = [family for family in FAMILIES.values() if family.matches(config)]
    architectures = config.get("architectures") or ()
    named = [family for family in matching if family.head_class_name in architectures]
    return (named or matching or [None])[0]


def family_of_model(model) -> Family | None:
    """The family whose head `model` is: its class exactly, else the first head class it derives from.

    Args:
        model: a model instance.

    Returns:
        The family, or None when the model is none of the families' heads.
    """
    exact = next((family for family in FAMILIES.values() if type(model) is family.head_class), None)
    return exact or next((family for family in FAMILIES.values() if isinstance(model, family.head_class)), None)


__all__ = ["FAMILIES", "CardSpec", "Family", "family_of_config", "family_of_model", "get_family"]
