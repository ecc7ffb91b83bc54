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


def check_token_ids(
    name: str, ids, vocab_size: int, ignore_index: int | None = None, alongside: dict | None = None
) -> None:
    """`ids` must be an int64/int32 tensor of shape (batch, seq_len), neither dimension empty, with every value in
    [0, vocab_size) (values equal to `ignore_index`, the -100 of labels, excepted). `alongside`: the other per-token
    inputs given with them (name -> tensor or None), whose lengths an error about empty `ids` names too."""
    if not torch.is_tensor(ids):
        raise TypeError(f"`{name}` must be a torch.Tensor of token ids (batch, seq_len), got {type(ids).__name__}.")
    if ids.dtype not in _TOKEN_DTYPES:
        raise TypeError(
            f"`{name}` must hold integer token ids (torch.int64 or torch.int32), got dtype {ids.dtype} "
            f"(shape {tuple(ids.shape)})."
        )
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch, seq_len), got shape {tuple(ids.shape)}.")
    check_not_empty(name, tuple(ids.shape), alongside)
    check_token_range(name, ids, vocab_size, ignore_index)


def label_tensor(name: str, labels):
    """`labels` as a tensor: a tensor as it is, a list or tuple of numbers (or a NumPy array) through
    `torch.as_tensor`, as transformers' pipelines and scripts pass them; None stays None. Anything else is a
    `TypeError` naming it.

    Args:
        name: the argument's name, for the message ("labels").
        labels: the value given.

    Returns:
        A tensor, or None.
    """
    if labels is None or torch.is_tensor(labels):
        return labels
    if isinstance(labels, (list, tuple)) or type(labels).__module__ == "numpy":
        try:
            return torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(
                f"`{name}` must be a tensor, or a list of numbers that makes one: {labels!r:.80} does not ({error})."
            ) from None
    raise TypeError(f"`{name}` must be a torch.Tensor (or a list of numbers), got {type(labels).__name__}.")


def check_not_empty(name: str, shape: tuple[int, ...], alongside: dict | None = None) -> None:
    """A `ValueError` naming the batch size and the length when either is 0, and the lengths of the per-token inputs
    given with it (`alongside`: name -> tensor or None), so that a mismatch among them reads as one."""
    if shape[0] != 0 and shape[1] != 0:
        return
    others = [
        f"`{other}` has {tensor.shape[-1]} per row (shape {tuple(tensor.shape)})"
        for other, tensor in (alongside or {}).items()
        if torch.is_tensor(tensor) and tensor.dim() >= 2
    ]
    given = f"; {', '.join(others)}" if others else ""
    raise ValueError(
        f"`{name}` is empty: shape {shape}, {shape[0]} sequences of {shape[1]} tokens{given}; a batch needs at "
        "least one sequence of one token."
    )


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


def check_position_ids(position_ids, batch_size: int, seq_len: int) -> None:
    """`position_ids` must be an integer tensor of shape (batch, seq_len) or (1, seq_len), every value >= 0 (the
    upper bound, `max_position_embeddings`, is the model's own check)."""
    if not torch.is_tensor(position_ids):
        raise TypeError(f"`position_ids` must be a torch.Tensor, got {type(position_ids).__name__}.")
    if position_ids.dtype not in _TOKEN_DTYPES:
        raise TypeError(
            f"`position_ids` must hold integer positions (torch.int64 or torch.int32), got dtype {position_ids.dtype}."
        )
    if position_ids.dim() != 2 or position_ids.shape[1] != seq_len or position_ids.shape[0] not in (1, batch_size):
        raise ValueError(
            f"`position_ids` must have shape ({batch_size}, {seq_len}) or (1, {seq_len}), one position per input "
            f"token, got {tuple(position_ids.shape)}."
        )
    if not tracing() and position_ids.numel() and int(position_ids.min()) < 0:
        raise ValueError(f"`position_ids` must be >= 0, got {int(position_ids.min())}.")


# The integer settings of `generate` and their least value, and the positive real ones.
_GENERATE_INTS = {
    "num_beams": 1,
    "num_return_sequences": 1,
    "max_new_tokens": 1,
    "max_length": 1,
    "min_new_tokens": 0,
    "min_length": 0,
    "top_k": 0,
    "no_repeat_ngram_size": 0,
    "num_beam_groups": 1,
}
_GENERATE_POSITIVE = ("temperature", "repetition_penalty")  # fmt: skip
_GENERATE_FLOATS = ("temperature", "repetition_penalty", "top_p", "length_penalty")


