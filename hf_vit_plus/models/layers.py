"""Layers and functions that the model families share (shipped with every checkpoint, as remote code).

They take plain numbers and tensors, not configs, so each tests alone; the modeling files keep everything that is
particular to a paper (the blocks, the embeddings, the attention modules) and call these for the common parts.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from .input_checks import IGNORE_INDEX


class FeedForward(nn.Module):
    """The position-wise feed-forward branch: Linear -> activation -> Linear (the ViT's MLP with GELU, the Sparse
    Transformer's with GELU; transformers' parameter names `fc1`, `fc2`)."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.activation_fn = ACT2FN[activation]
        self.fc2 = nn.Linear(intermediate_size, hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(hidden_states)))


def residual_sublayer(hidden_states: torch.Tensor, sublayer, norm: nn.Module, normalize_before: bool) -> torch.Tensor:
    """One sub-layer with its residual connection: LayerNorm(x + Sublayer(x)) (post-norm, Vaswani et al. sec. 3.1 and
    5.4) or x + Sublayer(LayerNorm(x)) (pre-norm). `sublayer` is a callable of the (normalised) states; dropout, if
    any, is its own. The encoder-decoder Transformer's layer and its fused decoding step compose their sub-layers
    with it."""
    residual = hidden_states
    if normalize_before:
        hidden_states = norm(hidden_states)
    hidden_states = residual + sublayer(hidden_states)
    if not normalize_before:
        hidden_states = norm(hidden_states)
    return hidden_states


# ITU-R 601-2 luma, L = 0.299 R + 0.587 G + 0.114 B: PIL's `convert("L")`, the image processor's grey conversion and
# a 1-channel ViT's reading of RGB input.
LUMA_WEIGHTS = (0.299, 0.587, 0.114)


def rgb_to_grey(pixel_values: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) -> (B, 1, H, W), the ITU-R 601-2 luma of each pixel. The weights sum to one, so on images
    normalised with the same mean and std in each channel it equals the normalised luma."""
    weights = torch.tensor(LUMA_WEIGHTS, dtype=pixel_values.dtype, device=pixel_values.device)
    return (pixel_values * weights[:, None, None]).sum(1, keepdim=True)


def split_heads(projected: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, T, H*Dh) -> (B, H, T, Dh): a projection's output as the attention kernels take it."""
    batch_size, seq_len, width = projected.shape
    return projected.view(batch_size, seq_len, num_heads, width // num_heads).transpose(1, 2)


def token_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The cross-entropy of `logits` (..., V) against `labels` (...), computed in float32, labels equal to -100
    ignored, with optional label smoothing.

    Without `num_items_in_batch`: the mean over the labelled tokens. With it (Trainer's count of labelled tokens
    over all the micro-batches of a gradient accumulation): the sum over this batch divided by it, so that the
    accumulated gradient is that of the mean over the whole batch."""
    flat_logits = logits.float().reshape(-1, logits.shape[-1])  # (N, V)
    flat_labels = labels.to(logits.device).reshape(-1)  # (N,)
    if num_items_in_batch is None:
        return nn.functional.cross_entropy(
            flat_logits, flat_labels, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing
        )
    total = nn.functional.cross_entropy(
        flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum", label_smoothing=label_smoothing
    )
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def config_flag(value: bool | None, config, name: str, default: bool = False) -> bool:
    """`value` if given, else the config's setting `name` (transformers' convention for output flags)."""
    if value is not None:
        return value
    return bool(getattr(config, name, default))


__all__ = ["FeedForward", "config_flag", "split_heads", "token_cross_entropy"]
