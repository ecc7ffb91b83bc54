"""Which keys each query sees under a sparse attention pattern (Child et al. 2019, sec. 4.2, Fig. 3), split into the
pattern's parts so a figure can colour them apart.

Every kind registered in `hf_vit_plus.models.sparse_layouts` (`PATTERNS`) is drawn from the model's own
`SparsePattern` (`PatternPart.defined`: the paper's parts, which may overlap; a figure shows the overlap); their
union is the merged mask the attention kernels use. "dense" is one part, every (earlier) key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..models.sparse_layouts import ATTENTION_TYPES, PATTERNS, SparsePattern, build_pattern
from ..models.sparse_layouts import PART_NAMES as SPARSE_PART_NAMES
from ..models.sparse_layouts import pattern_from_config as model_pattern_from_config

logger = logging.getLogger(__name__)

PATTERN_KINDS = ATTENTION_TYPES  # "dense" and the sparse kinds
PART_NAMES: dict[str, tuple[str, ...]] = {"dense": ("all",), **SPARSE_PART_NAMES}


@dataclass
class AttentionPattern:
    """A pattern over `length` positions as boolean (length, length) masks, one per part.

    True in a mask means that query row i attends to key column j. Built by `attention_pattern` or
    `pattern_from_config`.

    Attributes:
        kind: "dense" or a registered sparse kind ("strided", "fixed", ...).
        length: the number of positions.
        stride: l, the pattern's length (stride, block length or window); None for dense.
        summary_size: the kind's second setting where it reads one (the fixed pattern's c); None otherwise.
        summary_block: which summary sub-block the fixed pattern uses (a model's head h uses h mod its count).
        causal: whether a query attends only to itself and earlier keys.
        parts: part name -> (length, length) bool mask, one per part of the pattern.
        mode: how a network combines the parts ("merged", "interleaved", "heads"), recorded for the caption.
    """

    kind: str
    length: int
    stride: int | None
    summary_size: int | None
    summary_block: int
    causal: bool
    parts: dict[str, torch.Tensor]
    mode: str | None = None

    @property
    def mask(self) -> torch.Tensor:
        """The union of the parts: what a merged head attends to, (length, length) bool."""
        union = torch.zeros(self.length, self.length, dtype=torch.bool)
        for part in self.parts.values():
            union |= part
        return union

    def part_codes(self) -> torch.Tensor:
        """Which part attends where, as one integer matrix for the figures.

        Returns:
            (length, length) integers: 0 = not attended, k = only part k (1-based), len(parts) + 1 = several parts.
        """
        codes = torch.zeros(self.length, self.length, dtype=torch.long)
        count = torch.zeros(self.length, self.length, dtype=torch.long)
        for index, part in enumerate(self.parts.values(), start=1):
            codes[part] = index
            count += part.long()
        codes[count > 1] = len(self.parts) + 1
        return codes

    def density(self) -> float:
        """Share of the (causal) attention matrix the pattern keeps.

        Returns:
            The kept entries over the entries a dense (causal) head attends to, in [0, 1].
        """
        allowed = self.length * (self.length + 1) / 2 if self.causal else self.length**2
        return float(self.mask.sum()) / allowed

    def describe(self) -> str:
        """A one-line caption: the kind, n and the pattern's settings in the paper's symbols.

        Returns:
            The caption, e.g. "strided, n=64, l=8".
        """
        if self.kind == "dense":
            return f"dense, n={self.length}, {'causal' if self.causal else 'bidirectional'}"
        symbols = PATTERNS[self.kind].symbols
        text = f"{self.kind}, n={self.length}, {symbols['stride']}={self.stride}"
        if "summary_size" in symbols:
            text += f", {symbols['summary_size']}={self.summary_size}"
        if self.summary_block:
            text += f", block {self.summary_block}"
        text += f", {'causal' if self.causal else 'bidirectional'}"
        if self.mode and self.mode != "merged":
            text += f"\n{self.mode}: each {'layer' if self.mode == 'interleaved' else 'head'} uses one part"
        return text


def _check_int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")


def attention_pattern(
    kind: str,
    length: int,
    stride: int | None = None,
    summary_size: int | None = None,
    causal: bool = True,
    summary_block: int = 0,
    mode: str | None = None,
) -> AttentionPattern:
    """The parts of a `kind` pattern over `length` positions.

    Args:
        kind: "dense" or a registered sparse kind.
        length: the number of positions.
        stride: l, the pattern's length (stride, block length or window); required by the sparse kinds.
        summary_size: the kind's second setting where it reads one (the fixed pattern's c, the local pattern's global
            tokens); None takes the kind's figure default.
        causal: whether queries attend only to themselves and earlier keys.
        summary_block: b, which summary positions the fixed pattern uses (head h of a model uses
            b = h mod sparse_num_summary_blocks).
        mode: how a network combines the parts (merged / interleaved / heads); only recorded for the caption.

    Returns:
        The pattern with one boolean mask per part.

    Raises:
        ValueError: an unknown kind, a missing stride, or a setting the kind does not take or out of range.
    """
    if kind not in PATTERN_KINDS:
        raise ValueError(f"Unknown attention pattern kind {kind!r}: expected one of {PATTERN_KINDS}.")
    _check_int("length", length)
    if kind == "dense":
        i = torch.arange(length).unsqueeze(1)  # (n, 1) queries
        j = torch.arange(length).unsqueeze(0)  # (1, n) keys
        allowed = (j <= i) if causal else torch.ones(length, length, dtype=torch.bool)
        return AttentionPattern(kind, length, None, None, 0, causal, {"all": allowed})
    if stride is None:
        raise ValueError(f"The {kind!r} pattern needs a stride (block length) l.")
    _check_int("stride", stride)
    _check_int("summary_block", summary_block, minimum=0)
    settings = PATTERNS[kind].settings
    if summary_size is None:
        summary_size = PATTERNS[kind].default_settings(stride).get("summary_size", 0)
    if summary_block and "num_summary_blocks" not in settings:
        raise ValueError(f"The {kind!r} pattern has no summary blocks: `summary_block` must be 0.")
    if "num_summary_blocks" in settings and summary_size * (summary_block + 1) > stride:
        raise ValueError(
            f"Summary block {summary_block} of c={summary_size} positions does not fit in a block of l={stride}: "
            f"need c * (block + 1) = {summary_size * (summary_block + 1)} <= l."
        )
    # Head b of a pattern with b + 1 summary sub-blocks uses sub-block b.
    pattern = build_pattern(kind, stride, summary_size, summary_block + 1, causal)
    return _drawn(pattern, length, summary_block, mode)


def _drawn(pattern: SparsePattern, length: int, head: int, mode: str | None) -> AttentionPattern:
    """The parts of the model's `pattern`, as attention head `head` uses them, over `length` positions."""
    positions = torch.arange(length)
    i, j = positions[:, None], positions[None, :]  # (n, 1) queries, (1, n) keys
    parts = {part.name: part.defined(i, j, head).expand(length, length).contiguous() for part in pattern.parts()}
    settings = pattern.spec.settings
    return AttentionPattern(
        kind=pattern.kind,
        length=length,
        stride=pattern.stride,
        summary_size=pattern.summary_size if "summary_size" in settings else None,
        summary_block=head % pattern.num_summary_blocks,
        causal=pattern.causal,
        parts=parts,
        mode=mode,
    )


