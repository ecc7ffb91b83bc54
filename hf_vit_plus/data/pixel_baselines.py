"""Floors for an image model's bits per dim, measured on the same split as the model.

An autoregressive image model's score is the negative log-likelihood of the test images per dimension (sub-pixel),
in bits (the Sparse Transformer paper's bits/dim). Two models that need no training bound it from above:

- uniform: every 8-bit value equally likely, log2(256) = 8 bits/dim whatever the images;
- each pixel's own histogram: the values of each dimension (row, column, channel) counted over the training images,
  with add-one (Laplace) smoothing so that no test value has probability 0, and the test images scored under these
  independent per-dimension distributions. It knows where ink usually is, but nothing of how pixels go together.

A model that does not beat the histogram has learnt nothing about the dependencies between pixels.

    from hf_vit_plus.data.pixel_baselines import pixel_floors

    floors = pixel_floors(train_images, test_images)  # uint8 arrays (N, H, W) or (N, C, H, W)
    # {"uniform_bits_per_dim": 8.0, "pixel_histogram_bits_per_dim": ...}
"""

from __future__ import annotations

import math

import numpy as np

from ..models.configuration_sparse_transformer import PIXEL_LEVELS  # 8-bit intensities 0..255


def uniform_bits_per_dim(levels: int = PIXEL_LEVELS) -> float:
    """Bits per dim of the uniform distribution over `levels` values: log2(levels) (8.0 for 8-bit images)."""
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 2:
        raise ValueError(f"`levels` must be an integer >= 2, got {levels!r}.")
    return math.log2(levels)


def _as_images(name: str, images, levels: int) -> np.ndarray:
    """`images` as an int64 array (N, dims): one row per image, its values flattened in raster order."""
    array = np.asarray(images)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"`{name}` must hold integer pixel values 0..{levels - 1}, got dtype {array.dtype}.")
    if array.ndim < 2 or array.shape[0] == 0 or array[0].size == 0:
        raise ValueError(f"`{name}` must be a non-empty batch of images (N, ...), got shape {array.shape}.")
    flat = array.reshape(array.shape[0], -1).astype(np.int64)
    low, high = int(flat.min()), int(flat.max())
    if low < 0 or high >= levels:
        raise ValueError(f"`{name}` values must lie in 0..{levels - 1}, got values from {low} to {high}.")
    return flat


def pixel_histogram_bits_per_dim(train, test, *, levels: int = PIXEL_LEVELS, smoothing: float = 1.0) -> float:
    """Bits per dim of the `test` images under each dimension's own histogram of the `train` images.

    Args:
        train, test: integer images of one shape, (N, H, W) or (N, C, H, W) (any (N, ...) works: each of the
            trailing positions is one dimension), values 0..levels-1.
        levels: the number of values a dimension takes (256 for 8-bit images).
        smoothing: the pseudo-count added to every value of every dimension (1: add-one / Laplace smoothing), so a
            value never seen in training still has a probability > 0.

    Returns:
        The mean over test images and dimensions of -log2 p_d(x_d), with
        p_d(v) = (count of v at dimension d in train + smoothing) / (N_train + levels * smoothing).
    """
    uniform_bits_per_dim(levels)  # checks `levels`
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not smoothing > 0:
        raise ValueError(f"`smoothing` must be a positive number, got {smoothing!r}.")
    train_flat, test_flat = _as_images("train", train, levels), _as_images("test", test, levels)
    if np.asarray(train).shape[1:] != np.asarray(test).shape[1:]:
        raise ValueError(
            f"`train` and `test` images must have the same shape, got {np.asarray(train).shape[1:]} and "
            f"{np.asarray(test).shape[1:]}."
        )
    dims = train_flat.shape[1]
    # counts[d, v]: how often dimension d holds value v in the training images (one bincount over d * levels + v)
    counts = np.bincount((np.arange(dims) * levels + train_flat).ravel(), minlength=dims * levels)
    counts = counts.reshape(dims, levels) + float(smoothing)
    log_probs = np.log2(counts) - np.log2(counts.sum(axis=1, keepdims=True))  # (dims, levels)
    return float(-log_probs[np.arange(dims), test_flat].mean())


def pixel_floors(train, test, *, levels: int = PIXEL_LEVELS) -> dict[str, float]:
    """Both floors of the `test` images: {"uniform_bits_per_dim": 8.0, "pixel_histogram_bits_per_dim": ...} (the
    histogram fitted on `train` with add-one smoothing, see `pixel_histogram_bits_per_dim`)."""
    return {
        "uniform_bits_per_dim": uniform_bits_per_dim(levels),
        "pixel_histogram_bits_per_dim": pixel_histogram_bits_per_dim(train, test, levels=levels),
    }


__all__ = ["PIXEL_LEVELS", "pixel_floors", "pixel_histogram_bits_per_dim", "uniform_bits_per_dim"]
