"""Attention kernels shared by every model family, and the rule that picks one.

`eager_attention_forward` (in `attention_reference.py`, re-exported here) is the one reference implementation
(Vaswani et al. 2017, eq. 1: softmax(QK^T / sqrt(d_k)) V) that every fast kernel (sdpa, flex, the block-sparse
kernels) is tested against. Kernels follow transformers' attention-interface signature so that
`config._attn_implementation` picks them; `select_attention_kernel` says which one an attention layer runs.

The Sparse Transformer kernels live in `sparse_attention.py` (700 lines a dense model never needs). Their names are
registered here, with both of transformers' interfaces, whenever a model's code is imported (so that
`from_pretrained(..., attn_implementation="sparse_block")` is accepted), as thin shims that import
`sparse_attention.py` on their first call. `sparse_attention.py` imports only `attention_reference.py`, so the lazy
import is no cycle.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .attention_reference import eager_attention_forward, flex_attention_refusal, sparse_padding_mask

# The Sparse Transformer kernels of `sparse_attention.py`: the dense masked reference (returns the weights), the
# exact O(n sqrt(n)) CPU kernel and flex_attention (trains on GPU).
SPARSE_KERNEL_NAMES = ("sparse_dense", "sparse_block", "sparse_flex")
# Up to this many keys, dense attention on the CPU runs the reference (matmul-softmax-matmul) instead of sdpa: sdpa's
# CPU kernel (flash attention, blocked for long sequences) trains a ViT's short sequences (17 tokens for
# Fashion-MNIST's 7 x 7 patches) slower, and wins from about 150 keys (`scripts/benchmarks/bench_vit.py
# --attention_lengths` prints the table; results/vit_cpu_attention_lengths.csv holds the rows).
SHORT_CPU_SEQUENCE = 128


def select_attention_kernel(
    requested: str | None,
    pattern,
    device_type: str,
    output_attentions: bool,
    query_length: int | None = None,
    key_length: int | None = None,
    head_dim: int | None = None,
) -> str:
    """The name of the kernel an attention layer runs (look it up with `ALL_ATTENTION_FUNCTIONS.get_interface`).

    requested: `config._attn_implementation` (None: the eager reference); pattern: the layer's `SparsePattern`, or
    None for dense attention; device_type: of the inputs ("cpu", "cuda", ...); output_attentions: whether the
    caller wants the attention probabilities, which only the reference kernels return; query_length / key_length:
    the number of queries / keys per row, when known; head_dim: the dimensions per head, when known.

    - dense attention: "eager" when the probabilities are asked for; "sdpa" when a sparse kernel is requested
      (those need a pattern); "eager" instead of "sdpa" for one query per row (a decoding step) traced by
      torch.compile on CPU: inductor fuses the reference's matmul-softmax-matmul, while sdpa's CPU kernel, made for
      long queries, stays an opaque call that costs several times more for one query (about 15% of a compiled beam
      search step at 64 rows); "eager" instead of "sdpa" on the CPU for several queries over at most
      `SHORT_CPU_SEQUENCE` keys (a small image's tokens), where sdpa's CPU kernel is up to 4x slower; otherwise the
      requested kernel.
    - sparse attention: "sparse_dense" (the masked reference) when the probabilities are asked for; the requested
      sparse kernel; otherwise the fast one for the device: "sparse_flex" on CUDA (flex_attention trains there),
      unless its GPU kernels refuse the head size (`flex_attention_refusal`: under 16 dimensions), "sparse_block"
      elsewhere (forward and backward on CPU).
    """
    if pattern is None:
        if output_attentions or requested is None:
            return "eager"
        kernel = "sdpa" if requested in SPARSE_KERNEL_NAMES else requested
        if kernel == "sdpa" and device_type == "cpu":
            if query_length == 1 and torch.compiler.is_compiling():
                return "eager"
            if (query_length or 0) > 1 and key_length is not None and key_length <= SHORT_CPU_SEQUENCE:
                return "eager"
        return kernel
    if output_attentions:
        return "sparse_dense"
    if requested in SPARSE_KERNEL_NAMES:
        return requested
    if device_type == "cuda" and (head_dim is None or flex_attention_refusal(device_type, head_dim, True) is None):
        return "sparse_flex"
    return "sparse_block"


def _lazy_sparse_kernel(name: str) -> Callable:
    def kernel(module, query, key, value, attention_mask, **kwargs):
        from .sparse_attention import SPARSE_KERNELS

        return SPARSE_KERNELS[name](module, query, key, value, attention_mask, **kwargs)

    kernel.__name__ = kernel.__qualname__ = f"{name}_attention_forward"
    kernel.__doc__ = f"The {name!r} kernel of `sparse_attention.py`, imported on the first call."
    return kernel


SPARSE_KERNEL_SHIMS = {name: _lazy_sparse_kernel(name) for name in SPARSE_KERNEL_NAMES}
for _name, _shim in SPARSE_KERNEL_SHIMS.items():
    AttentionInterface.register(_name, _shim)
    AttentionMaskInterface.register(_name, sparse_padding_mask)


__all__ = [
    "SHORT_CPU_SEQUENCE",
    "SPARSE_KERNEL_NAMES",
    "SPARSE_KERNEL_SHIMS",
    "eager_attention_forward",
    "select_attention_kernel",
    "sparse_padding_mask",
]
