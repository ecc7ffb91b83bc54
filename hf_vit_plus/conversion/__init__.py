"""Pure converters from foreign checkpoints (timm, transformers' ViT and Marian, torch.nn.Transformer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

# public name -> the module that defines it, imported when the name is first used
_LAZY_NAMES = {
    "config_from_marian": ".marian",
    "seq2seq_from_marian": ".marian",
    "state_dict_from_marian": ".marian",
    "config_from_timm": ".vit",
    "config_from_transformers": ".vit",
    "state_dict_from_timm": ".vit",
    "vit_plus_from_timm": ".vit",
    "vit_plus_from_transformers": ".vit",
}

if TYPE_CHECKING:
    from .marian import config_from_marian, seq2seq_from_marian, state_dict_from_marian
    from .vit import (
        config_from_timm,
        config_from_transformers,
        state_dict_from_timm,
        vit_plus_from_timm,
        vit_plus_from_transformers,
    )

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY_NAMES)

__all__ = [
    "config_from_marian",
    "config_from_timm",
    "config_from_transformers",
    "seq2seq_from_marian",
    "state_dict_from_marian",
    "state_dict_from_timm",
    "vit_plus_from_timm",
    "vit_plus_from_transformers",
]
