"""Sparse Transformer attention patterns (Child et al. 2019, "Generating Long Sequences with Sparse Transformers",
section 4.2-4.3) as plain data: element predicates, disjoint parts with their own layouts, and dense masks. This
module is the one definition of sparse attention: the configs validate their settings through `pattern_from_config`,
the models build their pattern with it, the kernels (`sparse_attention.py`) and the figures (`interpret.patterns`)
read the `SparsePattern` it returns.

All positions are 0-indexed and absolute (left padding shifts the fixed pattern's blocks). With stride `l`:

- strided (merged head): {0 <= i-j <= l} U {(i-j) mod l = 0}; bidirectional: {|i-j| <= l} U {(i-j) mod l = 0}.
- fixed (merged head): {floor(j/l) = floor(i/l)} U {j mod l in [l-c, l)}; head h takes the (h mod k)-th
  c-wide summary block counted from the end of each window (k = `num_summary_blocks`); bidirectional: the whole
  own block plus the summary columns of every block.
- causal patterns also require j <= i.

A pattern is the union of PARTS (the paper's A^(1), A^(2), `SparsePattern.part_defined`). Each part has a standalone
form (`PatternPart.allowed`, used when a layer or a head uses that part alone: "interleaved" and "heads" modes): the
paper's part plus the diagonal, so no row is ever fully masked; and an exclusive form (`PatternPart.exclusive`): the
exclusive forms of a pattern's parts are disjoint and their union is the merged pattern, which lets a kernel compute
each part in its own layout and merge the parts exactly with a log-sum-exp:

- strided: "band" (natural order, a blocked local window) and "residue" (transposed order p -> (p mod l, p div l):
  ordinary causal attention over n/l tokens per residue class). The residue part owns the offsets 0 and l.
- fixed: "block" (block-diagonal attention) and "summary" (a compact gathered key set of the summary columns). The
  summary part owns the summary columns of the query's own block.

The three ways to use the parts over a network (section 4.3) are the `mode`s: "merged" (every layer and head
attends to the union), "interleaved" (layer i uses part i mod num_parts), "heads" (head h uses part h mod
num_parts).

Every model family spells the settings alike: `attention_type` ("dense", "strided", "fixed"), `sparse_stride` (l),
`sparse_summary_size` (c), `sparse_num_summary_blocks` (k), `sparse_pattern_mode`; the seq2seq encoder's carry the
prefix `encoder_`. A config says where its fields are with a `sparse_fields` class attribute (`SparseFields`).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass

import torch

ATTENTION_TYPES = ("dense", "strided", "fixed")  # the values of a config's `attention_type`
PATTERN_KINDS = ATTENTION_TYPES[1:]
PATTERN_MODES = ("merged", "interleaved", "heads")
PART_NAMES = {"strided": ("band", "residue"), "fixed": ("block", "summary")}
NUM_PARTS = 2  # every pattern is the union of two parts, A^(1) and A^(2) (sec. 4.2)


def _as_tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"`{name}` must be {what}, got {value!r}.")


def check_settings(
    kind, stride, summary_size, num_summary_blocks, mode, prefix: str = "", kinds: tuple[str, ...] = PATTERN_KINDS
) -> None:
    """Raise a `ValueError` naming the config field (`{prefix}sparse_stride`, ...) of the first bad setting.

    The integers are checked whatever the kind; the summary sizes must fit the stride only for the fixed pattern
    (the strided pattern ignores them)."""
    if kind not in kinds:
        raise ValueError(f"Unknown `{prefix}attention_type` {kind!r}: expected one of {kinds}.")
    if mode not in PATTERN_MODES:
        raise ValueError(f"Unknown `{prefix}sparse_pattern_mode` {mode!r}: expected one of {PATTERN_MODES}.")
    _check_int(f"{prefix}sparse_stride", stride, 1)
    _check_int(f"{prefix}sparse_summary_size", summary_size, 0)
    _check_int(f"{prefix}sparse_num_summary_blocks", num_summary_blocks, 1)
    if kind != "fixed":
        return
    if not 0 < summary_size <= stride:
        raise ValueError(
            f"The fixed pattern needs 0 < `{prefix}sparse_summary_size` <= `{prefix}sparse_stride`, got "
            f"`{prefix}sparse_summary_size`={summary_size} and `{prefix}sparse_stride`={stride}."
        )
    if summary_size * num_summary_blocks > stride:
        raise ValueError(
            f"`{prefix}sparse_summary_size` ({summary_size}) x `{prefix}sparse_num_summary_blocks` "
            f"({num_summary_blocks}) = {summary_size * num_summary_blocks} summary positions, which does not fit in "
            f"a block of `{prefix}sparse_stride` ({stride}) positions."
        )


@dataclass(frozen=True)
class SparsePattern:
    """One Sparse Transformer attention pattern and how a network uses its parts (`mode`); see the module
    docstring for the definitions. `field_prefix` ("encoder_" for the seq2seq encoder) only names the config fields
    in the `ValueError`s of a bad value; it is not stored."""

    kind: str
    stride: int
    summary_size: int = 0
    num_summary_blocks: int = 1
    causal: bool = True
    mode: str = "merged"
    field_prefix: InitVar[str] = ""

    def __post_init__(self, field_prefix: str):
        check_settings(self.kind, self.stride, self.summary_size, self.num_summary_blocks, self.mode, field_prefix)
        if self.kind == "strided" and self.num_summary_blocks != 1:
            raise ValueError(
                f"`{field_prefix}sparse_num_summary_blocks`={self.num_summary_blocks} only applies to the fixed "
                "pattern (build strided patterns with `build_pattern`, which drops the summary settings)."
            )

    def check_fits(
        self, num_heads: int, max_length: int, heads_field: str = "num_heads", length_field: str = "max_length",
        field_prefix: str = "",
    ) -> None:  # fmt: skip
        """Raise a `ValueError` naming the config fields if the stride is longer than the longest sequence, or if
        "heads" mode cannot split `num_heads` evenly over the parts."""
        if self.stride > max_length:
            raise ValueError(
                f"`{field_prefix}sparse_stride` ({self.stride}) is longer than the sequence, at most `{length_field}` "
                f"({max_length}) tokens: the paper takes the stride close to sqrt(n)."
            )
        if self.mode == "heads" and num_heads % self.num_parts:
            raise ValueError(
                f"`{field_prefix}sparse_pattern_mode`='heads' gives each of the {self.num_parts} parts of the "
                f"{self.kind!r} pattern an equal share of the heads: `{heads_field}` ({num_heads}) must be divisible "
                f"by {self.num_parts}."
            )

    # ----------------------------------------------------------------------------------------------- predicates
    @property
    def num_parts(self) -> int:
        return NUM_PARTS

    def summary_range(self, head) -> tuple[torch.Tensor, torch.Tensor]:
        """[lo, hi) of the summary columns (j mod l) used by `head` (tensor or int)."""
        r = _as_tensor(head) % self.num_summary_blocks
        hi = self.stride - r * self.summary_size
        return hi - self.summary_size, hi

    def is_summary_column(self, kv_idx, head=0) -> torch.Tensor:
        lo, hi = self.summary_range(head)
        col = _as_tensor(kv_idx) % self.stride
        return (col >= lo) & (col < hi)

    def _causal(self, q_idx, kv_idx) -> torch.Tensor:
        if self.causal:
            return kv_idx <= q_idx
        return torch.ones_like(kv_idx == q_idx)

    def allowed(self, q_idx, kv_idx, head=0) -> torch.Tensor:
        """Element predicate of the merged pattern (the union of all parts), broadcasting integer tensors."""
        return self.part_defined(0, q_idx, kv_idx, head) | self.part_defined(1, q_idx, kv_idx, head)

    def part_defined(self, part_index: int, q_idx, kv_idx, head=0) -> torch.Tensor:
        """The paper's A^(m) of one part, as defined (sec. 4.2) and drawn in its Fig. 3: band = {0 <= i-j <= l}
        (bidirectional |i-j| <= l), residue = {(i-j) mod l = 0}, block = {floor(j/l) = floor(i/l)}, summary = the
        head's summary columns; causal parts also need j <= i."""
        if part_index not in (0, 1):
            raise ValueError(f"part_index must be 0 or 1 for a {self.kind} pattern, got {part_index!r}.")
        q, k = _as_tensor(q_idx), _as_tensor(kv_idx)
        L = self.stride
        if self.kind == "strided":
            diff = q - k
            if part_index == 0:  # band
                dist = diff if self.causal else diff.abs()
                return (dist >= 0) & (dist <= L)
            return (diff % L == 0) & self._causal(q, k)  # residue
        if part_index == 0:  # block
            same_block = torch.div(q, L, rounding_mode="floor") == torch.div(k, L, rounding_mode="floor")
            return same_block & self._causal(q, k)
        return self.is_summary_column(k, head) & self._causal(q, k)  # summary

    def part_allowed(self, part_index: int, q_idx, kv_idx, head=0, exclusive: bool = False) -> torch.Tensor:
        """Standalone predicate of one part: `part_defined` plus the diagonal, which keeps every row non-empty when a
        layer or head uses the part alone. With `exclusive`, the part's disjoint share of the merged pattern."""
        q, k = _as_tensor(q_idx), _as_tensor(kv_idx)
        defined = self.part_defined(part_index, q, k, head)
        if not exclusive:
            return defined | (q == k)
        if self.kind == "strided" and part_index == 0:  # the residue part owns the offsets 0 and l
            dist = (q - k) if self.causal else (q - k).abs()
            return (dist >= 1) & (dist < self.stride)
        if self.kind == "fixed" and part_index == 0:  # the summary part owns the summary columns
            return defined & ~self.part_defined(1, q, k, head)
        return defined

    # ------------------------------------------------------------------------------------------------- parts
    def parts(self) -> list[PatternPart]:
        return [PatternPart(self, i, name) for i, name in enumerate(PART_NAMES[self.kind])]

    # ------------------------------------------------------------------------------------------------- masks
    def _grid(self, n: int, num_heads: int, device):
        i = torch.arange(n, device=device)
        h = torch.arange(num_heads, device=device)
        return i[None, :, None], i[None, None, :], h[:, None, None]

    def dense_mask(self, n: int, num_heads: int = 1, device=None) -> torch.Tensor:
        """Boolean (num_heads, n, n) mask of the merged pattern (True = attend)."""
        q, k, h = self._grid(n, num_heads, device)
        return self.allowed(q, k, h).expand(num_heads, n, n).contiguous()

    def part_mask(self, part_index: int, n: int, num_heads: int = 1, device=None) -> torch.Tensor:
        """Boolean (num_heads, n, n) mask of one part used alone (interleaved or per-head use)."""
        q, k, h = self._grid(n, num_heads, device)
        return self.part_allowed(part_index, q, k, h).expand(num_heads, n, n).contiguous()

    def head_parts(self, mode: str | None, layer_idx: int, num_heads: int) -> list[int | None]:
        """For each head, the part it uses alone, or None for the merged pattern; `mode` None is `self.mode`."""
        mode = self.mode if mode is None else mode
        check_mode(mode)
        if mode == "merged":
            return [None] * num_heads
        if mode == "interleaved":
            return [layer_idx % self.num_parts] * num_heads
        if num_heads % self.num_parts:
            raise ValueError(
                f"mode='heads' splits the heads evenly over the {self.num_parts} parts of the {self.kind} pattern: "
                f"num_heads={num_heads} is not divisible by {self.num_parts}."
            )
        return [h % self.num_parts for h in range(num_heads)]


