"""Where an image model's attention looks when it generates the next pixel (Child et al. 2019, Fig. 2): for one
image and one target pixel, each layer's attention of the query that predicts that pixel, drawn on the image grid.

The image models (`SparseTransformerForImageGeneration`) read the image shifted right by the start token: position
t predicts token t and holds token t - 1 (position 0 holds the start token). So the query that predicts the target
token t is position t, and its key j >= 1 is token j - 1, drawn at that token's pixel; key 0, the start token, has
no pixel and its weight is reported on its own. For a colour image the tokens are the channels of each pixel in
turn (raster order, channels interleaved); a pixel's weight is the SUM over its channels, so that per layer the map
plus the start token's weight is 1 (the target's own earlier channels land on the target pixel).

What a strided model (stride = one row of W pixels) shows follows from the shift: the query that predicts pixel
(r, c) holds pixel (r, c - 1), so its band {0 <= i - j <= l} is the W + 1 pixels before the target (the row so far
and the end of the row above) and its other part {(i - j) mod l = 0} is column c - 1 in every earlier row, the
column just left of the target's (the pixel right above the target is in the band).

The weights come from the model's `output_attentions=True`, which always runs the exact masked reference: every
layer returns a full (batch, heads, T, T) matrix with zeros outside its pattern (merged, interleaved and heads
modes alike), so the maps show exactly the keys each layer may use.
"""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..utils.extras import require

try:
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle
except ImportError:  # without the [interpret] extra: one line naming it
    require("interpret", "hf_vit_plus.interpret's figures", ("matplotlib",))
    raise

from .plots import PANEL_INCHES, _figure, _no_ticks, _save

logger = logging.getLogger(__name__)

NEXT_PIXEL_CMAP = "inferno"
NOT_GENERATED = (0.55, 0.75, 0.95, 0.9)  # RGBA of the pixels not generated yet (light blue, nearly opaque)
TARGET_COLOUR = "#00e5ff"


@dataclass
class NextPixelAttention:
    """The attention of the query that predicts one pixel.

    Attributes:
        maps: (layers, H, W) head-averaged weights on each earlier pixel (channels summed); zero at and after the
            target (at the target itself only its earlier channels, for colour).
        start_weights: (layers,) head-averaged weight on the start token; `maps[l].sum() + start_weights[l] == 1`.
        head_maps: (layers, heads, H, W): `maps` per head.
        head_start_weights: (layers, heads): `start_weights` per head.
        pixel: (row, col) of the target.
        channel: the target's channel.
        position: the query position (= the target's token index).
    """

    maps: torch.Tensor
    start_weights: torch.Tensor
    head_maps: torch.Tensor
    head_start_weights: torch.Tensor
    pixel: tuple[int, int]
    channel: int
    position: int

    @property
    def num_layers(self) -> int:
        """The number of layers, the first dimension of `maps`."""
        return self.maps.shape[0]


def _image_config(model: nn.Module):
    config = getattr(model, "config", None)
    if not getattr(config, "is_image_model", False) or not hasattr(model, "shifted_input_ids"):
        model_type = getattr(config, "model_type", None)
        raise ValueError(
            f"{type(model).__name__} (model_type={model_type!r}) is not an image generation model: the next-pixel "
            "attention applies to a Sparse Transformer built from `SparseTransformerConfig.for_images` and loaded as "
            "`SparseTransformerForImageGeneration` (AutoModelForCausalLM)."
        )
    return config


def _as_int_pair(name: str, value) -> tuple[int, int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"`{name}` must be (row, col), two integers, got {value!r}.")
    row, col = value
    for part in (row, col):
        if isinstance(part, bool) or not isinstance(part, (int, np.integer)):
            raise ValueError(f"`{name}` must be (row, col), two integers, got {value!r}.")
    return int(row), int(col)


def check_pixel(pixel, image_size: Sequence[int], channel: int = 0, num_channels: int = 1) -> tuple[int, int]:
    """(row, col) of `pixel`, and `channel`, checked against an image of `image_size` (height, width) with
    `num_channels`; a ValueError naming the value and the allowed range otherwise."""
    height, width = image_size
    row, col = _as_int_pair("pixel", pixel)
    if not (0 <= row < height and 0 <= col < width):
        raise ValueError(
            f"Pixel (row {row}, col {col}) is outside the {height} x {width} image: expected 0 <= row < {height} and "
            f"0 <= col < {width}."
        )
    if isinstance(channel, bool) or not isinstance(channel, (int, np.integer)) or not 0 <= channel < num_channels:
        raise ValueError(f"`channel` must be an integer in [0, {num_channels}) for this image, got {channel!r}.")
    return row, col


