"""Sparse attention patterns as registered objects: the one definition of sparse attention.

Each pattern KIND is one class, registered by name with `@register_pattern`, that owns everything about it: the
settings it reads and their checks, its PARTS (the Sparse Transformer paper's A^(1), A^(2), ...), their element
predicates, the key positions one query needs during cached decoding, and the LAYOUTS the block-sparse kernel computes
each part in. Everything else reads the registry and never branches on a kind's name: the configs validate their
settings through `pattern_from_config`, the models build their pattern with it, the kernels (`sparse_attention.py`)
run the layouts a kind returns, the figures (`interpret.patterns`) and the command line list `ATTENTION_TYPES`.
Adding a pattern is one class in this file (see docs/contributing/extending.md).

The kinds (0-indexed absolute positions, query i, key j; causal patterns also require j <= i):

- "strided" (Child et al. 2019, sec. 4.2), stride l: band {0 <= i-j <= l} (bidirectional |i-j| <= l) and residue
  {(i-j) mod l = 0}.
- "fixed" (Child et al. 2019, sec. 4.2), stride l, c summary positions: block {floor(j/l) = floor(i/l)} and summary
  {j mod l in [l-c, l)}; head h takes the (h mod k)-th c-wide summary block counted from the end of each window
  (k = `num_summary_blocks`); bidirectional: the whole own block plus the summary columns of every block.
- "local" (Longformer, Beltagy et al. 2020; Mistral's sliding window), window w: window {0 <= i-j <= w}
  (bidirectional |i-j| <= w) and, with g > 0 global tokens (the config's `sparse_summary_size`), global: every query
  sees the first g tokens (causal: those before it) and, bidirectional, the first g tokens see every token.

A part has a standalone form (`SparsePattern.part_allowed`, used when a layer or a head uses that part alone:
"interleaved" and "heads" modes): the part plus the diagonal, so no row is ever fully masked; and an exclusive form:
the exclusive forms of a pattern's parts are disjoint and their union is the merged pattern, which lets the kernel
compute each part in its own layout and merge the parts exactly by their log-sum-exp.

The three ways to use the parts over a network (sec. 4.3) are the `mode`s: "merged" (every layer and head attends
to the union), "interleaved" (layer i uses part i mod num_parts), "heads" (head h uses part h mod num_parts).

Every model family spells the settings alike: `attention_type` ("dense" or a registered kind), `sparse_stride`,
`sparse_summary_size`, `sparse_num_summary_blocks`, `sparse_pattern_mode`; the seq2seq encoder's carry the prefix
`encoder_`. What each kind reads them as is in its class (`settings`, `symbols`). A config says where its fields are
with a `sparse_fields` class attribute (`SparseFields`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import InitVar, dataclass
from typing import ClassVar

import torch

PATTERN_MODES = ("merged", "interleaved", "heads")


def _as_tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"`{name}` must be {what}, got {value!r}.")


def _causal(pattern: SparsePattern, q, k) -> torch.Tensor:
    return k <= q if pattern.causal else torch.ones_like(k == q)


# ------------------------------------------------------------------------------------------------------- layouts
# What the block-sparse kernel computes a (share of a) part in; `sparse_attention.py` has one implementation of each.
# Predicates take absolute query / key positions (integer tensors that broadcast) and, where given, head indices.
@dataclass(frozen=True)
class Band:
    """Natural order, a blocked local window: the keys within `width` positions before each query (and after it,
    bidirectional), restricted to `allowed(q, k)`."""

    width: int
    allowed: Callable


@dataclass(frozen=True)
class Residue:
    """Residue classes mod `stride` in transposed order p -> (p mod l, p div l): causal (or full) attention over
    n / l tokens per class, i.e. the keys with (i - j) mod l = 0."""

    stride: int


@dataclass(frozen=True)
class Blocks:
    """Block-diagonal attention over blocks of `size` positions; `allowed(q_in_block, k_in_block, heads)` ->
    (Hg or 1, size, size) restricts it (offsets within the block; heads a LongTensor (Hg,)), None for the whole block
    (causal: its lower triangle)."""

    size: int
    allowed: Callable | None = None


@dataclass(frozen=True)
class Columns:
    """A compact gathered key set: `positions(head, n)`, a sorted list of ints per head (plain Python, so that a
    traced model sees constants), that every query attends to (causal: the ones not after it); `chunk` queries per
    call of a causal pattern."""

    positions: Callable
    chunk: int = 1024


@dataclass(frozen=True)
class Rows:
    """The first `count` queries attend to every key from position `first_key` on (bidirectional global rows)."""

    count: int
    first_key: int


@dataclass(frozen=True)
class Diagonal:
    """Each query in `rows(heads, n)` (bool (Hg or 1, n); heads a LongTensor (Hg,)) attends to itself: the rows a
    standalone part does not otherwise cover."""

    rows: Callable


# ------------------------------------------------------------------------------------------------------- the kinds
class PatternKind:
    """Base of the pattern classes. A subclass sets `name`, `part_names`, the `settings` it reads (of "stride",
    "summary_size", "num_summary_blocks") with their `symbols` for captions, and implements the methods below; each
    takes the `SparsePattern` holding the settings."""

    name: ClassVar[str]
    description: ClassVar[str]
    part_names: ClassVar[tuple[str, ...]]
    settings: ClassVar[tuple[str, ...]] = ("stride",)
    symbols: ClassVar[dict[str, str]] = {"stride": "l"}

    @classmethod
    def check(cls, pattern: SparsePattern, prefix: str) -> None:
        """Raise a ValueError naming the config field of a setting this kind cannot take."""

    @classmethod
    def num_parts(cls, pattern: SparsePattern) -> int:
        return len(cls.part_names)

    @classmethod
    def head_dependent(cls, pattern: SparsePattern) -> bool:
        """Whether heads using the same part(s) see different keys (the merged mask then has one row per head)."""
        return False

    @classmethod
    def defined(cls, pattern: SparsePattern, part: int, q, k, head) -> torch.Tensor:
        """The paper's A^(m) of part `part`, as defined and drawn (may overlap other parts)."""
        raise NotImplementedError

    @classmethod
    def exclusive(cls, pattern: SparsePattern, part: int, q, k, head) -> torch.Tensor:
        """The part's disjoint share of the merged pattern (default: what no earlier part defines)."""
        share = cls.defined(pattern, part, q, k, head)
        for earlier in range(part):
            share = share & ~cls.defined(pattern, earlier, q, k, head)
        return share

    @classmethod
    def key_indices(cls, pattern: SparsePattern, position: int, head: int, part: int | None, device) -> list:
        """The absolute key positions (LongTensors, may overlap) a causal query at `position` needs, for part
        `part` used alone (with its diagonal) or the merged pattern (None)."""
        raise NotImplementedError

    @classmethod
    def layouts(cls, pattern: SparsePattern, part: int | None, heads: list[int], n: int) -> list:
        """What the block kernel computes for heads `heads` over `n` positions (a multiple of `pattern.stride`):
        the exclusive shares of every part (`part` None, the merged pattern), or part `part` used alone, its
        diagonal included. Layouts of one call must be disjoint and cover exactly that mask."""
        raise NotImplementedError

    @classmethod
    def default_settings(cls, stride: int) -> dict:
        """The kind's default for the settings a config may leave unset (ViTPlusConfig's `sparse_summary_size`),
        also what `hf-vit-plus explain pattern` draws."""
        return {}