@dataclass(frozen=True)
class PatternPart:
    """One part (the paper's A^(m)) of a pattern. `name` says its layout: band (natural order, local window),
    residue (transposed order, causal over n/l tokens), block (block-diagonal), summary (compact gathered keys)."""

    pattern: SparsePattern
    index: int
    name: str

    def defined(self, q_idx, kv_idx, head=0) -> torch.Tensor:
        """The paper's A^(m) (what a figure draws)."""
        return self.pattern.part_defined(self.index, q_idx, kv_idx, head)

    def allowed(self, q_idx, kv_idx, head=0) -> torch.Tensor:
        """Standalone predicate (contains the diagonal)."""
        return self.pattern.part_allowed(self.index, q_idx, kv_idx, head)

    def exclusive(self, q_idx, kv_idx, head=0) -> torch.Tensor:
        """This part's disjoint share of the merged pattern."""
        return self.pattern.part_allowed(self.index, q_idx, kv_idx, head, exclusive=True)


def check_mode(mode: str) -> None:
    if mode not in PATTERN_MODES:
        raise ValueError(f"Unknown sparse attention mode {mode!r}; expected one of {PATTERN_MODES}.")


def build_pattern(
    kind: str,
    stride: int,
    summary_size: int = 0,
    num_summary_blocks: int = 1,
    causal: bool = True,
    mode: str = "merged",
    field_prefix: str = "",
) -> SparsePattern:
    """A validated `SparsePattern`; the strided pattern drops `summary_size` and `num_summary_blocks`."""
    if kind == "strided":
        summary_size, num_summary_blocks = 0, 1
    return SparsePattern(kind, stride, summary_size, num_summary_blocks, causal, mode, field_prefix)


