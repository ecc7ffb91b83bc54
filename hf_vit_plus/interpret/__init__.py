"""Interpretability for hf_vit_plus models: the ViT paper's Fig. 7 (patch-filter principal components,
position-embedding similarity, mean attention distance), attention rollout (Abnar & Zuidema 2020), the
Sparse Transformer's attention patterns (Child et al. 2019, Fig. 3) and where an image model's attention looks when
it generates the next pixel (Fig. 2).

Functions return tensors; `plots` draws them; `write_vit_figures` writes the whole set for a model card.
"""

from .attention import (
    attention_rollout,
    class_token_attention,
    class_token_rollout,
    collect_attentions,
    mean_attention_distance,
    prefix_attention_fraction,
    prepare_images,
)
from .embeddings import (
    PatchComponents,
    VitEmbeddingParts,
    patch_embedding_components,
    position_embedding_similarity,
    vit_embedding_parts,
)
from .image_attention import NextPixelAttention, next_pixel_attention, plot_next_pixel_attention
from .patterns import AttentionPattern, attention_pattern, pattern_from_config
from .plots import (
    plot_attention_maps,
    plot_mean_attention_distance,
    plot_patch_components,
    plot_position_similarity,
    plot_sparse_patterns,
    write_vit_figures,
)

__all__ = [
    "AttentionPattern",
    "NextPixelAttention",
    "PatchComponents",
    "VitEmbeddingParts",
    "attention_pattern",
    "attention_rollout",
    "class_token_attention",
    "class_token_rollout",
    "collect_attentions",
    "mean_attention_distance",
    "next_pixel_attention",
    "patch_embedding_components",
    "pattern_from_config",
    "plot_attention_maps",
    "plot_mean_attention_distance",
    "plot_next_pixel_attention",
    "plot_patch_components",
    "plot_position_similarity",
    "plot_sparse_patterns",
    "position_embedding_similarity",
    "prefix_attention_fraction",
    "prepare_images",
    "vit_embedding_parts",
    "write_vit_figures",
]
