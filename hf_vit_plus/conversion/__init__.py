"""Pure converters from foreign checkpoints (timm, transformers' ViT and Marian, torch.nn.Transformer)."""

from .marian import config_from_marian, seq2seq_from_marian, state_dict_from_marian
from .vit import (
    config_from_timm,
    config_from_transformers,
    state_dict_from_timm,
    vit_plus_from_timm,
    vit_plus_from_transformers,
)

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
