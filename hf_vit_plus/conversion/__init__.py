"""Pure converters from foreign checkpoints (timm, transformers' ViT, torch.nn.Transformer) to hf_vit_plus."""

from .vit import (
    config_from_timm,
    config_from_transformers,
    state_dict_from_timm,
    vit_plus_from_timm,
    vit_plus_from_transformers,
)

__all__ = [
    "config_from_timm",
    "config_from_transformers",
    "state_dict_from_timm",
    "vit_plus_from_timm",
    "vit_plus_from_transformers",
]
