"""Attention kernels shared by every model family.

`eager_attention_forward` is the one reference implementation (Vaswani et al. 2017, eq. 1:
softmax(QK^T / sqrt(d_k)) V) that every fast kernel (sdpa, flex, the block-sparse kernels) is tested against.
Kernels follow transformers' attention-interface signature so that `config._attn_implementation` picks them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


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


def get_attention_function(attn_implementation: str | None) -> Callable:
    """The kernel registered under `attn_implementation`, falling back to the eager reference.

    Modeling files call `ALL_ATTENTION_FUNCTIONS.get_interface(...)` themselves: transformers inspects their
    source for that call before it lets `set_attn_implementation` switch kernels at run time.
    """
    return ALL_ATTENTION_FUNCTIONS.get_interface(attn_implementation or "eager", eager_attention_forward)
