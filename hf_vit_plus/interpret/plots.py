"""Drawing for `hf_vit_plus.interpret`: each `plot_*` takes numbers (tensors) and writes one PNG;
`write_vit_figures` computes and draws the full set for a ViT model card.

Figures are drawn on matplotlib's Agg canvas (no display, no pyplot global state) and saved without
"tight" bounding boxes, so a figure's size in pixels is its size in inches times `DPI`.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..utils.extras import require

try:
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle
except ImportError:  # without the [interpret] extra: one line naming it
    require("interpret", "hf_vit_plus.interpret's figures", ("matplotlib",))
    raise

from .attention import (
    attention_rollout,
    class_token_attention,
    class_token_rollout,
    collect_attentions,
    mean_attention_distance,
    prefix_attention_fraction,
    prepare_images,
)
from .embeddings import patch_embedding_components, position_embedding_similarity, vit_embedding_parts
from .patterns import AttentionPattern, default_query, pattern_from_config

logger = logging.getLogger(__name__)

DPI = 100
PANEL_INCHES = 1.6  # one image panel of the attention-map figure
HEAT_CMAP = "jet"
# Fig. 3 of the Sparse Transformer paper: dark blue for the first part, light blue for the second; purple where
# a key is in both.
PART_COLOURS = ("#1f4e9c", "#7fb8e6", "#8e5bb5")
MAX_PATTERN_LENGTH = 4096  # the connectivity matrix is drawn cell by cell
BLANK = "#f2f2f2"


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, facecolor="white")
    logger.debug("Wrote %s", path)
    return path


def _show_image(ax, image: np.ndarray) -> None:
    if image.shape[-1] == 1:
        ax.imshow(image[..., 0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(image.clip(0.0, 1.0), interpolation="nearest")


def upsample_map(heat: torch.Tensor, size: tuple[int, int], scale: float | None = None) -> torch.Tensor:
    """A (rows, cols) patch map resized bilinearly to (height, width) pixels and divided by `scale` (default: the
    map's own maximum), so 1 is the top of the colour scale."""
    resized = nn.functional.interpolate(heat[None, None].float(), size=size, mode="bilinear", align_corners=False)
    resized = resized[0, 0].clamp_min(0.0)
    top = float(heat.max()) if scale is None else scale
    return resized / max(top, 1e-12)


def _overlay(ax, image: np.ndarray, heat: torch.Tensor, scale: float | None = None) -> None:
    _show_image(ax, image)
    ax.imshow(upsample_map(heat, image.shape[:2], scale).numpy(), cmap=HEAT_CMAP, alpha=0.5, vmin=0.0, vmax=1.0)


def _no_ticks(ax) -> None:
    ax.set_xticks([])
    ax.set_yticks([])


def plot_attention_maps(
    images: torch.Tensor,
    rollout_maps: torch.Tensor,
    head_maps: torch.Tensor | None,
    path: str | Path,
    row_labels: list[str] | None = None,
) -> Path:
    """One row per image: the image, its attention-rollout map, then each head's last-layer class-token attention.

    The rollout map is scaled to its maximum, the heads share one scale per image; the maps are upsampled over the
    image. The figure is PANEL_INCHES * (2 + heads) wide and PANEL_INCHES * B + 0.3 high.

    Args:
        images: (B, H, W, C) in [0, 1].
        rollout_maps: (B, rows, cols).
        head_maps: (B, heads, rows, cols), or None for no head columns.
        path: the PNG file to write.
        row_labels: one label per image, written beside its row.

    Returns:
        `path`.

    Raises:
        ValueError: the shapes do not fit together.
    """
    if images.dim() != 4 or rollout_maps.dim() != 3 or rollout_maps.shape[0] != images.shape[0]:
        raise ValueError(
            f"Expected images (B, H, W, C) and rollout maps (B, rows, cols), got {tuple(images.shape)} and "
            f"{tuple(rollout_maps.shape)}."
        )
    batch = images.shape[0]
    heads = 0 if head_maps is None else head_maps.shape[1]
    columns = 2 + heads
    figure = _figure(PANEL_INCHES * columns, PANEL_INCHES * batch + 0.3)
    axes = figure.subplots(batch, columns, squeeze=False)
    figure.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=1 - 0.3 / (PANEL_INCHES * batch + 0.3), wspace=0.08)
    for b in range(batch):
        image = images[b].numpy()
        _show_image(axes[b, 0], image)
        _overlay(axes[b, 1], image, rollout_maps[b])
        # One colour scale for all heads of an image, so a head that spreads its attention looks faint.
        head_scale = float(head_maps[b].max()) if heads else None
        for h in range(heads):
            _overlay(axes[b, 2 + h], image, head_maps[b, h], head_scale)
        if row_labels:
            axes[b, 0].set_ylabel(row_labels[b], fontsize=8)
        for ax in axes[b]:
            _no_ticks(ax)
    titles = ["input", "rollout"] + [f"last layer, head {h + 1}" for h in range(heads)]
    for ax, title in zip(axes[0], titles):
        ax.set_title(title, fontsize=8)
    return _save(figure, path)


