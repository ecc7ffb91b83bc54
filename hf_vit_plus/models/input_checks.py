"""Checks of the token-model inputs (seq2seq Transformer, Sparse Transformer LM): each raises a `ValueError` (or a
`TypeError` for a wrong type) naming the argument, the offending value or shape and what was expected, instead of
an `IndexError` or a shape error from deep inside an embedding or a kernel.

The shape and dtype checks read only metadata. The range check of token ids reads the values: one min/max reduction
per tensor (one host sync), and it is skipped while `torch.compile` / `torch.export` trace the forward pass, where a
data-dependent branch would be a graph break (an error under `fullgraph=True`).
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # the label of positions without a loss (cross-entropy's `ignore_index`)
_TOKEN_DTYPES = (torch.int64, torch.int32)  # the index dtypes nn.Embedding accepts


def tracing() -> bool:
    """True while torch.compile or torch.export trace the forward pass (checks that read values are skipped)."""
    return torch.compiler.is_compiling()


def check_token_ids(name: str, ids, vocab_size: int, ignore_index: int | None = None) -> None:
    """`ids` must be an int64/int32 tensor of shape (batch, seq_len), neither dimension empty, with every value in
    [0, vocab_size) (values equal to `ignore_index`, the -100 of labels, excepted)."""
    if not torch.is_tensor(ids):
        raise TypeError(f"`{name}` must be a torch.Tensor of token ids (batch, seq_len), got {type(ids).__name__}.")
    if ids.dtype not in _TOKEN_DTYPES:
        raise TypeError(
            f"`{name}` must hold integer token ids (torch.int64 or torch.int32), got dtype {ids.dtype} "
            f"(shape {tuple(ids.shape)})."
        )
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch, seq_len), got shape {tuple(ids.shape)}.")
    check_not_empty(name, tuple(ids.shape))
    check_token_range(name, ids, vocab_size, ignore_index)


def check_not_empty(name: str, shape: tuple[int, ...]) -> None:
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"`{name}` is empty: shape {shape}; a batch needs at least one sequence of one token.")


def check_token_range(name: str, ids: torch.Tensor, vocab_size: int, ignore_index: int | None = None) -> None:
    """Every value of `ids` in [0, vocab_size), `ignore_index` excepted; skipped under torch.compile / export."""
    if tracing():
        # A check on the values needs them on the host: under torch.compile(fullgraph=True) that is an error, and
        # otherwise a graph break. Compiled code gets no check (an out-of-range id then fails in the embedding).
        return
    values = ids if ignore_index is None else ids.masked_fill(ids == ignore_index, 0)
    low, high = (int(v) for v in torch.aminmax(values))  # one reduction, one host sync
    if low >= 0 and high < vocab_size:
        return
    bad = (values < 0) | (values >= vocab_size)
    positions = bad.nonzero()
    batch, index = (int(i) for i in positions[0])
    value = int(ids[batch, index])
    more = f" ({len(positions) - 1} more out of range)" if len(positions) > 1 else ""
    allowed = f"[0, vocab_size={vocab_size})"
    if ignore_index is not None:
        allowed += f" or {ignore_index} (ignored)"
    raise ValueError(
        f"`{name}` holds the token id {value} at position (batch={batch}, index={index}){more}: token ids must be in "
        f"{allowed}."
    )


def check_mask_shape(
    mask_name: str, mask, batch_size: int, key_length: int, what: str, query_length: int | None = None
) -> None:
    """A padding mask (1 = real token, 0 = padding) of shape (batch_size, key_length). With `query_length`, a 4-D
    mask (batch_size, 1 or heads, query_length, >= key_length) is accepted too: `generate` with a static cache builds
    one as long as the cache's buffer. `what` says where the shape comes from, e.g. "`input_ids` of shape (2, 7)"."""
    if not torch.is_tensor(mask):
        raise TypeError(f"`{mask_name}` must be a torch.Tensor, got {type(mask).__name__}.")
    shape = tuple(mask.shape)
    if shape == (batch_size, key_length):
        return
    if query_length is not None and mask.dim() == 4:
        if shape[0] == batch_size and shape[2] == query_length and shape[3] >= key_length:
            return
    expected = f"a padding mask of shape {(batch_size, key_length)}"
    if query_length is not None:
        expected += f" or a 4-D mask of shape ({batch_size}, 1 or heads, {query_length}, >= {key_length})"
    raise ValueError(f"`{mask_name}` has shape {shape} but {what} needs {expected} (1 = real token, 0 = padding).")
