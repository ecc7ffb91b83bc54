"""Views of a Vision Transformer's learned embeddings (Dosovitskiy et al. 2021, Fig. 7 left and centre).

- Position-embedding similarity: the cosine similarity of each patch's position embedding with every other
  patch's. A model that has learned the 2-D layout shows high similarity along its own row and column.
- Patch-embedding principal components: the linear patch projection E (D filters of C x P x P) has a few
  dominant directions; the first (up to 28) principal components look like basis functions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from .attention import grid_shape

logger = logging.getLogger(__name__)


@dataclass
class VitEmbeddingParts:
    """The pieces of a ViT's input embedding the figures read (all from the model, none copied).

    Attributes:
        projection: the patch projection (a `nn.Conv2d`, E of eq. 1).
        position_embeddings: (1, prefix + N, D), the learned position embeddings.
        patch_size: the side of a patch in pixels.
        grid_size: the patch grid (rows, cols).
        num_prefix_tokens: how many tokens (class, distillation) come before the patches.
        stem: the hybrid's convolutional stem (`config.conv_stem_layers`); None for a linear patch embedding.
    """

    projection: nn.Conv2d  # the patch embedding E as a conv with kernel = stride = P, weight (D, C, P, P)
    position_embeddings: torch.Tensor  # (1, prefix + N, D)
    patch_size: int
    grid_size: tuple[int, int]
    num_prefix_tokens: int
    # the hybrid's convolutional stem (config.conv_stem_layers), None for a linear patch embedding: then the
    # projection is a 1 x 1 conv of the stem's features, not filters of pixels
    stem: nn.Module | None = None


def _describe(model: nn.Module) -> str:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return f"{type(model).__name__} (model_type={model_type!r})"


def vit_embedding_parts(model: nn.Module) -> VitEmbeddingParts:
    """Find the patch projection and position embeddings of a ViT-family model.

    Works for hf_vit_plus's ViTPlus models and transformers' ViT/DeiT-style models (`vit.embeddings` or
    `embeddings` holding `patch_embeddings.projection` and `position_embeddings`).

    Args:
        model: the model.

    Returns:
        The parts, read from the model.

    Raises:
        ValueError: any other model, e.g. the encoder-decoder Transformer or the Sparse Transformer (named).
    """
    candidates = [getattr(model, "embeddings", None)]
    base = getattr(model, "base_model", None)
    if base is not None and base is not model:
        candidates.append(getattr(base, "embeddings", None))
    for embeddings in candidates:
        patch = getattr(getattr(embeddings, "patch_embeddings", None), "projection", None)
        positions = getattr(embeddings, "position_embeddings", None)
        if isinstance(patch, nn.Conv2d) and torch.is_tensor(positions) and positions.dim() == 3:
            stem = getattr(embeddings.patch_embeddings, "stem", None)
            config_patch = getattr(getattr(model, "config", None), "patch_size", None)
            patch_size = config_patch if stem is not None and isinstance(config_patch, int) else patch.kernel_size[0]
            tokens = positions.shape[1]
            image_size = getattr(getattr(model, "config", None), "image_size", None)
            if isinstance(image_size, int):
                grid = (image_size // patch_size, image_size // patch_size)
            elif isinstance(image_size, (tuple, list)):
                grid = (image_size[0] // patch_size, image_size[1] // patch_size)
            else:
                grid = grid_shape(tokens - 1)
            prefix = tokens - grid[0] * grid[1]
            if prefix < 0:
                raise ValueError(
                    f"{_describe(model)} has {tokens} position embeddings, fewer than its {grid[0]}x{grid[1]} patches."
                )
            return VitEmbeddingParts(patch, positions.detach(), patch_size, grid, prefix, stem)
    raise ValueError(
        f"{_describe(model)} is not a Vision Transformer: it has no patch projection "
        "(`embeddings.patch_embeddings.projection`) and learned `position_embeddings`. The patch-embedding, "
        "position-similarity and attention-map figures apply to ViT-family image models only."
    )


def position_embedding_similarity(
    position_embeddings: torch.Tensor,
    grid_size: int | tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Cosine similarity between the position embeddings of every pair of patches.

    Args:
        position_embeddings: (1, prefix + N, D) or (prefix + N, D).
        grid_size: the patch grid, (rows, cols) or one side of a square; None: the square grid of N.
        num_prefix_tokens: how many leading embeddings (the class token) are left out.

    Returns:
        (rows, cols, rows, cols): entry [r, c] is the (rows, cols) picture of patch (r, c)'s similarity with all
        patches.

    Raises:
        ValueError: the embeddings are not 2-D or 3-D, or do not form the grid.
    """
    if position_embeddings.dim() == 3:
        if position_embeddings.shape[0] != 1:
            raise ValueError(
                "`position_embeddings` must be (1, tokens, dim) or (tokens, dim), got "
                f"{tuple(position_embeddings.shape)}."
            )
        position_embeddings = position_embeddings[0]
    if position_embeddings.dim() != 2:
        raise ValueError(
            f"`position_embeddings` must be (1, tokens, dim) or (tokens, dim), got {tuple(position_embeddings.shape)}."
        )
    patches = position_embeddings[num_prefix_tokens:].detach().float()  # (N, D)
    rows, cols = grid_shape(patches.shape[0], grid_size)
    unit = nn.functional.normalize(patches, dim=-1)
    similarity = unit @ unit.T  # (N, N)
    return similarity.reshape(rows, cols, rows, cols)


