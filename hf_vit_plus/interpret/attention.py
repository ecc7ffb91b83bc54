"""Attention-based views of a Vision Transformer.

- Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", arXiv 2005.00928, sec. 3):
  each layer's head-averaged attention is mixed with the identity for the residual connection,
  A_hat = w * I + (1 - w) * mean_h(A) with w = 0.5, rows renormalised, and the layers are multiplied in order,
  R = A_hat_L ... A_hat_1. The class token's row of R says how much each input patch reaches the class token.
- The last layer's class-token attention per head (ViT, Dosovitskiy et al. 2021, Fig. 6 used rollout).
- Mean attention distance (ViT, Fig. 7 right, appendix D.7): for each head, the distance in pixels between the
  query patch and the key patches, weighted by the attention, averaged over query patches and images.

All functions take the attention probabilities as transformers returns them: a sequence over layers of
(B, H, T, T) tensors with T = num_prefix_tokens + N patch tokens (ViT: one class token at position 0).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

logger = logging.getLogger(__name__)

HEAD_FUSIONS = ("mean", "max", "min")


def _check_attentions(attentions: Sequence[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
    """Validate and return a list of (B, H, T, T) float tensors; a single (B, H, T, T) tensor is one layer."""
    if torch.is_tensor(attentions):
        attentions = [attentions]
    if attentions is None or len(attentions) == 0:
        raise ValueError("`attentions` is empty: expected one (batch, heads, tokens, tokens) tensor per layer.")
    checked = []
    for index, layer in enumerate(attentions):
        if layer is None:
            raise ValueError(
                f"Layer {index} has no attention weights (None): the model's attention kernel does not return them; "
                "run the model with the eager kernel (`collect_attentions` does that)."
            )
        if layer.dim() == 3:
            layer = layer.unsqueeze(0)  # (1, H, T, T)
        if layer.dim() != 4 or layer.shape[-1] != layer.shape[-2]:
            raise ValueError(
                f"Layer {index} attention has shape {tuple(layer.shape)}; expected (batch, heads, tokens, tokens)."
            )
        if checked and layer.shape != checked[0].shape:
            raise ValueError(
                f"Layer {index} attention has shape {tuple(layer.shape)}, layer 0 has {tuple(checked[0].shape)}."
            )
        checked.append(layer.detach().float())
    return checked


def grid_shape(num_patches: int, grid_size: int | tuple[int, int] | None = None) -> tuple[int, int]:
    """(rows, columns) of the patch grid; a square grid when `grid_size` is None."""
    if grid_size is None:
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise ValueError(f"{num_patches} patch tokens do not form a square grid; pass grid_size=(rows, columns).")
        return side, side
    rows, cols = (grid_size, grid_size) if isinstance(grid_size, int) else tuple(grid_size)
    if rows * cols != num_patches:
        raise ValueError(f"grid_size {rows}x{cols} = {rows * cols} does not match {num_patches} patch tokens.")
    return rows, cols


def attention_rollout(
    attentions: Sequence[torch.Tensor] | torch.Tensor,
    residual_weight: float = 0.5,
    head_fusion: str = "mean",
) -> torch.Tensor:
    """Attention rollout R = A_hat_L @ ... @ A_hat_1 with A_hat = w I + (1 - w) fuse_heads(A), rows renormalised.

    Args:
        attentions: one (B, H, T, T) attention tensor per layer, first layer first, or one (L, B, H, T, T) tensor.
        residual_weight: w, the weight of the identity that stands for the residual connection, in [0, 1].
        head_fusion: how the heads are fused: "mean" (the paper) or "max" / "min" (as in jacobgil/vit-explain).

    Returns:
        (B, T, T): row i is how much each input token contributes to token i after the last layer. Every row sums to 1.

    Raises:
        ValueError: `attentions` is empty or not (B, H, T, T) per layer, `head_fusion` is unknown, or
            `residual_weight` lies outside [0, 1].
    """
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"`head_fusion` must be one of {HEAD_FUSIONS}, got {head_fusion!r}.")
    if not 0.0 <= residual_weight <= 1.0:
        raise ValueError(f"`residual_weight` must lie in [0, 1], got {residual_weight!r}.")
    layers = _check_attentions(attentions)
    batch, _, tokens, _ = layers[0].shape
    identity = torch.eye(tokens).expand(batch, tokens, tokens)
    rollout = identity.clone()
    for layer in layers:
        if head_fusion == "mean":
            fused = layer.mean(dim=1)  # (B, T, T)
        elif head_fusion == "max":
            fused = layer.amax(dim=1)
        else:
            fused = layer.amin(dim=1)
        mixed = residual_weight * identity + (1.0 - residual_weight) * fused
        mixed = mixed / mixed.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(mixed.dtype).tiny)
        rollout = mixed @ rollout  # later layers act on the output of earlier ones
    return rollout


def class_token_rollout(
    rollout: torch.Tensor, grid_size: int | tuple[int, int] | None = None, num_prefix_tokens: int = 1
) -> torch.Tensor:
    """The class token's row of a rollout (B, T, T) over the patch tokens, as (B, rows, cols) maps.

    Args:
        rollout: (B, T, T), the output of `attention_rollout`.
        grid_size: the patch grid, (rows, cols) or one side of a square; None: the square grid of the patch count.
        num_prefix_tokens: how many tokens (class, distillation) come before the patches.

    Returns:
        (B, rows, cols): the raw rollout weights (they sum to 1 minus the weight left on the prefix tokens).

    Raises:
        ValueError: `rollout` is not 3-D, or the patches do not form the grid.
    """
    if rollout.dim() == 2:
        rollout = rollout.unsqueeze(0)
    if rollout.dim() != 3:
        raise ValueError(f"`rollout` must have shape (batch, tokens, tokens), got {tuple(rollout.shape)}.")
    rows, cols = grid_shape(rollout.shape[-1] - num_prefix_tokens, grid_size)
    return rollout[:, 0, num_prefix_tokens:].reshape(-1, rows, cols)  # (B, rows, cols)


def class_token_attention(
    attentions: Sequence[torch.Tensor] | torch.Tensor,
    layer: int = -1,
    grid_size: int | tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Attention of the class token to each patch in one layer (the last by default).

    Args:
        attentions: one (B, H, T, T) attention tensor per layer, or one (L, B, H, T, T) tensor.
        layer: the layer to read (Python indexing: -1 is the last).
        grid_size: the patch grid, (rows, cols) or one side of a square; None: the square grid of the patch count.
        num_prefix_tokens: how many tokens (class, distillation) come before the patches.

    Returns:
        (B, H, rows, cols): the class token's attention weights on the patches, per head.

    Raises:
        ValueError: `layer` is out of range, or the attentions or the grid do not fit.
    """
    layers = _check_attentions(attentions)
    if not -len(layers) <= layer < len(layers):
        raise ValueError(f"`layer` {layer} is out of range for a model with {len(layers)} layers.")
    weights = layers[layer]  # (B, H, T, T)
    rows, cols = grid_shape(weights.shape[-1] - num_prefix_tokens, grid_size)
    batch, heads = weights.shape[:2]
    return weights[:, :, 0, num_prefix_tokens:].reshape(batch, heads, rows, cols)