def check_generate_arguments(inputs, kwargs: dict, generation_config, config) -> None:
    """The arguments of `generate` that transformers uses unchecked (num_beams=0 divided by zero, num_beams=-1 made
    a negative dimension, max_new_tokens="2" compared a string, a list as input_ids had no shape, a length beyond
    the model's positions failed after the work, an enormous num_beams or length asked for terabytes): a
    `TypeError` or `ValueError` naming the argument, before any work. A value given to `generate` wins over the
    generation config's. Integer values of the real-valued settings (`repetition_penalty=2`) become floats in
    `kwargs`, which transformers requires."""
    ids = inputs if inputs is not None else kwargs.get("input_ids")
    if ids is not None and not torch.is_tensor(ids):
        raise TypeError(
            f"`input_ids` of `generate` must be a torch.Tensor (batch, seq_len), got {type(ids).__name__}; a "
            "tokenizer gives one with return_tensors='pt'."
        )
    if ids is not None and ids.dim() != 2:
        raise ValueError(
            f"`input_ids` of `generate` must have shape (batch, seq_len), got shape {tuple(ids.shape)}; a tokenizer "
            "gives one with return_tensors='pt'."
        )
    if ids is not None and 0 in ids.shape:
        raise ValueError(
            f"`input_ids` of `generate` is empty: shape {tuple(ids.shape)}, {ids.shape[0]} prompts of {ids.shape[1]} "
            "tokens; give each prompt at least one token (a decoder-only model can start from its bos token), or "
            "no input_ids."
        )
    for name in _GENERATE_FLOATS:
        value = kwargs.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            kwargs[name] = float(value)
    for name, least in _GENERATE_INTS.items():
        value = kwargs[name] if name in kwargs else getattr(generation_config, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"`{name}` of `generate` must be an integer >= {least}, got {value!r}.")
        if value < least:
            raise ValueError(f"`{name}` of `generate` must be an integer >= {least}, got {value!r}.")
    for name in _GENERATE_POSITIVE:
        value = kwargs[name] if name in kwargs else getattr(generation_config, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"`{name}` of `generate` must be a finite positive number, got {value!r}.")
    top_p = kwargs["top_p"] if "top_p" in kwargs else getattr(generation_config, "top_p", None)
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"`top_p` of `generate` must be a number in (0, 1], got {top_p!r}.")
    _check_generate_sizes(ids, kwargs, generation_config, config)


def _check_generate_sizes(ids, kwargs: dict, generation_config, config) -> None:
    """Beams within the vocabulary, and the longest output within the model's positions."""

    def setting(name):
        return kwargs[name] if name in kwargs else getattr(generation_config, name, None)

    vocab_size = getattr(config, "vocab_size", None)
    num_beams = setting("num_beams") or 1
    if vocab_size and num_beams > vocab_size:
        raise ValueError(f"`num_beams` of `generate` ({num_beams}) is more than the vocabulary ({vocab_size} tokens).")
    max_positions = getattr(config, "max_position_embeddings", None)
    if not max_positions or ids is None or not torch.is_tensor(ids) or ids.dim() != 2:
        return
    # The length asked for here (transformers' default max_length is not the user's request). A decoder-only model
    # reads the prompt and every new token but the last; an encoder-decoder's decoder its start token and the same.
    start = 1 if getattr(config, "is_encoder_decoder", False) else ids.shape[1]
    if kwargs.get("max_new_tokens") is not None:
        name, total = "max_new_tokens", start + kwargs["max_new_tokens"]
    elif kwargs.get("max_length") is not None:
        name, total = "max_length", kwargs["max_length"]
    else:
        return
    if total - 1 > max_positions:
        prompt = "" if start == 1 else f" after a prompt of {start} tokens"
        raise ValueError(
            f"`{name}` of `generate` asks for a sequence of {total} tokens{prompt}: the model reads {total - 1} "
            f"positions, more than its max_position_embeddings ({max_positions})."
        )