PATTERNS: dict[str, type[PatternKind]] = {}


def register_pattern(cls: type[PatternKind]) -> type[PatternKind]:
    """Class decorator: make `cls` the pattern of `attention_type == cls.name`."""
    if cls.name in PATTERNS or cls.name == "dense":
        raise ValueError(f"A sparse pattern named {cls.name!r} is already registered.")
    PATTERNS[cls.name] = cls
    return cls


@register_pattern
class StridedPattern(PatternKind):
    name = "strided"
    description = "strided (Child et al. 2019): a band of l keys plus every l-th key"
    part_names = ("band", "residue")

    @classmethod
    def defined(cls, pattern, part, q, k, head):
        L, diff = pattern.stride, q - k
        if part == 0:  # band
            dist = diff if pattern.causal else diff.abs()
            return (dist >= 0) & (dist <= L)
        return (diff % L == 0) & _causal(pattern, q, k)  # residue

    @classmethod
    def exclusive(cls, pattern, part, q, k, head):
        if part == 0:  # the residue part owns the offsets 0 and l
            dist = (q - k) if pattern.causal else (q - k).abs()
            return (dist >= 1) & (dist < pattern.stride)
        return cls.defined(pattern, part, q, k, head)

    @classmethod
    def key_indices(cls, pattern, position, head, part, device):
        L, i = pattern.stride, position
        band = torch.arange(max(0, i - L), i + 1, device=device)
        residue = torch.arange(i % L, i + 1, L, device=device)
        return {0: [band], 1: [residue], None: [band, residue]}[part]

    @classmethod
    def layouts(cls, pattern, part, heads, n):
        band = Band(pattern.stride, lambda q, k: pattern.part_allowed(0, q, k, exclusive=part is None))
        return {None: [band, Residue(pattern.stride)], 0: [band], 1: [Residue(pattern.stride)]}[part]