def plot_mean_attention_distance(
    distances: torch.Tensor, path: str | Path, image_size: int | None = None, num_images: int | None = None
) -> Path:
    """ViT Fig. 7 (right): x = layer, y = mean attention distance in pixels, one point per head.

    Args:
        distances: (layers, heads), from `mean_attention_distance`.
        path: the PNG file to write.
        image_size: the image side in pixels: the top of the y axis (default: a little above the largest distance).
        num_images: how many images the distances average, for the title.

    Returns:
        `path`.

    Raises:
        ValueError: `distances` is not 2-D.
    """
    if distances.dim() != 2:
        raise ValueError(f"`distances` must be (layers, heads), got {tuple(distances.shape)}.")
    layers, heads = distances.shape
    figure = _figure(4.8, 3.6)
    ax = figure.subplots()
    x = torch.arange(1, layers + 1).float()
    colours = [f"C{h % 10}" for h in range(heads)]
    for h in range(heads):
        ax.scatter(x.numpy(), distances[:, h].numpy(), s=18, color=colours[h], label=f"head {h + 1}", alpha=0.85)
    ax.plot(x.numpy(), distances.mean(dim=1).numpy(), color="black", linewidth=1.0, label="mean over heads")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(x.numpy())
    top = image_size if image_size else float(distances.max()) * 1.1
    ax.set_ylim(0, max(top, float(distances.max()) * 1.05, 1e-6))
    ax.set_xlim(0.5, layers + 0.5)
    ax.grid(alpha=0.3)
    title = "Mean attention distance per head"
    if num_images:
        title += f" ({num_images} image{'s' if num_images != 1 else ''})"
    ax.set_title(title, fontsize=10)
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2 if heads > 6 else 1, loc="best", framealpha=0.7)
    figure.subplots_adjust(left=0.13, right=0.97, bottom=0.13, top=0.91)
    return _save(figure, path)


def _mosaic(tiles: np.ndarray, columns: int, gap: int = 1, fill: float = np.nan) -> np.ndarray:
    """Tiles (K, h, w, ...) laid out in rows of `columns`, `gap` pixels of `fill` between them."""
    count, height, width = tiles.shape[:3]
    rows = math.ceil(count / columns)
    shape = (rows * (height + gap) - gap, columns * (width + gap) - gap, *tiles.shape[3:])
    canvas = np.full(shape, fill, dtype=np.float64)
    for index in range(count):
        r, c = divmod(index, columns)
        top, left = r * (height + gap), c * (width + gap)
        canvas[top : top + height, left : left + width] = tiles[index]
    return canvas