# --------------------------------------------------------------------------------------------------- from a config
@dataclass(frozen=True)
class SparseFields:
    """Where a config keeps its sparse-attention settings: `{prefix}attention_type`, `{prefix}sparse_stride`,
    `{prefix}sparse_summary_size`, `{prefix}sparse_num_summary_blocks` and `{prefix}sparse_pattern_mode`; whether the
    attention is causal; and which fields hold the head count and the longest sequence (checked against the stride
    and the "heads" mode). Each configuration class sets one as its `sparse_fields` class attribute."""

    prefix: str = ""
    causal: bool = True
    heads_field: str = "num_attention_heads"
    length_field: str = "max_position_embeddings"


def pattern_from_config(config) -> SparsePattern | None:
    """The pattern that `config`'s sparse-attention fields describe (None for dense attention), validated: a bad
    setting raises a `ValueError` naming the config field. The configs call it to validate themselves; the models,
    kernels and figures call it to read them, so a model builds its pattern with its own copy of this module
    (under `trust_remote_code` the config may come from another module)."""
    fields = getattr(config, "sparse_fields", None)
    if fields is None:
        raise ValueError(
            f"{type(config).__name__} (model_type={getattr(config, 'model_type', None)!r}) has no sparse attention "
            "settings (no `sparse_fields`)."
        )
    p = fields.prefix
    kind = getattr(config, f"{p}attention_type")
    stride = getattr(config, f"{p}sparse_stride")
    summary_size = getattr(config, f"{p}sparse_summary_size")
    num_summary_blocks = getattr(config, f"{p}sparse_num_summary_blocks")
    mode = getattr(config, f"{p}sparse_pattern_mode")
    check_settings(kind, stride, summary_size, num_summary_blocks, mode, p, kinds=ATTENTION_TYPES)  # "dense" too
    if kind == "dense":
        return None
    pattern = build_pattern(kind, stride, summary_size, num_summary_blocks, fields.causal, mode, field_prefix=p)
    num_heads, max_length = getattr(config, fields.heads_field), getattr(config, fields.length_field)
    pattern.check_fits(num_heads, max_length, fields.heads_field, fields.length_field, field_prefix=p)
    return pattern