def patch_distances(grid_size: tuple[int, int], patch_size: int) -> torch.Tensor:
    """Euclidean distance in pixels between the centres of every pair of patches, (N, N), row-major order."""
    rows, cols = grid_size
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    centres = (torch.stack([r.flatten(), c.flatten()], dim=-1).float() + 0.5) * patch_size  # (N, 2)
    return torch.cdist(centres, centres)


def mean_attention_distance(
    attentions: Sequence[torch.Tensor] | torch.Tensor,
    patch_size: int,
    grid_size: int | tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Mean attention distance in pixels per layer and head, (L, H) (ViT Fig. 7 right).

    For each patch query: sum_j a_ij * ||centre_i - centre_j|| over the patch keys j, averaged over the patch
    queries and the batch. The class (prefix) tokens have no position in the image: their rows are dropped,
    their columns too, and each query's attention over the patches is renormalised to sum to 1, so the number
    is the expected distance *given* that the query looks at a patch (the weight on the class token is
    reported separately by `prefix_attention_fraction`).

    Args:
        attentions: one (B, H, T, T) attention tensor per layer, or one (L, B, H, T, T) tensor.
        patch_size: the side of a patch in pixels.
        grid_size: the patch grid, (rows, cols) or one side of a square; None: the square grid of the patch count.
        num_prefix_tokens: how many tokens (class, distillation) come before the patches.

    Returns:
        (L, H): the mean distance in pixels of each layer's heads.

    Raises:
        ValueError: `patch_size` is not a positive integer, or the attentions or the grid do not fit.
    """
    if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size <= 0:
        raise ValueError(f"`patch_size` must be a positive integer, got {patch_size!r}.")
    layers = _check_attentions(attentions)
    tokens = layers[0].shape[-1]
    grid = grid_shape(tokens - num_prefix_tokens, grid_size)
    distances = patch_distances(grid, patch_size)  # (N, N)
    result = []
    for layer in layers:
        patch_attention = layer[:, :, num_prefix_tokens:, num_prefix_tokens:]  # (B, H, N, N)
        mass = patch_attention.sum(dim=-1, keepdim=True)
        patch_attention = patch_attention / mass.clamp_min(torch.finfo(patch_attention.dtype).tiny)
        per_query = (patch_attention * distances).sum(dim=-1)  # (B, H, N)
        result.append(per_query.mean(dim=(0, 2)))  # (H,)
    return torch.stack(result)  # (L, H)


def prefix_attention_fraction(
    attentions: Sequence[torch.Tensor] | torch.Tensor, num_prefix_tokens: int = 1
) -> torch.Tensor:
    """Share of each patch query's attention that goes to the class (prefix) tokens, batch-averaged.

    Args:
        attentions: one (B, H, T, T) attention tensor per layer, or one (L, B, H, T, T) tensor.
        num_prefix_tokens: how many tokens (class, distillation) come before the patches.

    Returns:
        (L, H): the mean share, over the patch queries and the batch, per layer and head.
    """
    layers = _check_attentions(attentions)
    return torch.stack(
        [layer[:, :, num_prefix_tokens:, :num_prefix_tokens].sum(-1).mean(dim=(0, 2)) for layer in layers]
    )


def _model_resolution(config) -> tuple[int, int, int]:
    """(channels, height, width) a ViT-style config expects."""
    size = getattr(config, "image_size", None)
    channels = getattr(config, "num_channels", None)
    if size is None or channels is None:
        model_type = getattr(config, "model_type", None)
        raise ValueError(
            f"model_type={model_type!r} has no `image_size` / `num_channels`: image figures apply to image models."
        )
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    return channels, height, width


def _to_pil(image, mode: str):
    from PIL import Image

    if isinstance(image, (str, Path)):
        with Image.open(image) as opened:
            image = opened.copy()
    elif isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            if not np.issubdtype(image.dtype, np.floating) or image.min() < 0.0 or image.max() > 1.0:
                raise ValueError(
                    f"A numpy image must be uint8 (0..255) or float in [0, 1], got dtype {image.dtype} with values "
                    f"in [{image.min()}, {image.max()}]."
                )
            image = (image * 255.0).round().astype(np.uint8)
        image = Image.fromarray(image)
    elif not isinstance(image, Image.Image):
        raise ValueError(
            f"Cannot read an image from {type(image).__name__}: pass PIL images, file paths, numpy arrays or a "
            "(batch, channels, height, width) tensor of pixel values."
        )
    if image.mode != mode:
        logger.debug("Converting a %s image to %s for a %d-channel model.", image.mode, mode, len(mode))
        image = image.convert(mode)
    return image


def prepare_images(model: nn.Module, images, processor=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel values for `model` and the same images for display.

    Images are converted to the model's mode ("L" for 1 channel, "RGB" for 3) and resized and normalised by
    `processor`.

    Args:
        model: a ViT-family model; its config gives the resolution and the number of channels.
        images: a PIL image, path or numpy array, a list of them, or a (B, C, H, W) / (C, H, W) tensor of pixel
            values already at the model's resolution.
        processor: the image processor; None: a `ViTPlusImageProcessor` made from the model's config.

    Returns:
        pixel_values (B, C, H, W) and display images (B, H, W, C) scaled to [0, 1].

    Raises:
        ValueError: no images, an image the model's channel count cannot take, or a tensor of the wrong shape.
    """
    config = getattr(model, "config", None)
    channels, height, width = _model_resolution(config)
    if torch.is_tensor(images):
        pixel_values = images.unsqueeze(0) if images.dim() == 3 else images
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != (channels, height, width):
            raise ValueError(
                f"Pixel values of shape {tuple(images.shape)} do not fit the model, which expects (batch, {channels}, "
                f"{height}, {width}); pass PIL images to have them converted and resized by the image processor."
            )
    else:
        if channels not in (1, 3):
            raise ValueError(f"Only 1- or 3-channel models take PIL images; this one has num_channels={channels}.")
        if isinstance(images, (list, tuple)):
            items = list(images)
        else:
            items = [images]
        if not items:
            raise ValueError("No images given.")
        mode = "L" if channels == 1 else "RGB"
        pil_images = [_to_pil(image, mode) for image in items]
        if processor is None:
            from ..models.image_processing_vit_plus import ViTPlusImageProcessor

            processor = ViTPlusImageProcessor.from_model_config(config)
        pixel_values = processor(images=pil_images, return_tensors="pt")["pixel_values"]
        if tuple(pixel_values.shape[1:]) != (channels, height, width):
            raise ValueError(
                f"The image processor produced pixel values of shape {tuple(pixel_values.shape[1:])}, the model "
                f"expects ({channels}, {height}, {width}): the processor does not match the checkpoint."
            )
    pixel_values = pixel_values.float()
    flat = pixel_values.flatten(1)
    low = flat.amin(dim=1).view(-1, 1, 1, 1)
    high = flat.amax(dim=1).view(-1, 1, 1, 1)
    display = (pixel_values - low) / (high - low).clamp_min(1e-8)
    return pixel_values, display.permute(0, 2, 3, 1)  # (B, H, W, C)


def _has_all_weights(attentions) -> bool:
    return attentions is not None and len(attentions) > 0 and all(a is not None for a in attentions)


def collect_attentions(model: nn.Module, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Run `model` on `pixel_values` and return its attention probabilities.

    Fused kernels (sdpa, flash, flex) return no weights: a model that gives none is switched to the eager kernel
    for this call (logged) and switched back afterwards.

    Args:
        model: a ViT-family model that can return `attentions`.
        pixel_values: (B, C, H, W) at the model's resolution.

    Returns:
        One (B, H, T, T) tensor per layer, first layer first.

    Raises:
        ValueError: the model returns no attention weights even with the eager kernel.
    """
    parameter = next(model.parameters(), None)
    if parameter is not None:
        pixel_values = pixel_values.to(device=parameter.device, dtype=parameter.dtype)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outputs = model(pixel_values=pixel_values, output_attentions=True)
        attentions = getattr(outputs, "attentions", None)
        config = getattr(model, "config", None)
        implementation = getattr(config, "_attn_implementation", None)
        switchable = hasattr(model, "set_attn_implementation") and implementation != "eager"
        if not _has_all_weights(attentions) and switchable:
            logger.info(
                "%s runs the %r attention kernel, which returns no attention weights; using the eager kernel for "
                "the analysis.",
                type(model).__name__,
                implementation,
            )
            model.set_attn_implementation("eager")
            try:
                with torch.no_grad():
                    outputs = model(pixel_values=pixel_values, output_attentions=True)
            finally:
                if implementation is not None:
                    model.set_attn_implementation(implementation)
            attentions = getattr(outputs, "attentions", None)
    finally:
        model.train(was_training)
    if not _has_all_weights(attentions):
        model_type = getattr(getattr(model, "config", None), "model_type", "unknown")
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}) returned no attention weights with "
            "output_attentions=True, even with the eager kernel; the attention figures need a model whose forward "
            "returns `attentions`."
        )
    return tuple(a.detach() for a in attentions)


__all__ = [
    "HEAD_FUSIONS",
    "attention_rollout",
    "class_token_attention",
    "class_token_rollout",
    "collect_attentions",
    "grid_shape",
    "mean_attention_distance",
    "patch_distances",
    "prefix_attention_fraction",
    "prepare_images",
]