@dataclass
class PatchComponents:
    """Principal components of the patch-embedding filters.

    Attributes:
        components: (K, C, P, P), the components in order of explained variance.
        explained_variance_ratio: (K,), the share of the variance each explains.
        mean_filter: (C, P, P), the mean filter removed before the decomposition.
    """

    components: torch.Tensor  # (K, C, P, P), unit norm, sign fixed so the largest-magnitude entry is positive
    explained_variance_ratio: torch.Tensor  # (K,), share of the filters' total variance along each component
    mean_filter: torch.Tensor  # (C, P, P), removed before the decomposition


def patch_embedding_components(weight: torch.Tensor, num_components: int = 28) -> PatchComponents:
    """PCA of the D patch-embedding filters (the conv form of E in eq. 1).

    Each filter is a point in C*P*P dimensions; the mean filter is removed and the right singular vectors give the
    components, in order of explained variance. At most min(D - 1, C*P*P) components exist; asking for more logs
    a note and returns those.

    Args:
        weight: (D, C, P, P), the weight of the patch projection.
        num_components: how many components to return.

    Returns:
        The components, their explained variance ratios and the mean filter.

    Raises:
        ValueError: `weight` is not 4-D, `num_components` is not a positive integer, or there are fewer than 2 filters.
    """
    if weight.dim() != 4:
        raise ValueError(f"Patch-embedding weight must be (hidden, channels, P, P), got {tuple(weight.shape)}.")
    if isinstance(num_components, bool) or not isinstance(num_components, int) or num_components <= 0:
        raise ValueError(f"`num_components` must be a positive integer, got {num_components!r}.")
    filters, channels, height, width = weight.shape
    if filters < 2:
        raise ValueError(f"PCA needs at least 2 filters, the patch embedding has {filters}.")
    flat = weight.detach().double().reshape(filters, -1)  # (D, C*P*P)
    mean = flat.mean(dim=0)
    centred = flat - mean
    _, singular, vh = torch.linalg.svd(centred, full_matrices=False)
    available = min(filters - 1, flat.shape[1])
    if num_components > available:
        logger.info("Asked for %d principal components, the filters have at most %d.", num_components, available)
    k = min(num_components, available)
    components = vh[:k]  # (K, C*P*P)
    peak = components.gather(1, components.abs().argmax(dim=1, keepdim=True))
    components = components * torch.sign(peak)
    variance = singular**2
    ratio = variance[:k] / variance.sum().clamp_min(torch.finfo(variance.dtype).tiny)
    return PatchComponents(
        components=components.reshape(k, channels, height, width).float(),
        explained_variance_ratio=ratio.float(),
        mean_filter=mean.reshape(channels, height, width).float(),
    )


__all__ = [
    "PatchComponents",
    "VitEmbeddingParts",
    "patch_embedding_components",
    "position_embedding_similarity",
    "vit_embedding_parts",
]