def mask_for_layer(
    pattern: SparsePattern, mode: str | None, layer_idx: int, n: int, num_heads: int = 1, device=None
) -> torch.Tensor:
    """Boolean (num_heads, n, n) mask that layer `layer_idx` uses under `mode` (merged / interleaved / heads; None is
    the pattern's own mode)."""
    head_parts = pattern.head_parts(mode, layer_idx, num_heads)
    q, k, h = pattern._grid(n, num_heads, device)
    masks = []
    for head, part in enumerate(head_parts):
        hh = h[head : head + 1]
        if part is None:
            masks.append(pattern.allowed(q, k, hh))
        else:
            masks.append(pattern.part_allowed(part, q, k, hh))
    return torch.cat([m.expand(1, n, n) for m in masks], dim=0)


def allowed_key_indices(
    pattern: SparsePattern, position: int, head: int = 0, part_index: int | None = None, device=None
) -> torch.Tensor:
    """Sorted absolute key positions j <= `position` that a (causal) query at `position` may attend to, for cached
    decoding: strided -> window tail plus the residue class `position mod l :: l`; fixed -> the own block so far
    plus the summary columns of earlier blocks. `part_index` selects one part used alone (None = merged)."""
    if not pattern.causal:
        raise ValueError("allowed_key_indices is for cached (causal) decoding; the pattern is bidirectional.")
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}.")
    L, i = pattern.stride, position
    if pattern.kind == "strided":
        band = torch.arange(max(0, i - L), i + 1, device=device)
        residue = torch.arange(i % L, i + 1, L, device=device)
        pieces = {0: [band], 1: [residue], None: [band, residue]}[part_index]
    else:
        start = (i // L) * L
        own = torch.arange(start, i + 1, device=device)
        lo, hi = (int(x) for x in pattern.summary_range(head))
        cols = torch.arange(lo, hi, device=device)
        summary = (torch.arange(0, start, L, device=device)[:, None] + cols[None, :]).reshape(-1)
        own_summary = own[(own % L >= lo) & (own % L < hi)]
        diag = torch.tensor([i], device=device)
        pieces = {0: [own], 1: [summary, own_summary, diag], None: [summary, own]}[part_index]
    return torch.unique(torch.cat(pieces))  # sorted