def plot_position_similarity(similarity: torch.Tensor, path: str | Path) -> Path:
    """ViT Fig. 7 (centre): tile (r, c) shows the similarity of patch (r, c)'s position embedding with every patch's.

    All tiles share one colour scale from -1 to 1.

    Args:
        similarity: (rows, cols, rows, cols), from `position_embedding_similarity`.
        path: the PNG file to write.

    Returns:
        `path`.

    Raises:
        ValueError: `similarity` is not 4-D.
    """
    if similarity.dim() != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise ValueError(f"`similarity` must be (rows, cols, rows, cols), got {tuple(similarity.shape)}.")
    rows, cols = similarity.shape[:2]
    tiles = similarity.reshape(rows * cols, rows, cols).numpy()
    gap = max(1, rows // 7)
    canvas = _mosaic(tiles, columns=cols, gap=gap)
    figure = _figure(5.0, 4.4)
    ax = figure.add_axes((0.1, 0.1, 0.66, 0.8))
    cmap = colormaps["viridis"].with_extremes(bad="white")
    image = ax.imshow(canvas, cmap=cmap, vmin=-1.0, vmax=1.0, interpolation="nearest")
    step = max(1, rows // 8)
    ax.set_yticks([r * (rows + gap) + (rows - 1) / 2 for r in range(0, rows, step)])
    ax.set_yticklabels([str(r + 1) for r in range(0, rows, step)], fontsize=7)
    step = max(1, cols // 8)
    ax.set_xticks([c * (cols + gap) + (cols - 1) / 2 for c in range(0, cols, step)])
    ax.set_xticklabels([str(c + 1) for c in range(0, cols, step)], fontsize=7)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title("Position embedding similarity", fontsize=10)
    bar_axes = figure.add_axes((0.8, 0.1, 0.03, 0.8))
    bar = figure.colorbar(image, cax=bar_axes)
    bar.set_label("Cosine similarity")
    return _save(figure, path)


def plot_patch_components(
    components: torch.Tensor, path: str | Path, explained_variance_ratio: torch.Tensor | None = None, columns: int = 7
) -> Path:
    """ViT Fig. 7 (left): principal components of the patch-embedding filters in rows of `columns`.

    Each component is scaled to [0, 1] on its own; RGB for 3 channels, grey for 1 (other channel counts have no
    meaningful picture, so they raise).

    Args:
        components: (K, C, P, P), from `patch_embedding_components`.
        path: the PNG file to write.
        explained_variance_ratio: (K,); their sum, as a share of the variance, goes into the title.
        columns: components per row (the paper: 4 x 7).

    Returns:
        `path`.

    Raises:
        ValueError: `components` is not 4-D or has neither 1 nor 3 channels.
    """
    if components.dim() != 4:
        raise ValueError(f"`components` must be (K, channels, P, P), got {tuple(components.shape)}.")
    count, channels = components.shape[:2]
    if channels not in (1, 3):
        raise ValueError(f"Filters with {channels} channels cannot be drawn as images (1 = grey, 3 = RGB).")
    flat = components.flatten(1)
    low = flat.amin(dim=1).view(-1, 1, 1, 1)
    high = flat.amax(dim=1).view(-1, 1, 1, 1)
    scaled = ((components - low) / (high - low).clamp_min(1e-12)).permute(0, 2, 3, 1)  # (K, P, P, C)
    if channels == 1:
        scaled = scaled.expand(-1, -1, -1, 3)
    columns = min(columns, count)
    rows = math.ceil(count / columns)
    canvas = _mosaic(scaled.numpy(), columns=columns, gap=max(1, components.shape[-1] // 8), fill=1.0)
    figure = _figure(0.75 * columns + 0.4, 0.75 * rows + 0.7)
    ax = figure.add_axes((0.03, 0.03, 0.94, 1 - 0.65 / (0.75 * rows + 0.7)))
    ax.imshow(canvas, interpolation="nearest")
    _no_ticks(ax)
    for spine in ax.spines.values():
        spine.set_visible(False)
    title = f"First {count} principal components of the {components.shape[-1]}x{components.shape[-1]} patch filters"
    if explained_variance_ratio is not None:
        title += f"\n({100 * float(explained_variance_ratio.sum()):.0f}% of their variance)"
    ax.set_title(title, fontsize=8)
    return _save(figure, path)


def _sequence_grid(codes: torch.Tensor, width: int) -> np.ndarray:
    """A length-n vector laid out in rows of `width` positions; positions past n are NaN."""
    n = codes.shape[0]
    rows = math.ceil(n / width)
    grid = np.full(rows * width, np.nan)
    grid[:n] = codes.numpy()
    return grid.reshape(rows, width)


def plot_sparse_patterns(patterns: list[AttentionPattern], path: str | Path, queries: list[int] | None = None) -> Path:
    """Sparse Transformer Fig. 3: per pattern, the positions one query attends to and the full connectivity matrix.

    Top: the positions one query (black) attends to, the sequence laid out in rows of the stride l; bottom: the
    full connectivity matrix (row = query, column = key). Each part of the pattern has its own colour; keys in both
    parts are darkest.

    Args:
        patterns: the patterns to draw, one column each.
        path: the PNG file to write.
        queries: the query position drawn for each pattern; default: `default_query(pattern)`.

    Returns:
        `path`.

    Raises:
        ValueError: no patterns, or a query outside its pattern.
    """
    if not patterns:
        raise ValueError("No patterns to draw.")
    too_long = [p.length for p in patterns if p.length > MAX_PATTERN_LENGTH]
    if too_long:
        raise ValueError(
            f"Patterns of length {too_long} are too long to draw (at most {MAX_PATTERN_LENGTH}); the pattern repeats "
            "along the sequence, so draw a prefix (a shorter `length`)."
        )
    count = len(patterns)
    figure = _figure(3.2 * count, 7.0)
    axes = figure.subplots(2, count, squeeze=False)
    figure.subplots_adjust(left=0.05, right=0.97, top=0.9, bottom=0.12, hspace=0.35, wspace=0.25)
    for index, pattern in enumerate(patterns):
        names = list(pattern.parts)
        palette = [BLANK, *PART_COLOURS[: len(names)]]
        if len(names) > 1:
            palette.append(PART_COLOURS[2])
        cmap = ListedColormap(palette).with_extremes(bad="white")
        codes = pattern.part_codes().float()  # (n, n)
        query = queries[index] if queries else default_query(pattern)
        if not 0 <= query < pattern.length:
            raise ValueError(f"Query position {query} is outside the pattern's {pattern.length} positions.")
        width = pattern.stride or math.isqrt(pattern.length) or 1
        grid = _sequence_grid(codes[query], width)
        top, bottom = axes[0, index], axes[1, index]
        # A long, flat layout (few blocks of a large stride) is stretched to a square panel.
        aspect = "auto" if max(grid.shape) > 3 * min(grid.shape) else "equal"
        top.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(palette) - 0.5, interpolation="nearest", aspect=aspect)
        r, c = divmod(query, width)
        top.add_patch(_square(c, r, "black"))
        top.set_title(pattern.describe(), fontsize=8)
        top.set_xlabel(f"query {query} (black); rows of {width} positions", fontsize=7)
        _grid_lines(top, grid.shape)
        # More cells than pixels: average colours (not codes) so thin diagonals stay visible.
        smooth = pattern.length > 300
        bottom.imshow(
            codes.numpy(),
            cmap=cmap,
            vmin=-0.5,
            vmax=len(palette) - 0.5,
            interpolation="antialiased" if smooth else "nearest",
            interpolation_stage="rgba" if smooth else "data",
        )
        bottom.axhline(query, color="black", linewidth=0.6, alpha=0.6)
        bottom.set_xlabel("key position", fontsize=7)
        bottom.set_ylabel("query position", fontsize=7)
        bottom.tick_params(labelsize=6)
        scope = "causal " if pattern.causal else ""
        bottom.set_title(f"{100 * pattern.density():.1f}% of the {scope}matrix", fontsize=8)
        _no_ticks(top)
        handles = [Patch(color=colour, label=name) for colour, name in zip(PART_COLOURS, names)]
        if len(names) > 1:
            handles.append(Patch(color=PART_COLOURS[2], label="both"))
        bottom.legend(handles=handles, fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(handles))
    return _save(figure, path)


def _square(x: int, y: int, colour: str):
    return Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colour, edgecolor="none")


def _grid_lines(ax, shape: tuple[int, int]) -> None:
    rows, cols = shape
    if max(rows, cols) > 32:  # the lines would hide the cells
        return
    for r in range(rows + 1):
        ax.axhline(r - 0.5, color="white", linewidth=0.4)
    for c in range(cols + 1):
        ax.axvline(c - 0.5, color="white", linewidth=0.4)


def write_vit_figures(
    model: nn.Module,
    images,
    output_dir: str | Path,
    processor=None,
    max_images: int = 4,
    num_components: int = 28,
) -> list[Path]:
    """The interpretability figures of a ViT checkpoint, for its model card.

    The files written in `output_dir`:

    - attention_maps.png: up to `max_images` images with their rollout and last-layer class-token maps;
    - mean_attention_distance.png: ViT Fig. 7 right, over all `images`;
    - position_embedding_similarity.png: Fig. 7 centre;
    - patch_embedding_components.png: Fig. 7 left (up to `num_components` components);
    - sparse_attention_pattern.png: only when the config has a sparse `attention_type`.

    Args:
        model: a ViT-family model.
        images: the images, in any form `prepare_images` takes.
        output_dir: the folder to write the figures to.
        processor: the image processor; None: one made from the model's config.
        max_images: how many images the attention-map figure shows.
        num_components: how many principal components of the patch embedding to draw.

    Returns:
        The written PNG paths.

    Raises:
        ValueError: a model that is not a ViT, or images it cannot take.
    """
    output_dir = Path(output_dir)
    parts = vit_embedding_parts(model)  # raises a ValueError naming non-ViT models
    pixel_values, display = prepare_images(model, images, processor)
    attentions = collect_attentions(model, pixel_values)
    prefix = parts.num_prefix_tokens
    paths = []

    shown = slice(0, max_images)
    rollout = attention_rollout([a[shown] for a in attentions])
    rollout_maps = class_token_rollout(rollout, parts.grid_size, prefix)
    head_maps = class_token_attention([a[shown] for a in attentions], -1, parts.grid_size, prefix)
    paths.append(plot_attention_maps(display[shown], rollout_maps, head_maps, output_dir / "attention_maps.png"))

    distances = mean_attention_distance(attentions, parts.patch_size, parts.grid_size, prefix)
    logger.info(
        "Mean attention distance per layer (pixels): %s; share of attention on the class token: %s",
        [round(v, 1) for v in distances.mean(dim=1).tolist()],
        [round(v, 2) for v in prefix_attention_fraction(attentions, prefix).mean(dim=1).tolist()],
    )
    image_size = parts.grid_size[0] * parts.patch_size
    paths.append(
        plot_mean_attention_distance(
            distances, output_dir / "mean_attention_distance.png", image_size, num_images=pixel_values.shape[0]
        )
    )

    similarity = position_embedding_similarity(parts.position_embeddings, parts.grid_size, prefix)
    paths.append(plot_position_similarity(similarity, output_dir / "position_embedding_similarity.png"))

    if parts.stem is not None:
        logger.info("Skipping the patch-filter figure: a hybrid ViT's projection reads its stem, not pixels.")
    elif parts.projection.weight.shape[1] in (1, 3):
        pca = patch_embedding_components(parts.projection.weight, num_components)
        paths.append(
            plot_patch_components(
                pca.components, output_dir / "patch_embedding_components.png", pca.explained_variance_ratio
            )
        )
    else:
        logger.info("Skipping the patch-filter figure: %d input channels.", parts.projection.weight.shape[1])

    if getattr(model.config, "attention_type", "dense") not in (None, "dense"):
        pattern = pattern_from_config(model.config)
        paths.append(plot_sparse_patterns([pattern], output_dir / "sparse_attention_pattern.png"))
    return paths


__all__ = [
    "DPI",
    "PANEL_INCHES",
    "plot_attention_maps",
    "plot_mean_attention_distance",
    "plot_patch_components",
    "plot_position_similarity",
    "plot_sparse_patterns",
    "upsample_map",
    "write_vit_figures",
]