@register_pattern
class FixedPattern(PatternKind):
    name = "fixed"
    description = "fixed (Child et al. 2019): the own block of l plus the last c positions of every block"
    part_names = ("block", "summary")
    settings = ("stride", "summary_size", "num_summary_blocks")
    symbols = {"stride": "l", "summary_size": "c", "num_summary_blocks": "k"}

    @classmethod
    def check(cls, pattern, prefix):
        stride, size, blocks = pattern.stride, pattern.summary_size, pattern.num_summary_blocks
        if not 0 < size <= stride:
            raise ValueError(
                f"The fixed pattern needs 0 < `{prefix}sparse_summary_size` <= `{prefix}sparse_stride`, got "
                f"`{prefix}sparse_summary_size`={size} and `{prefix}sparse_stride`={stride}."
            )
        if size * blocks > stride:
            raise ValueError(
                f"`{prefix}sparse_summary_size` ({size}) x `{prefix}sparse_num_summary_blocks` ({blocks}) = "
                f"{size * blocks} summary positions, which does not fit in a block of `{prefix}sparse_stride` "
                f"({stride}) positions."
            )

    @classmethod
    def head_dependent(cls, pattern):
        return pattern.num_summary_blocks > 1

    @staticmethod
    def summary_range(pattern, head) -> tuple[torch.Tensor, torch.Tensor]:
        """[lo, hi) of the summary columns (j mod l) used by `head` (tensor or int)."""
        r = _as_tensor(head) % pattern.num_summary_blocks
        hi = pattern.stride - r * pattern.summary_size
        return hi - pattern.summary_size, hi

    @classmethod
    def is_summary_column(cls, pattern, k, head=0) -> torch.Tensor:
        lo, hi = cls.summary_range(pattern, head)
        column = _as_tensor(k) % pattern.stride
        return (column >= lo) & (column < hi)

    @classmethod
    def defined(cls, pattern, part, q, k, head):
        L = pattern.stride
        if part == 0:  # block
            same_block = torch.div(q, L, rounding_mode="floor") == torch.div(k, L, rounding_mode="floor")
            return same_block & _causal(pattern, q, k)
        return cls.is_summary_column(pattern, k, head) & _causal(pattern, q, k)  # summary

    @classmethod
    def exclusive(cls, pattern, part, q, k, head):
        if part == 0:  # the summary part owns the summary columns
            return cls.defined(pattern, 0, q, k, head) & ~cls.defined(pattern, 1, q, k, head)
        return cls.defined(pattern, part, q, k, head)

    @classmethod
    def key_indices(cls, pattern, position, head, part, device):
        L, i = pattern.stride, position
        start = (i // L) * L
        own = torch.arange(start, i + 1, device=device)
        lo, hi = (int(x) for x in cls.summary_range(pattern, head))
        columns = torch.arange(lo, hi, device=device)
        summary = (torch.arange(0, start, L, device=device)[:, None] + columns[None, :]).reshape(-1)
        own_summary = own[(own % L >= lo) & (own % L < hi)]
        diagonal = torch.tensor([i], device=device)
        return {0: [own], 1: [summary, own_summary, diagonal], None: [summary, own]}[part]

    @classmethod
    def layouts(cls, pattern, part, heads, n):
        L, c = pattern.stride, pattern.summary_size

        def own_block_without_summary(q, k, h):  # offsets within the block; h (Hg,) -> (Hg, l, l)
            return ~cls.is_summary_column(pattern, k, h.view(-1, 1, 1)) & _causal(pattern, q, k)

        def summary_positions(head: int, length: int) -> list[int]:  # block b's c columns, b = 0, 1, ...
            lo = L - (head % pattern.num_summary_blocks + 1) * c
            return [start + lo + i for start in range(0, length, L) for i in range(c)]

        def not_summary(h, length):  # (Hg, n): the summary part alone adds the diagonal off its columns
            return ~cls.is_summary_column(pattern, torch.arange(length, device=h.device), h.view(-1, 1))

        summary = Columns(summary_positions, chunk=min(1024, max(L, n // 16 // L * L)))
        return {
            None: [Blocks(L, own_block_without_summary), summary],
            0: [Blocks(L)],
            1: [summary, Diagonal(not_summary)],
        }[part]

    @classmethod
    def default_settings(cls, stride):
        return {"summary_size": max(1, stride // 4)}


@register_pattern
class LocalPattern(PatternKind):
    """Sliding-window local attention (Longformer; Mistral's sliding window) with optional global tokens.

    Settings: `sparse_stride` is the window w (each query sees the w keys before it, and after it when
    bidirectional); `sparse_summary_size` is the number g of global tokens at the start of the sequence (0: none);
    `sparse_num_summary_blocks` must stay 1. With g = 0 the pattern has one part, "window"."""

    name = "local"
    description = "local (Longformer, Mistral): a sliding window of w keys, plus g global tokens"
    part_names = ("window", "global")
    settings = ("stride", "summary_size")
    symbols = {"stride": "w", "summary_size": "g"}

    @classmethod
    def num_parts(cls, pattern):
        return 2 if pattern.summary_size > 0 else 1

    @classmethod
    def defined(cls, pattern, part, q, k, head):
        if part == 0:  # window
            dist = (q - k) if pattern.causal else (q - k).abs()
            return (dist >= 0) & (dist <= pattern.stride)
        g = pattern.summary_size  # global: the first g tokens as keys (and as queries, bidirectional)
        reach = k < g if pattern.causal else (k < g) | (q < g)
        return reach & _causal(pattern, q, k)

    @classmethod
    def exclusive(cls, pattern, part, q, k, head):
        if part == 0 and pattern.summary_size:  # the global part owns the global tokens' rows and columns
            return cls.defined(pattern, 0, q, k, head) & ~cls.defined(pattern, 1, q, k, head)
        return cls.defined(pattern, part, q, k, head)

    @classmethod
    def key_indices(cls, pattern, position, head, part, device):
        window = torch.arange(max(0, position - pattern.stride), position + 1, device=device)
        global_keys = torch.arange(min(pattern.summary_size, position + 1), device=device)
        diagonal = torch.tensor([position], device=device)
        return {0: [window], 1: [global_keys, diagonal], None: [window, global_keys]}[part]

    @classmethod
    def layouts(cls, pattern, part, heads, n):
        g = pattern.summary_size
        window = Band(pattern.stride, lambda q, k: pattern.part_allowed(0, q, k, exclusive=part is None))
        global_parts = [Columns(lambda head, length: list(range(g)))] if g else []
        if g and not pattern.causal:
            global_parts.append(Rows(g, g))  # the global queries' keys after the global tokens
        if part is None:
            return [window, *global_parts]
        if part == 0:
            return [window]
        return [*global_parts, Diagonal(lambda h, length: torch.arange(length, device=h.device)[None] >= g)]

    @classmethod
    def default_settings(cls, stride):
        return {"summary_size": 1}  # one global token (a ViT's class token)


# The values of a config's `attention_type`: "dense" and every registered pattern.
PATTERN_KINDS = tuple(PATTERNS)
ATTENTION_TYPES = ("dense", *PATTERN_KINDS)
PART_NAMES = {name: kind.part_names for name, kind in PATTERNS.items()}


def default_summary_size(kind: str, stride: int) -> int:
    """`sparse_summary_size` for a config that leaves it unset: the kind's default, else max(1, l // 4)."""
    defaults = PATTERNS[kind].default_settings(stride) if kind in PATTERNS else {}
    return defaults.get("summary_size", max(1, stride // 4))


def check_settings(
    kind, stride, summary_size, num_summary_blocks, mode, prefix: str = "", kinds: tuple[str, ...] | None = None
) -> None:
    """Raise a `ValueError` naming the config field (`{prefix}sparse_stride`, ...) of the first bad setting: the
    integers whatever the kind, then what the kind itself requires of the settings it reads."""
    kinds = PATTERN_KINDS if kinds is None else kinds
    if kind not in kinds:
        raise ValueError(f"Unknown `{prefix}attention_type` {kind!r}: expected one of {kinds}.")
    check_mode(mode, f"`{prefix}sparse_pattern_mode`")
    _check_int(f"{prefix}sparse_stride", stride, 1)
    _check_int(f"{prefix}sparse_summary_size", summary_size, 0)
    _check_int(f"{prefix}sparse_num_summary_blocks", num_summary_blocks, 1)


@dataclass(frozen=True)
class SparsePattern:
    """One sparse attention pattern (`kind`, a registered name, and the settings it reads) and how a network uses
    its parts (`mode`); see the module docstring. `field_prefix` ("encoder_" for the seq2seq encoder) only names the
    config fields in the `ValueError`s of a bad value; it is not stored."""

    kind: str
    stride: int
    summary_size: int = 0
    num_summary_blocks: int = 1
    causal: bool = True
    mode: str = "merged"
    field_prefix: InitVar[str] = ""

    def __post_init__(self, field_prefix: str):
        check_settings(self.kind, self.stride, self.summary_size, self.num_summary_blocks, self.mode, field_prefix)
        if "num_summary_blocks" not in self.spec.settings and self.num_summary_blocks != 1:
            readers = [name for name, kind in PATTERNS.items() if "num_summary_blocks" in kind.settings]
            raise ValueError(
                f"`{field_prefix}sparse_num_summary_blocks`={self.num_summary_blocks} only applies to the "
                f"{' and '.join(map(repr, readers))} pattern (build patterns with `build_pattern`, which drops the "
                "settings a kind does not read)."
            )
        self.spec.check(self, field_prefix)

    @property
    def spec(self) -> type[PatternKind]:
        """The registered class of this pattern's kind."""
        return PATTERNS[self.kind]

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
        return self.spec.num_parts(self)

    @property
    def head_dependent(self) -> bool:
        """Whether heads that use the same part(s) still see different keys."""
        return self.spec.head_dependent(self)

    def part_defined(self, part_index: int, q_idx, kv_idx, head=0) -> torch.Tensor:
        """The paper's A^(m) of one part, as defined and drawn, broadcasting integer tensors (or ints)."""
        self._check_part(part_index)
        return self.spec.defined(self, part_index, _as_tensor(q_idx), _as_tensor(kv_idx), head)

    def allowed(self, q_idx, kv_idx, head=0) -> torch.Tensor:
        """Element predicate of the merged pattern (the union of all parts), broadcasting integer tensors."""
        allowed = self.part_defined(0, q_idx, kv_idx, head)
        for part in range(1, self.num_parts):
            allowed = allowed | self.part_defined(part, q_idx, kv_idx, head)
        return allowed

    def part_allowed(self, part_index: int, q_idx, kv_idx, head=0, exclusive: bool = False) -> torch.Tensor:
        """Standalone predicate of one part: `part_defined` plus the diagonal, which keeps every row non-empty when a
        layer or head uses the part alone. With `exclusive`, the part's disjoint share of the merged pattern."""
        self._check_part(part_index)
        q, k = _as_tensor(q_idx), _as_tensor(kv_idx)
        if exclusive:
            return self.spec.exclusive(self, part_index, q, k, head)
        return self.spec.defined(self, part_index, q, k, head) | (q == k)

    def _check_part(self, part_index) -> None:
        if part_index not in range(self.num_parts):
            raise ValueError(
                f"part_index must be in 0..{self.num_parts - 1} for this {self.kind} pattern, got {part_index!r}."
            )

    def parts(self) -> list[PatternPart]:
        return [PatternPart(self, i, self.spec.part_names[i]) for i in range(self.num_parts)]

    # ------------------------------------------------------------------------------------------------- masks
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

    def heads_mask(self, head_parts: list[int | None], q_idx, kv_idx) -> torch.Tensor:
        """THE mask builder: (H or 1, ...) boolean mask of the heads that use `head_parts` (each head's part alone,
        or the merged pattern for None), for queries `q_idx` and keys `kv_idx` that broadcast to (..., Tq, Tk) and
        carry no head axis. One row for all heads when they all see the same keys."""
        if len(set(head_parts)) == 1 and not self.head_dependent:
            head_parts = head_parts[:1]
        q, k = _as_tensor(q_idx), _as_tensor(kv_idx)
        masks = []
        for head, part in enumerate(head_parts):
            head_index = torch.tensor(head, device=q.device)
            mask = self.allowed(q, k, head_index) if part is None else self.part_allowed(part, q, k, head_index)
            masks.append(mask.expand(torch.broadcast_shapes(q.shape, k.shape)))
        return torch.stack(masks, dim=-3)

    def dense_mask(self, n: int, num_heads: int = 1, device=None) -> torch.Tensor:
        """Boolean (num_heads, n, n) mask of the merged pattern (True = attend)."""
        return mask_for_layer(self, "merged", 0, n, num_heads, device)

    def part_mask(self, part_index: int, n: int, num_heads: int = 1, device=None) -> torch.Tensor:
        """Boolean (num_heads, n, n) mask of one part used alone (interleaved or per-head use)."""
        self._check_part(part_index)
        positions = torch.arange(n, device=device)
        mask = self.heads_mask([part_index] * num_heads, positions[:, None], positions[None, :])
        return mask.expand(num_heads, n, n).contiguous()

    def key_indices(self, position: int, head: int = 0, part_index: int | None = None, device=None) -> torch.Tensor:
        """Sorted absolute key positions j <= `position` that a (causal) query at `position` attends to, for cached
        decoding; `part_index` selects one part used alone (None = merged)."""
        if not self.causal:
            raise ValueError("allowed_key_indices is for cached (causal) decoding; the pattern is bidirectional.")
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}.")
        if part_index is not None:
            self._check_part(part_index)
        return torch.unique(torch.cat(self.spec.key_indices(self, position, head, part_index, device)))  # sorted

    def layouts(self, part_index: int | None, heads: list[int], n: int) -> list:
        """The layouts the block kernel computes (see `PatternKind.layouts`)."""
        return self.spec.layouts(self, part_index, heads, n)

    def flex_mask_mod(self, head_parts: list[int | None], q_offset: int = 0, padding: torch.Tensor | None = None):
        """flex_attention's `mask_mod(b, h, q_idx, kv_idx)` of a layer whose heads use `head_parts`: the merged
        pattern or one part per head, the queries the last ones (offset `q_offset`), padding keys masked except on
        the diagonal."""
        parts = torch.tensor([-1 if part is None else part for part in head_parts])

        def mask_mod(b, h, q_idx, kv_idx):
            i = q_idx + q_offset
            part = parts.to(i.device)[h]
            allowed = torch.zeros_like(i == kv_idx)
            for index in range(self.num_parts):
                use = (part == index) | (part == -1)
                allowed = allowed | (use & self.part_allowed(index, i, kv_idx, h))
            if padding is not None:
                allowed = allowed & (padding[b, kv_idx] | (i == kv_idx))
            return allowed

        return mask_mod


@dataclass(frozen=True)
class PatternPart:
    """One part (the paper's A^(m)) of a pattern; `name` is the kind's name for it."""

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


def check_mode(mode: str, what: str = "sparse attention mode") -> None:
    if mode not in PATTERN_MODES:
        raise ValueError(f"Unknown {what} {mode!r}; expected one of {PATTERN_MODES}.")


def build_pattern(
    kind: str,
    stride: int,
    summary_size: int = 0,
    num_summary_blocks: int = 1,
    causal: bool = True,
    mode: str = "merged",
    field_prefix: str = "",
) -> SparsePattern:
    """A validated `SparsePattern`; the settings the kind does not read (e.g. the strided pattern's summary size)
    are dropped."""
    if kind in PATTERNS:
        settings = PATTERNS[kind].settings
        summary_size = summary_size if "summary_size" in settings else 0
        num_summary_blocks = num_summary_blocks if "num_summary_blocks" in settings else 1
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
    positions = torch.arange(n, device=device)
    mask = pattern.heads_mask(pattern.head_parts(mode, layer_idx, num_heads), positions[:, None], positions[None, :])
    return mask.expand(num_heads, n, n).contiguous()


def allowed_key_indices(
    pattern: SparsePattern, position: int, head: int = 0, part_index: int | None = None, device=None
) -> torch.Tensor:
    """`pattern.key_indices(...)`: the sorted key positions a causal query at `position` needs during cached
    decoding (strided: the window tail plus the residue class; fixed: the own block so far plus the summary columns
    of earlier blocks; local: the window plus the global tokens)."""
    return pattern.key_indices(position, head, part_index, device)


__all__ = [
    "ATTENTION_TYPES",
    "PART_NAMES",
    "PATTERNS",
    "PATTERN_KINDS",
    "PATTERN_MODES",
    "Band",
    "Blocks",
    "Columns",
    "Diagonal",
    "PatternKind",
    "PatternPart",
    "Residue",
    "Rows",
    "SparseFields",
    "SparsePattern",
    "allowed_key_indices",
    "build_pattern",
    "check_mode",
    "check_settings",
    "default_summary_size",
    "mask_for_layer",
    "pattern_from_config",
    "register_pattern",
]