def _pixels_tensor(pixels) -> torch.Tensor:
    if isinstance(pixels, np.ndarray):
        pixels = torch.from_numpy(np.array(pixels))  # a copy: arrays read from PIL are not writable
    if not torch.is_tensor(pixels):
        raise TypeError(f"`pixels` must be a torch.Tensor or numpy array of intensities, got {type(pixels).__name__}.")
    return pixels


def next_pixel_attention(
    model: nn.Module, pixels: torch.Tensor | np.ndarray, pixel: tuple[int, int], channel: int = 0
) -> NextPixelAttention:
    """Each layer's attention of the query that predicts one pixel, over the earlier pixels, on the image grid.

    The weights are averaged over the heads (`head_maps` keeps them per head). Only the first `position + 1` tokens are
    run (the model is causal, so the later ones change nothing).

    Args:
        model: a `SparseTransformerForImageGeneration`.
        pixels: one image, (C, H, W) or (H, W) for a grey model, integer intensities 0..255 (uint8 or int64), of the
            model's `image_size`.
        pixel: (row, col) of the target pixel.
        channel: the target's channel, for a colour image.

    Returns:
        The attention maps and start-token weights of every layer.

    Raises:
        ValueError: a model that is not an image model, an image of the wrong shape, or a pixel / channel outside the
            image.
        TypeError: `pixels` is neither a tensor nor a numpy array.
    """
    config = _image_config(model)
    height, width = config.image_size
    channels = config.num_channels
    row, col = check_pixel(pixel, (height, width), channel, channels)
    pixels = _pixels_tensor(pixels)
    given = tuple(pixels.shape)
    if pixels.dim() == 2 and channels == 1:
        pixels = pixels.unsqueeze(0)  # (1, H, W)
    if tuple(pixels.shape) != (channels, height, width):
        expected = f"({channels}, {height}, {width})" + (f" or ({height}, {width})" if channels == 1 else "")
        raise ValueError(
            f"`pixels` must be one image of the model's size, {expected} (image_size={[height, width]}, "
            f"num_channels={channels}), got shape {given}."
        )
    tokens = model.pixels_to_tokens(pixels.unsqueeze(0))  # (1, n): checks the dtype and the values
    position = (row * width + col) * channels + channel
    input_ids = model.shifted_input_ids(tokens)[:, : position + 1]  # (1, t + 1)
    parameter = next(model.parameters(), None)
    if parameter is not None:
        input_ids = input_ids.to(parameter.device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outputs = model(input_ids=input_ids, output_attentions=True, use_cache=False, return_dict=True)
    finally:
        model.train(was_training)
    attentions = outputs.attentions
    if not attentions or any(layer is None for layer in attentions):
        raise ValueError(f"{type(model).__name__} returned no attention weights with output_attentions=True.")
    rows = torch.stack([layer[0, :, position].detach().float().cpu() for layer in attentions])  # (L, heads, t + 1)
    num_layers, num_heads = rows.shape[:2]
    # Key j >= 1 holds token j - 1; put each on its (pixel, channel) slot of the image, then sum the channels.
    per_token = torch.zeros(num_layers, num_heads, height * width * channels)
    per_token[..., :position] = rows[..., 1:]
    head_maps = per_token.view(num_layers, num_heads, height, width, channels).sum(-1)  # (L, heads, H, W)
    head_start = rows[..., 0]  # (L, heads)
    return NextPixelAttention(
        maps=head_maps.mean(1),
        start_weights=head_start.mean(1),
        head_maps=head_maps,
        head_start_weights=head_start,
        pixel=(row, col),
        channel=channel,
        position=position,
    )


def _grey_image(image) -> np.ndarray:
    """(H, W) floats in [0, 1] from a uint8 image (C, H, W) or (H, W) (colour: the channel mean)."""
    image = image.numpy() if torch.is_tensor(image) else np.asarray(image)
    if image.ndim == 3:
        image = image.mean(axis=0)
    if image.ndim != 2:
        raise ValueError(f"`image` must be (channels, height, width) or (height, width), got shape {image.shape}.")
    return image.astype(np.float64) / 255.0


def generated_mask(image_size: Sequence[int], pixel: tuple[int, int], channel: int = 0) -> np.ndarray:
    """(H, W) bool: True on the pixels generated before the target (the target too when some of its channels
    are, i.e. channel > 0)."""
    height, width = image_size
    index = np.arange(height * width).reshape(height, width)
    target = pixel[0] * width + pixel[1]
    return (index < target) | ((index == target) & (channel > 0))


def plot_next_pixel_attention(
    maps: torch.Tensor,
    image,
    pixel: tuple[int, int],
    path: str | Path,
    start_weights: torch.Tensor | None = None,
    layers: Sequence[int] | None = None,
    channel: int = 0,
    gamma: float = 0.5,
    columns: int | None = None,
    title: str | None = None,
) -> Path:
    """The Sparse Transformer's Fig. 2: one panel per layer, the layer's weights drawn in colour over the image.

    The target `pixel` is outlined in cyan, the pixels not generated yet in flat light blue. Titles "layer k" count
    from 1. Each panel is scaled to its own largest weight and raised to the power `gamma` so small weights show;
    pixels with no weight at all show the image alone; under each panel its largest weight and, given
    `start_weights`, the start token's.

    Args:
        maps: (L, H, W), the weights of each layer (`NextPixelAttention.maps`).
        image: the image drawn in grey under the weights, uint8, (C, H, W) or (H, W).
        pixel: (row, col) of the target.
        path: the PNG file to write.
        start_weights: (L,), the start token's weight per layer, printed under the panels.
        layers: 0-based indices of `maps` to draw; default: all.
        channel: the target's channel (in the caption of a colour image).
        gamma: the power the scaled weights are raised to (0.5: square root).
        columns: panels per row; default: up to 8.
        title: the figure's title.

    Returns:
        `path`.

    Raises:
        ValueError: shapes that do not fit, an empty `layers`, a `gamma` or `columns` that is not positive.
    """
    maps = torch.as_tensor(maps).detach().float().cpu()
    grey = _grey_image(image)
    if maps.dim() != 3 or tuple(maps.shape[1:]) != grey.shape:
        raise ValueError(
            f"`maps` must be (layers, height, width) on the image's {grey.shape[0]} x {grey.shape[1]} grid, got shape "
            f"{tuple(maps.shape)}."
        )
    num_layers = maps.shape[0]
    num_channels = image.shape[0] if len(image.shape) == 3 else 1
    row, col = check_pixel(pixel, grey.shape, channel, num_channels)
    if not (isinstance(gamma, (int, float)) and gamma > 0):
        raise ValueError(f"`gamma` must be a positive number, got {gamma!r}.")
    chosen = list(range(num_layers)) if layers is None else list(layers)
    if not chosen:
        raise ValueError("`layers` is empty: pick at least one layer to draw.")
    bad = [k for k in chosen if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < num_layers]
    if bad:
        raise ValueError(
            f"`layers` {bad} are not layer indices of a model with {num_layers} layers (0..{num_layers - 1})."
        )
    if start_weights is not None:
        start_weights = torch.as_tensor(start_weights).detach().float().cpu()
        if start_weights.shape != (num_layers,):
            raise ValueError(f"`start_weights` must have shape ({num_layers},), got {tuple(start_weights.shape)}.")
    columns = min(len(chosen), 8) if columns is None else columns
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise ValueError(f"`columns` must be a positive integer, got {columns!r}.")
    panel_rows = math.ceil(len(chosen) / columns)
    # About 13 characters of a 9-point title per inch of figure.
    title_lines = textwrap.wrap(title, max(16, int(13 * PANEL_INCHES * columns))) if title else []
    header = 0.2 + 0.16 * len(title_lines) if title_lines else 0.1
    footer = 0.25
    panel_height = PANEL_INCHES + 0.25 + footer
    figure = _figure(PANEL_INCHES * columns, panel_height * panel_rows + header)
    axes = figure.subplots(panel_rows, columns, squeeze=False)
    figure.subplots_adjust(
        left=0.02, right=0.98, bottom=footer / (panel_height * panel_rows + header),
        top=1 - header / (panel_height * panel_rows + header), wspace=0.08, hspace=0.25 + footer / PANEL_INCHES,
    )  # fmt: skip
    done = generated_mask(grey.shape, (row, col), channel)
    cmap = colormaps[NEXT_PIXEL_CMAP]
    for ax in axes.flat[len(chosen) :]:
        ax.set_axis_off()
    for ax, layer in zip(axes.flat, chosen):
        weights = maps[layer].numpy()
        top = float(weights.max())
        scaled = (weights / top) ** gamma if top > 0 else np.zeros_like(weights)
        overlay = cmap(scaled)  # (H, W, 4)
        overlay[..., 3] = np.where(weights > 0, 0.35 + 0.65 * scaled, 0.0)
        overlay[~done] = NOT_GENERATED
        ax.imshow(0.6 * grey, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.imshow(overlay, interpolation="nearest")
        ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor=TARGET_COLOUR, linewidth=1.5))
        ax.set_title(f"layer {layer + 1}", fontsize=8)
        caption = f"max {top:.3f}"
        if start_weights is not None:
            caption += f", start {float(start_weights[layer]):.3f}"
        ax.set_xlabel(caption, fontsize=7)
        _no_ticks(ax)
    if title_lines:
        figure.suptitle("\n".join(title_lines), fontsize=9)
    return _save(figure, path)


__all__ = ["NextPixelAttention", "check_pixel", "generated_mask", "next_pixel_attention", "plot_next_pixel_attention"]
