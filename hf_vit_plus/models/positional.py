"""Position encodings shared by the model families."""

from __future__ import annotations

import math

import torch
from torch import nn


def resample_patch_position_embeddings(
    position_embeddings: torch.Tensor,
    old_grid: tuple[int, int],
    new_grid: tuple[int, int],
    num_prefix_tokens: int = 1,
    mode: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Resample learned ViT position embeddings (1, prefix + H*W, D) to a new patch grid by 2-D interpolation
    (Dosovitskiy et al., sec. 3.2); the class token's embedding is kept as is.

    `antialias=True`: bicubic with antialiasing (so downsampling does not alias), as timm's `resample_abs_pos_embed`.
    `antialias=False`: plain bicubic, as transformers' ViT `interpolate_pos_encoding`. The two differ even when
    upsampling: torch's antialiased kernel is PIL's (cubic coefficient -0.5, edge taps renormalised), the plain one
    uses -0.75 and clamps at the edges.
    """
    if tuple(old_grid) == tuple(new_grid):
        return position_embeddings
    prefix = position_embeddings[:, :num_prefix_tokens]
    grid = position_embeddings[:, num_prefix_tokens:]
    dim = grid.shape[-1]
    if grid.shape[1] != old_grid[0] * old_grid[1]:
        raise ValueError(
            f"Position embeddings hold {grid.shape[1]} patch positions, which is not a "
            f"{old_grid[0]}x{old_grid[1]} grid."
        )
    orig_dtype = grid.dtype
    grid = grid.reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2).float()  # (1, D, H, W)
    grid = nn.functional.interpolate(grid, size=tuple(new_grid), mode=mode, align_corners=False, antialias=antialias)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim).to(orig_dtype)  # (1, H'*W', D)
    return torch.cat((prefix, grid), dim=1)


def sinusoidal_position_table(num_positions: int, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (Vaswani et al., sec. 3.5).

    Returns (num_positions, dim); interleaved sin/cos as in the paper.
    """
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))  # (d/2,)
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term[: dim // 2])
    return table.to(dtype)
