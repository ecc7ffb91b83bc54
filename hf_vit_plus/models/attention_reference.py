"""The dense reference attention and the padding-mask function that every attention kernel shares.

Below `attention.py` (which picks and registers kernels) and `sparse_attention.py` (the sparse kernels), which both
import from here.
"""

from __future__ import annotations

import torch
from torch import nn


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense reference attention.

    query: (B, H, Tq, D); key/value: (B, H, Tk, D); attention_mask: additive float (B or 1, 1 or H, Tq, Tk)
    or boolean (True = attend). Returns the output as (B, Tq, H, D) and the weights as (B, H, Tq, Tk).
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(-2, -1)) * scaling  # (B, H, Tq, Tk)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask[..., : key.shape[-2]]
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value)  # (B, H, Tq, D)
    return output.transpose(1, 2).contiguous(), weights


def sparse_padding_mask(
    batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
    mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs,
) -> torch.Tensor | None:  # fmt: skip
    """AttentionMaskInterface function of the sparse kernels: the 2-D boolean padding mask (B, kv_length), or None
    without padding. The pattern itself comes from the attention module (absolute positions)."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, kv_offset : kv_offset + kv_length].to(torch.bool)
    if mask.shape[-1] < kv_length:  # a mask shorter than the keys: the missing (newest) positions are real
        mask = nn.functional.pad(mask, (0, kv_length - mask.shape[-1]), value=True)
    if torch.compiler.is_compiling():  # a data-dependent branch would break the graph: keep the (all-True) mask
        return mask
    return None if bool(mask.all()) else mask


# flex_attention's GPU kernels (triton's tl.dot) take heads of at least this many dimensions; torch's inductor raises
# NotImplementedError for smaller ones, while its CPU kernel takes any size.
FLEX_MIN_HEAD_DIM = 16


def flex_attention_refusal(device_type: str, head_dim: int, needs_grad: bool) -> str | None:
    """Why flex_attention cannot run these inputs (a sentence for the log), or None when it can.

    Args:
        device_type: The inputs' device type ("cpu", "cuda", ...).
        head_dim: The query's, key's and value's last dimension.
        needs_grad: Whether a backward pass will follow.

    Returns:
        None where flex_attention runs, else the reason: no backward on the CPU, or heads under `FLEX_MIN_HEAD_DIM`
        dimensions on a GPU.
    """
    if device_type == "cpu":
        return "flex_attention has no backward on CPU" if needs_grad else None
    if head_dim < FLEX_MIN_HEAD_DIM:
        return (
            f"flex_attention's {device_type} kernels need heads of at least {FLEX_MIN_HEAD_DIM} dimensions, "
            f"these have {head_dim}"
        )
    return None


__all__ = ["FLEX_MIN_HEAD_DIM", "eager_attention_forward", "flex_attention_refusal", "sparse_padding_mask"]