def model_sparse_pattern(config):
    """(`SparsePattern` or None for dense attention, pattern mode, native sequence length) of the attention the
    model built from `config` uses: the pattern comes from the models' own `pattern_from_config`, so defaults
    resolved there are the ones drawn. Raises a ValueError for a config without sparse attention support, naming
    its model type."""
    fields = getattr(config, "sparse_fields", None)
    if fields is None:
        raise ValueError(
            f"model_type={getattr(config, 'model_type', None)!r} ({type(config).__name__}) has no sparse attention: "
            "the attention-pattern figure applies to the Sparse Transformer, to ViTPlus models and to the encoder "
            "of the seq2seq Transformer."
        )
    pattern = model_pattern_from_config(config)
    mode = getattr(config, f"{fields.prefix}sparse_pattern_mode")
    return pattern, mode, getattr(config, fields.length_field)


def pattern_from_config(config, length: int | None = None, head: int = 0) -> AttentionPattern:
    """The pattern the model built from `config` uses (`model_sparse_pattern`), for one attention head.

    The Sparse Transformer is a causal language model; a ViTPlus config with a sparse `attention_type` is
    bidirectional over its prefix + N tokens, and so is the seq2seq Transformer's encoder with a sparse
    `encoder_attention_type`.

    Args:
        config: a `SparseTransformerConfig`, `ViTPlusConfig` or `Seq2SeqTransformerConfig` with a sparse attention.
        length: the number of positions; default: about l^2, at most the model's sequence length.
        head: the attention head (its summary block and, in "heads" mode, its part).

    Returns:
        The pattern of that head.

    Raises:
        ValueError: a dense model or another model type (the message names the model type).
    """
    pattern, mode, native = model_sparse_pattern(config)
    if pattern is None:
        field = f"{config.sparse_fields.prefix}attention_type"
        raise ValueError(
            f"model_type={getattr(config, 'model_type', None)!r} uses dense attention ({field}='dense'): there is no "
            f"sparse pattern to draw (draw one without a checkpoint: --kind {'|'.join(PATTERN_KINDS[1:])})."
        )
    if length is None:
        wanted = default_length(pattern.stride)
        length = min(native, wanted) if native else wanted
    return _drawn(pattern, length, head, mode)


def default_length(stride: int, limit: int = 1024) -> int:
    """A sequence length that shows a pattern of stride l as in the paper's Fig. 3: n = l^2 (l close to sqrt(n)),
    at least 4 blocks, at most about `limit` positions, a whole number of blocks."""
    blocks = min(stride, max(4, limit // stride))
    return max(4, blocks) * stride


def default_query(pattern: AttentionPattern) -> int:
    """A query whose keys show every part: near the end of a causal sequence, mid-block otherwise."""
    n, stride = pattern.length, pattern.stride or max(1, pattern.length // 4)
    if pattern.causal:
        return n - 1 - (stride // 3 if stride < n else 0)
    return min(n - 1, (n // 2 // stride) * stride + stride // 2)


__all__ = [
    "PART_NAMES",
    "PATTERN_KINDS",
    "AttentionPattern",
    "attention_pattern",
    "default_length",
    "default_query",
    "model_sparse_pattern",
    "pattern_from_config",
]
