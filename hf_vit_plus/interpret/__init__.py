"""Interpretability for hf_vit_plus models: the ViT paper's Fig. 7 (patch-filter principal components,
position-embedding similarity, mean attention distance), attention rollout (Abnar & Zuidema 2020), the
Sparse Transformer's attention patterns (Child et al. 2019, Fig. 3) and where an image model's attention looks when
it generates the next pixel (Fig. 2).

Functions return tensors; `plots` draws them; `write_vit_figures` writes the whole set for a model card.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

# public name -> the module that defines it, imported when the name is first used
_LAZY_NAMES = {
    "attention_rollout": ".attention",
    "class_token_attention": ".attention",
    "class_token_rollout": ".attention",
    "collect_attentions": ".attention",
    "mean_attention_distance": ".attention",
    "prefix_attention_fraction": ".attention",
    "prepare_images": ".attention",
    "PatchComponents": ".embeddings",
    "VitEmbeddingParts": ".embeddings",
    "patch_embedding_components": ".embeddings",
    "position_embedding_similarity": ".embeddings",
    "vit_embedding_parts": ".embeddings",
    "NextPixelAttention": ".image_attention",
    "next_pixel_attention": ".image_attention",
    "plot_next_pixel_attention": ".image_attention",
    "AttentionPattern": ".patterns",
    "attention_pattern": ".patterns",
    "pattern_from_config": ".patterns",
    "plot_attention_maps": ".plots",
    "plot_mean_attention_distance": ".plots",
    "plot_patch_components": ".plots",
    "plot_position_similarity": ".plots",
    "plot_sparse_patterns": ".plots",
    "write_vit_figures": ".plots",
}

if TYPE_CHECKING:
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

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY_NAMES)

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
