"""Sparse Transformer attention patterns (Child et al. 2019, "Generating Long Sequences with Sparse Transformers",
section 4.2-4.3) as plain data: element predicates, disjoint parts with their own layouts, and dense masks.

All positions are 0-indexed and absolute (left padding shifts the fixed pattern's blocks). With stride `l`:

- strided (merged head): {0 <= i-j <= l} U {(i-j) mod l = 0}; bidirectional: {|i-j| <= l} U {(i-j) mod l = 0}.
- fixed (merged head): {floor(j/l) = floor(i/l)} U {j mod l in [l-c, l)}; head h takes the (h mod k)-th
  c-wide summary block counted from the end of each window (k = `num_summary_blocks`); bidirectional: the whole
  own block plus the summary columns of every block.
- causal patterns also require j <= i.

A pattern is the union of PARTS (the paper's A^(1), A^(2)). Each part has a standalone form (`PatternPart.allowed`,
used when a layer or a head uses that part alone: "interleaved" and "heads" modes) that always contains the
diagonal, so no row is ever fully masked, and an exclusive form (`PatternPart.exclusive`): the exclusive forms of a
pattern's parts are disjoint and their union is the merged pattern, which lets a kernel compute each part in its own
layout and merge the parts exactly with a log-sum-exp:

- strided: "band" (natural order, a blocked local window) and "residue" (transposed order p -> (p mod l, p div l):
  ordinary causal attention over n/l tokens per residue class). The residue part owns the offsets 0 and l.
- fixed: "block" (block-diagonal attention) and "summary" (a compact gathered key set of the summary columns). The
  summary part owns the summary columns of the query's own block.

The three ways to use the parts over a network (section 4.3) are the `mode`s: "merged" (every layer and head
attends to the union), "interleaved" (layer i uses part i mod num_parts), "heads" (head h uses part h mod
num_parts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PATTERN_KINDS = ("strided", "fixed")
PATTERN_MODES = ("merged", "interleaved", "heads")
PART_NAMES = {"strided": ("band", "residue"), "fixed": ("block", "summary")}


def _as_tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


@dataclass(frozen=True)
class SparsePattern:
    """One Sparse Transformer attention pattern; see the module docstring for the definitions."""

    kind: str
    stride: int
    summary_size: int = 0
    num_summary_blocks: int = 1
    causal: bool = True

    def __post_init__(self):
        if self.kind not in PATTERN_KINDS:
            raise ValueError(f"Unknown sparse pattern kind {self.kind!r}; expected one of {PATTERN_KINDS}.")
        if not isinstance(self.stride, int) or isinstance(self.stride, bool) or self.stride < 1:
            raise ValueError(f"Sparse pattern stride must be a positive integer, got stride={self.stride!r}.")
        if not isinstance(self.num_summary_blocks, int) or self.num_summary_blocks < 1:
            raise ValueError(f"num_summary_blocks must be a positive integer, got {self.num_summary_blocks!r}.")
        if self.kind == "fixed":
            c = self.summary_size
            if not isinstance(c, int) or not 0 < c <= self.stride:
                raise ValueError(
                    f"The fixed pattern needs 0 < summary_size <= stride, got summary_size={c!r}, "
                    f"stride={self.stride}."
                )
            if c * self.num_summary_blocks > self.stride:
                raise ValueError(
                    f"num_summary_blocks * summary_size must fit in the stride: {self.num_summary_blocks} * {c} > "
                    f"stride={self.stride}."
                )
        elif self.num_summary_blocks != 1:
            raise ValueError(f"num_summary_blocks={self.num_summary_blocks} only applies to the fixed pattern.")

    # ----------------------------------------------------------------------------------------------- predicates
    @property
    def num_parts(self) -> int:
        return 2

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
        return self.part_allowed(0, q_idx, kv_idx, head) | self.part_allowed(1, q_idx, kv_idx, head)

    def part_allowed(self, part_index: int, q_idx, kv_idx, head=0, exclusive: bool = False) -> torch.Tensor:
        """Standalone (or, with `exclusive`, the disjoint merged-piece) predicate of one part."""
        q, k = _as_tensor(q_idx), _as_tensor(kv_idx)
        h = _as_tensor(head)
        L = self.stride
        diff = q - k
        if part_index not in (0, 1):
            raise ValueError(f"part_index must be 0 or 1 for a {self.kind} pattern, got {part_index!r}.")
        if self.kind == "strided":
            dist = diff if self.causal else diff.abs()
            if part_index == 0:  # band
                if exclusive:
                    return (dist >= 1) & (dist < L)
                return (dist >= 0) & (dist <= L)
            return (diff % L == 0) & self._causal(q, k)  # residue
        same_block = torch.div(q, L, rounding_mode="floor") == torch.div(k, L, rounding_mode="floor")
        summary = self.is_summary_column(k, h) & self._causal(q, k)
        if part_index == 0:  # block
            own = same_block & self._causal(q, k)
            return own & ~summary if exclusive else own
        if exclusive:
            return summary
        return summary | (q == k)  # standalone: the diagonal keeps every row non-empty

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

    def head_parts(self, mode: str, layer_idx: int, num_heads: int) -> list[int | None]:
        """For each head, the part it uses alone, or None for the merged pattern."""
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
    kind: str, stride: int, summary_size: int = 0, num_summary_blocks: int = 1, causal: bool = True
) -> SparsePattern:
    """Validated constructor (the dataclass validates too); `summary_size` is ignored for the strided pattern."""
    if kind == "strided":
        summary_size, num_summary_blocks = 0, 1
    return SparsePattern(kind, stride, summary_size, num_summary_blocks, causal)


def mask_for_layer(
    pattern: SparsePattern, mode: str, layer_idx: int, n: int, num_heads: int = 1, device=None
) -> torch.Tensor:
    """Boolean (num_heads, n, n) mask that layer `layer_idx` uses under `mode` (merged / interleaved / heads)."""
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
