"""Sparse Transformer attention kernels (Child et al. 2019). `attention.py` registers their names with transformers'
attention interfaces (thin shims that import this module on their first call, so a dense model never loads it).

Kernels (all `fn(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs)`,
query/key/value (B, H, T, D), returning the output as (B, T, H, D) and the weights or None):

- "sparse_dense": the dense masked reference (pattern mask AND padding mask); exact, O(n^2). Returns the weights.
- "sparse_block": exact CPU kernel with forward and backward in O(n sqrt(n)): each part of the pattern is computed
  in its own layout (strided residue classes in transposed order as causal attention over n/l tokens, the band as a
  blocked local window, the fixed own block as block-diagonal attention, the summary columns as a compact gathered
  key set) and the parts are merged exactly by their log-sum-exp. It uses PyTorch's private CPU flash ops (which
  return the log-sum-exp) when their schema matches the pinned one, otherwise a plain-PyTorch path.
- "sparse_flex": flex_attention (compiled) with a per-head BlockMask built from the layer's parts, in natural order
  (inference on CPU; on CPU a call that needs gradients falls back to "sparse_block", logged once; GPU trains).

Private ops: "sparse_block" calls `aten._scaled_dot_product_flash_attention_for_cpu` and its backward (the only
CPU attention ops that return the log-sum-exp) only if their schemas equal `FLASH_FORWARD_SCHEMA` /
`FLASH_BACKWARD_SCHEMA` (checked once, in `compat.cpu_flash_attention_ops`; tested); otherwise
(`FLASH_OPS_AVAILABLE` False) the same parts run on public matmul / logsumexp ops, about 2x slower, with the same
results.

Attribute contract of the attention `module` (kwargs of the same names override them):
- `sparse_pattern`: a `SparsePattern` (required); its `mode` says how the layer uses the parts: "merged" (the
  union), "interleaved" (layer i uses part i mod num_parts) or "heads" (head h uses part h mod num_parts);
- `sparse_mode` (optional): overrides the pattern's mode;
- `layer_idx`: int (default 0), used by the interleaved mode;
- `training`: attention dropout is applied only by "sparse_dense" ("sparse_block" falls back to it, logged once).
Causality comes from the pattern (`SparsePattern.causal`); the kernels ignore `is_causal`. `scaling=None` is
1/sqrt(D).

`attention_mask` is what the registered mask function returns: None or a 2-D boolean padding mask (B, Tk), True
for real tokens, positions absolute (left padding included). "sparse_dense" also accepts a 4-D boolean mask, which
is ANDed with the pattern. Padding keys are masked for every query except on the diagonal, so no row is ever empty
(padding rows give finite garbage, never NaN). Queries are the last Tq of the Tk positions (cached decoding);
Tq < Tk is computed by the dense path, and `allowed_key_indices` gives the few cache positions one new query needs.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from .attention_reference import eager_attention_forward, flex_attention_refusal, sparse_padding_mask
from .compat import FLASH_BACKWARD_SCHEMA, FLASH_FORWARD_SCHEMA, cpu_flash_attention_ops
from .sparse_layouts import (
    Band,
    Blocks,
    Columns,
    Residue,
    Rows,
    SparsePattern,
    allowed_key_indices,
    check_mode,
)

logger = logging.getLogger(__name__)

__all__ = [
    "FLASH_BACKWARD_SCHEMA",
    "FLASH_FORWARD_SCHEMA",
    "FLASH_OPS_AVAILABLE",
    "SPARSE_KERNELS",
    "allowed_key_indices",
    "block_sparse_attention",
    "dense_sparse_attention",
    "flex_sparse_attention",
    "sparse_block_attention_forward",
    "sparse_dense_attention_forward",
    "sparse_flex_attention_forward",
    "sparse_padding_mask",
]

_FLASH = cpu_flash_attention_ops()  # (forward, backward) or None: see compat.py
FLASH_OPS_AVAILABLE = _FLASH is not None
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_logged: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.warning(message)


# ------------------------------------------------------------------------ one attention call returning its log-sum-exp
def _attend(q, k, v, mask, causal, scale, use_flash):
    """softmax(q k^T * scale + mask) v and its log-sum-exp. q (N, H, Tq, D); mask additive, broadcastable."""
    if use_flash:
        out, lse = _FLASH[0](q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
        return out, lse
    s = _scores(q, k, mask, causal, scale)
    lse = torch.logsumexp(s, dim=-1)  # (N, H, Tq)
    return torch.matmul(torch.exp(s - lse[..., None]), v), lse


def _scores(q, k, mask, causal, scale):
    s = torch.matmul(q, k.transpose(-2, -1)) * scale  # (N, H, Tq, Tk)
    if mask is not None:
        s = s + mask
    if causal:
        tq, tk = s.shape[-2:]
        s = s.masked_fill(torch.ones(tq, tk, dtype=torch.bool, device=s.device).triu(1), torch.finfo(s.dtype).min)
    return s


def _attend_backward(do, q, k, v, out, lse, mask, causal, scale, use_flash):
    """Gradients of one part given the GLOBAL output and log-sum-exp of the merged attention (flash identity:
    dS = P (dP - rowsum(dO * O)) with P = exp(S - lse))."""
    if use_flash:
        return _FLASH[1](do, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=scale)
    p = torch.exp(_scores(q, k, mask, causal, scale) - lse[..., None])
    dv = torch.matmul(p.transpose(-2, -1), do)
    dp = torch.matmul(do, v.transpose(-2, -1))
    ds = p * (dp - (do * out).sum(-1, keepdim=True))
    return torch.matmul(ds, k) * scale, torch.matmul(ds.transpose(-2, -1), q) * scale, dv


def _additive(allowed: torch.Tensor | None, dtype) -> torch.Tensor | None:
    if allowed is None:
        return None
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


def _merge(out, lse, o_p, lse_p):
    """Exact merge of two disjoint key sets by their log-sum-exp."""
    new = torch.logaddexp(lse, lse_p)
    out = out * torch.exp(lse - new)[..., None] + o_p * torch.exp(lse_p - new)[..., None]
    return out, new


# ---------------------------------------------------------------------------------------------------- the layouts
# One implementation per layout of `sparse_layouts.py` (the kinds say which layouts a part is computed in). Each
# piece takes (B, Hg, N, D) queries/keys/values of one head group and returns its output and log-sum-exp over its
# keys; `backward` adds its share of the gradients given the merged output and log-sum-exp.
class _Residue:
    """Strided residue classes: positions p -> (p mod l, p div l); causal (or full) attention over m = N/l tokens,
    on a strided view (B*Hg, l, m, D) of the natural layout (no copy)."""

    def __init__(self, layout: Residue, causal, key_valid, B, Hg, N, dtype):
        self.L, self.m = layout.stride, N // layout.stride
        self.causal = causal
        self.mask = None
        if key_valid is not None:  # (B, N) -> (B*Hg, l, 1, m)
            valid = key_valid.view(B, 1, self.m, self.L).transpose(2, 3).unsqueeze(3)  # (B, 1, l, 1, m)
            self.mask = _additive(valid.expand(B, Hg, self.L, 1, self.m).reshape(B * Hg, self.L, 1, self.m), dtype)

    def _t(self, x):  # (B, Hg, N, D) -> (B*Hg, l, m, D), a strided view
        B, Hg, _, D = x.shape
        return x.view(B, Hg, self.m, self.L, D).permute(0, 1, 3, 2, 4).reshape(B * Hg, self.L, self.m, D)

    def _t_lse(self, x):
        B, Hg, _ = x.shape
        return x.view(B, Hg, self.m, self.L).permute(0, 1, 3, 2).reshape(B * Hg, self.L, self.m)

    def forward(self, q, k, v, scale, use_flash):
        t = self._t
        o, lse = _attend(t(q), t(k), t(v), self.mask, self.causal, scale, use_flash)
        B, Hg, N, D = q.shape
        o = o.view(B, Hg, self.L, self.m, D).transpose(2, 3).reshape(B, Hg, N, D)
        return o, lse.view(B, Hg, self.L, self.m).transpose(2, 3).reshape(B, Hg, N)

    def backward(self, do, q, k, v, out, lse, grads, scale, use_flash):
        t = self._t
        d = _attend_backward(t(do), t(q), t(k), t(v), t(out), self._t_lse(lse), self.mask, self.causal, scale,
                             use_flash)  # fmt: skip
        for g, x in zip(grads, d):
            t(g).add_(x)  # t(g) is a view of g


class _Band:
    """A local band in natural order: query blocks of w positions (w = L/2, L the band's width) against a window of
    keys [b*w - L, b*w + w) (causal) or [b*w - L, b*w + w + L) (bidirectional), taken as a strided view of the padded
    keys (no copy), with the layout's predicate as a mask."""

    def __init__(self, layout: Band, causal, key_valid, B, Hg, N, dtype, device):
        L = layout.width
        w = L // 2 if L % 2 == 0 else L
        self.L, self.w, self.mw = L, w, N // w
        self.back, self.after = L // w, (0 if causal else L // w)
        self.W = (self.back + 1 + self.after) * w
        i = torch.arange(N, device=device).view(self.mw, w, 1)
        j = (torch.arange(self.mw, device=device) * w - L).view(self.mw, 1, 1) + torch.arange(self.W, device=device)
        allowed = layout.allowed(i, j) & (j >= 0) & (j < N)  # (mw, w, W)
        if key_valid is not None:
            allowed = allowed[None] & key_valid[:, j.clamp(0, N - 1)]  # (B, mw, w, W)
            allowed = allowed[:, None].expand(B, Hg, self.mw, w, self.W).reshape(B * Hg, self.mw, w, self.W)
        else:
            allowed = allowed[None]
        self.mask = _additive(allowed, dtype)

    def _q(self, x):  # (B, Hg, N, D) -> (B*Hg, mw, w, D), a view
        B, Hg, N, D = x.shape
        return x.reshape(B * Hg, self.mw, self.w, D)

    def _kv(self, x):  # (B, Hg, N, D) -> (B*Hg, mw, W, D): overlapping windows, a strided view of the padded x
        B, Hg, N, D = x.shape
        xp = F.pad(x, (0, 0, self.L, self.after * self.w))
        Np = xp.shape[2]
        return xp.as_strided((B * Hg, self.mw, self.W, D), (Np * D, self.w * D, D, 1))

    def forward(self, q, k, v, scale, use_flash):
        o, lse = _attend(self._q(q), self._kv(k), self._kv(v), self.mask, False, scale, use_flash)
        return o.reshape(q.shape), lse.reshape(q.shape[:-1])

    backward_chunk_tokens = 4096

    def backward(self, do, q, k, v, out, lse, grads, scale, use_flash):
        """In chunks of query blocks: the flash backward holds the gradients of the overlapping key windows, 1 + L/w
        times the keys' size, so chunking bounds that buffer."""
        B, Hg, N, D = q.shape
        lse_q = lse.reshape(B * Hg, self.mw, self.w)
        qv, dov, outv, kw, vw = self._q(q), self._q(do), self._q(out), self._kv(k), self._kv(v)
        gq, gk, gv = (g.view(B * Hg, self.mw, self.w, D) for g in grads)
        nb = self.back + 1 + self.after
        step = max(1, self.backward_chunk_tokens // self.w)
        for b0 in range(0, self.mw, step):
            b1 = min(self.mw, b0 + step)
            dq, dk, dv = _attend_backward(
                dov[:, b0:b1], qv[:, b0:b1], kw[:, b0:b1], vw[:, b0:b1], outv[:, b0:b1],
                lse_q[:, b0:b1].contiguous(), self.mask[:, b0:b1], False, scale, use_flash,
            )  # fmt: skip
            gq[:, b0:b1] += dq
            for g, d in ((gk, dk), (gv, dv)):  # adjoint of _kv: overlapping windows summed
                d = d.reshape(B * Hg, b1 - b0, nb, self.w, D)
                for s_ in range(nb):  # window slot s_ of query block b holds key block b + s_ - back
                    shift = s_ - self.back
                    lo, hi = max(b0, -shift), min(b1, self.mw - shift)
                    if hi > lo:
                        g[:, lo + shift : hi + shift] += d[:, lo - b0 : hi - b0, s_]


class _Blocks:
    """Block-diagonal attention on the view (B*Hg, m, l, D), restricted by the layout's predicate (offsets within
    the block) when it has one, else the whole block (its lower triangle when causal)."""

    def __init__(self, layout: Blocks, causal, heads, key_valid, B, N, dtype, device):
        L = layout.size
        self.L, self.m = L, N // L
        Hg = len(heads)
        allowed = None  # broadcastable to (B, Hg, m, l, l)
        if layout.allowed is not None:
            i = torch.arange(L, device=device)
            allowed = layout.allowed(i.view(L, 1), i.view(1, L), heads).view(1, -1, 1, L, L)  # (1, Hg | 1, 1, l, l)
        self.causal = causal and layout.allowed is None
        if key_valid is not None:
            kv = key_valid.view(B, 1, self.m, 1, L)
            allowed = kv if allowed is None else allowed & kv
        if allowed is not None and allowed.shape[:2] == (1, 1):
            allowed = allowed[0]
        elif allowed is not None:  # the layout's batch dim is B*Hg
            allowed = allowed.expand(B, Hg, *allowed.shape[2:]).reshape(B * Hg, *allowed.shape[2:])
        self.mask = _additive(allowed, dtype)

    def _t(self, x):  # (B, Hg, N, D) -> (B*Hg, m, l, D), a view
        B, Hg, _, D = x.shape
        return x.reshape(B * Hg, self.m, self.L, D)

    def forward(self, q, k, v, scale, use_flash):
        t = self._t
        o, lse = _attend(t(q), t(k), t(v), self.mask, self.causal, scale, use_flash)
        return o.reshape(q.shape), lse.reshape(q.shape[:-1])

    def backward(self, do, q, k, v, out, lse, grads, scale, use_flash):
        t = self._t
        B, Hg, N, D = q.shape
        lse_t = lse.reshape(B * Hg, self.m, self.L)
        d = _attend_backward(t(do), t(q), t(k), t(v), t(out), lse_t, self.mask, self.causal, scale, use_flash)
        for g, x in zip(grads, d):
            g.add_(x.reshape(B, Hg, N, D))


def _count_below(row: list[int], value: int) -> int:
    """How many entries of the sorted `row` are < `value` (a binary search in plain Python, which torch.compile
    traces; `bisect` is a C builtin it cannot)."""
    lo, hi = 0, len(row)
    while lo < hi:
        mid = (lo + hi) // 2
        if row[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


class _Columns:
    """A compact gathered key set (B, Hg, S, D) at the layout's sorted positions (per head). Causal: query chunks
    [q0, q1) see every key position before q0 without a mask plus the chunk's own key positions (masked j <= i)."""

    def __init__(self, layout: Columns, causal, heads: list[int], key_valid, B, N, dtype, device):
        positions = [layout.positions(head, N) for head in heads]  # Python ints: constants when traced
        self.shared = all(row == positions[0] for row in positions)  # heads that share them gather with one index
        self.pos = torch.tensor(positions[:1] if self.shared else positions, dtype=torch.long, device=device)
        self.causal, self.N, self.dtype = causal, N, dtype
        self.key_valid = None if key_valid is None else key_valid[:, self.pos]  # (B, Hg | 1, S)
        S = len(positions[0])
        self.calls = []  # (q0, q1, s0, s1, additive mask) of each attention call: queries q0:q1, keys s0:s1
        if not causal:
            mask = None if self.key_valid is None else _additive(self.key_valid[:, :, None, :], dtype)
            self.calls.append((0, N, 0, S, mask))
            return
        for q0 in range(0, N, layout.chunk):
            q1 = min(N, q0 + layout.chunk)
            # keys before s0 precede the chunk in every head; keys from s1 on follow it in every head
            s0 = min(_count_below(row, q0) for row in positions)
            s1 = max(_count_below(row, q1) for row in positions)
            if s1 > s0:
                within = self.pos[None, :, None, s0:s1] <= torch.arange(q0, q1, device=device).view(1, 1, -1, 1)
                if self.key_valid is not None:
                    within = within & self.key_valid[:, :, None, s0:s1]
                self.calls.append((q0, q1, s0, s1, _additive(within, dtype)))
            if s0 > 0:
                prefix = None if self.key_valid is None else self.key_valid[:, :, None, :s0]
                self.calls.append((q0, q1, 0, s0, _additive(prefix, dtype)))

    def _gather(self, x):  # (B, Hg, N, D) -> (B, Hg, S, D)
        if self.shared:
            return x.index_select(2, self.pos[0])
        B, Hg, _, D = x.shape
        return x.gather(2, self.pos[None, :, :, None].expand(B, Hg, -1, D))

    def _scatter(self, g, d):  # g (B, Hg, N, D) += adjoint of _gather(d)
        if self.shared:
            g.index_add_(2, self.pos[0], d)
            return
        B, Hg, _, D = g.shape
        g.scatter_add_(2, self.pos[None, :, :, None].expand(B, Hg, -1, D), d)

    def forward(self, q, k, v, scale, use_flash):
        ks, vs = self._gather(k), self._gather(v)
        B, Hg, N, D = q.shape
        out = q.new_zeros(B, Hg, N, D)
        lse_dtype = torch.promote_types(q.dtype, torch.float32)  # as the flash ops return it
        lse = q.new_full((B, Hg, N), torch.finfo(lse_dtype).min, dtype=lse_dtype)
        for q0, q1, s0, s1, mask in self.calls:
            o_c, lse_c = _attend(q[:, :, q0:q1], ks[:, :, s0:s1], vs[:, :, s0:s1], mask, False, scale, use_flash)
            out[:, :, q0:q1], lse[:, :, q0:q1] = _merge(out[:, :, q0:q1], lse[:, :, q0:q1], o_c, lse_c)
        return out, lse

    def backward(self, do, q, k, v, out, lse, grads, scale, use_flash):
        ks, vs = self._gather(k), self._gather(v)
        dks, dvs = torch.zeros_like(ks), torch.zeros_like(vs)
        for q0, q1, s0, s1, mask in self.calls:
            dq, dk, dv = _attend_backward(
                do[:, :, q0:q1], q[:, :, q0:q1], ks[:, :, s0:s1], vs[:, :, s0:s1], out[:, :, q0:q1],
                lse[:, :, q0:q1].contiguous(), mask, False, scale, use_flash,
            )  # fmt: skip
            grads[0][:, :, q0:q1] += dq
            dks[:, :, s0:s1] += dk
            dvs[:, :, s0:s1] += dv
        self._scatter(grads[1], dks)
        self._scatter(grads[2], dvs)


class _Rows:
    """The first `count` queries against every key from `first_key` on (padding keys masked)."""

    def __init__(self, layout: Rows, key_valid, dtype):
        self.count, self.first = layout.count, layout.first_key
        self.mask = None if key_valid is None else _additive(key_valid[:, None, None, self.first :], dtype)

    def forward(self, q, k, v, scale, use_flash):
        B, Hg, N, D = q.shape
        r, f = self.count, self.first
        o_r, lse_r = _attend(q[:, :, :r], k[:, :, f:], v[:, :, f:], self.mask, False, scale, use_flash)
        lse_dtype = torch.promote_types(q.dtype, torch.float32)
        out = q.new_zeros(B, Hg, N, D)
        lse = q.new_full((B, Hg, N), torch.finfo(lse_dtype).min, dtype=lse_dtype)
        out[:, :, :r], lse[:, :, :r] = o_r, lse_r
        return out, lse

    def backward(self, do, q, k, v, out, lse, grads, scale, use_flash):
        r, f = self.count, self.first
        dq, dk, dv = _attend_backward(
            do[:, :, :r], q[:, :, :r], k[:, :, f:], v[:, :, f:], out[:, :, :r], lse[:, :, :r].contiguous(),
            self.mask, False, scale, use_flash,
        )  # fmt: skip
        grads[0][:, :, :r] += dq
        grads[1][:, :, f:] += dk
        grads[2][:, :, f:] += dv


class _Diagonal:
    """Rows whose diagonal no other piece covers (padding keys; a standalone part that lacks it): attend to j = i."""

    def __init__(self, rows):
        self.rows = rows  # bool, broadcastable to (B, Hg, N)

    @staticmethod
    def _score(q, k, scale):
        dtype = torch.promote_types(q.dtype, torch.float32)
        return (q.to(dtype) * k.to(dtype)).sum(-1) * scale  # (B, Hg, N)

    def forward(self, q, k, v, scale, use_flash):
        s = self._score(q, k, scale)
        lse = torch.where(self.rows, s, torch.finfo(s.dtype).min)
        return torch.where(self.rows[..., None], v, 0.0), lse

    def backward(self, do, q, k, v, out, lse, grads, scale, use_flash):
        s = self._score(q, k, scale)
        p = torch.where(self.rows, torch.exp(s - lse), 0.0)[..., None].to(q.dtype)  # (B, Hg, N, 1)
        ds = p * ((do * v).sum(-1, keepdim=True) - (do * out).sum(-1, keepdim=True))
        grads[0] += ds * k * scale
        grads[1] += ds * q * scale
        grads[2] += p * do


def _piece(layout, causal, head_list, heads, key_valid, B, N, dtype, device):
    """The implementation of one layout for the head group `head_list` (also as a LongTensor `heads`).

    Layouts are told apart by their class name, not their class: a copy of this code loaded as remote code in the
    same process registers its kernels under the same names, and then runs the package's models (and the reverse)."""
    kind = type(layout).__name__
    if kind == "Band":
        return _Band(layout, causal, key_valid, B, len(head_list), N, dtype, device)
    if kind == "Residue":
        return _Residue(layout, causal, key_valid, B, len(head_list), N, dtype)
    if kind == "Blocks":
        return _Blocks(layout, causal, heads, key_valid, B, N, dtype, device)
    if kind == "Columns":
        return _Columns(layout, causal, head_list, key_valid, B, N, dtype, device)
    if kind == "Rows":
        return _Rows(layout, key_valid, dtype)
    raise TypeError(f"No block-sparse implementation of the layout {kind}.")


# ------------------------------------------------------------------------------------------------------- the plan
class _Plan:
    """Per head group (heads that use the same part, or the merged pattern), the pieces to compute and merge."""

    def __init__(self, pattern, head_parts, key_valid, B, N, dtype, device, scale, use_flash):
        self.scale, self.use_flash = scale, use_flash
        self.groups = []  # (head indices or None for all, pieces)
        by_part: dict = {}
        for h, part in enumerate(head_parts):
            by_part.setdefault(part, []).append(h)
        for part, heads in by_part.items():
            head_index = torch.as_tensor(heads, device=device)
            pieces = []
            diagonal = None if key_valid is None else ~key_valid[:, None, :]  # (B, 1, N): padding keys
            for layout in pattern.layouts(part, heads, N):
                if type(layout).__name__ == "Diagonal":  # by name: see `_piece`
                    rows = layout.rows(head_index, N).to(device)[None]  # (1, Hg | 1, N)
                    diagonal = rows if diagonal is None else diagonal | rows
                else:
                    pieces.append(_piece(layout, pattern.causal, heads, head_index, key_valid, B, N, dtype, device))
            if diagonal is not None:
                pieces.append(_Diagonal(diagonal))
            self.groups.append((None if len(heads) == len(head_parts) else head_index, pieces))

    def forward(self, q, k, v):
        out, lse = torch.empty_like(q), None
        for heads, pieces in self.groups:
            qg, kg, vg = (x if heads is None else x.index_select(1, heads) for x in (q, k, v))
            og, lg = pieces[0].forward(qg, kg, vg, self.scale, self.use_flash)
            for piece in pieces[1:]:
                og, lg = _merge(og, lg, *piece.forward(qg, kg, vg, self.scale, self.use_flash))
            if heads is None:
                out, lse = og.to(q.dtype), lg
            else:
                lse = lg.new_empty(q.shape[:-1]) if lse is None else lse
                out[:, heads], lse[:, heads] = og.to(q.dtype), lg
        return out, lse

    def backward(self, do, q, k, v, out, lse):
        if len(self.groups) == 1 and self.groups[0][0] is None:
            grads = [torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)]
            for piece in self.groups[0][1]:
                piece.backward(do, q, k, v, out, lse, grads, self.scale, self.use_flash)
            return grads
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for heads, pieces in self.groups:
            args = [x.index_select(1, heads).contiguous() for x in (do, q, k, v, out, lse)]
            grads = [torch.zeros_like(args[1]) for _ in range(3)]
            for piece in pieces:
                piece.backward(*args, grads, self.scale, self.use_flash)
            for g, d in zip((dq, dk, dv), grads):
                g[:, heads] += d
        return dq, dk, dv


class _BlockSparseFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan):
        out, lse = plan.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.plan.backward(dout.contiguous(), q, k, v, out, lse)
        return dq, dk, dv, None


# -------------------------------------------------------------------------------------------------- public functions
def _padding_mask_2d(attention_mask, batch: int, kv_len: int, kernel: str) -> torch.Tensor | None:
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape != (batch, kv_len):
        raise ValueError(
            f"{kernel} expects a 2-D padding mask of shape (batch, kv_length)=({batch}, {kv_len}) (True = real "
            f"token), got shape {tuple(attention_mask.shape)}; register the kernel's mask function so transformers "
            "builds it."
        )
    return attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0


def _mode(pattern: SparsePattern, mode: str | None) -> str:
    mode = pattern.mode if mode is None else mode
    check_mode(mode)
    return mode


def _check_qkv(query, key, value):
    if query.dim() != 4 or key.shape != value.shape or query.shape[:2] != key.shape[:2] or key.dim() != 4:
        raise ValueError(
            f"query/key/value must be (B, H, T, D) with matching B, H; got {tuple(query.shape)}, {tuple(key.shape)}, "
            f"{tuple(value.shape)}."
        )
    if query.shape[2] > key.shape[2]:
        raise ValueError(f"More queries ({query.shape[2]}) than keys ({key.shape[2]}).")


def sparse_allowed_mask(
    pattern: SparsePattern, mode: str, layer_idx: int, q_len: int, kv_len: int, num_heads: int,
    padding_mask: torch.Tensor | None = None, device=None,
) -> torch.Tensor:  # fmt: skip
    """Boolean (B or 1, H, Tq, Tk) mask: the layer's pattern AND (real key OR diagonal); queries are the last Tq."""
    q = torch.arange(kv_len - q_len, kv_len, device=device).view(-1, 1)  # (Tq, 1)
    k = torch.arange(kv_len, device=device).view(1, -1)  # (1, Tk)
    allowed = pattern.heads_mask(pattern.head_parts(mode, layer_idx, num_heads), q, k)
    allowed = allowed.expand(num_heads, q_len, kv_len)[None]  # (1, H, Tq, Tk)
    if padding_mask is not None:
        allowed = allowed & (padding_mask[:, None, None, :] | (q == k)[None, None])
    return allowed


def dense_sparse_attention(
    query, key, value, pattern: SparsePattern, mode: str | None = None, layer_idx: int = 0,
    padding_mask: torch.Tensor | None = None, scaling: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """Dense masked reference, (B, H, Tq, D) -> (B, H, Tq, D); `mode` None is the pattern's own."""
    mode = _mode(pattern, mode)
    _check_qkv(query, key, value)
    allowed = sparse_allowed_mask(
        pattern, mode, layer_idx, query.shape[2], key.shape[2], query.shape[1], padding_mask, query.device
    )
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)


def block_sparse_attention(
    query, key, value, pattern: SparsePattern, mode: str | None = None, layer_idx: int = 0,
    padding_mask: torch.Tensor | None = None, scaling: float | None = None, use_flash: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """O(n sqrt(n)) exact sparse attention with forward and backward, (B, H, T, D) -> (B, H, T, D).

    `use_flash`: None = the private flash-for-cpu ops when available (schema pinned) for this dtype and the inputs
    are on the CPU (the ops have no other device's kernel); False = the plain-PyTorch path (same parts and merge).
    `mode` None is the pattern's own."""
    mode = _mode(pattern, mode)
    _check_qkv(query, key, value)
    B, H, n, D = query.shape
    if key.shape[2] != n:  # cached decoding: a few queries against the cache
        return dense_sparse_attention(query, key, value, pattern, mode, layer_idx, padding_mask, scaling)
    head_parts = pattern.head_parts(mode, layer_idx, H)
    if use_flash is None:
        use_flash = FLASH_OPS_AVAILABLE and query.device.type == "cpu" and query.dtype in _FLASH_DTYPES
    elif use_flash and not FLASH_OPS_AVAILABLE:
        raise ValueError("use_flash=True but the private CPU flash ops are missing or their schema changed.")
    scale = D**-0.5 if scaling is None else scaling
    L = pattern.stride
    N = -(-n // L) * L
    key_valid = None
    if padding_mask is not None:
        key_valid = F.pad(padding_mask.to(torch.bool), (0, N - n), value=False)
    elif N != n and not pattern.causal:  # the internal tail must be masked when keys after i are visible
        key_valid = (torch.arange(N, device=query.device) < n).expand(B, N).contiguous()
    plan = _Plan(pattern, head_parts, key_valid, B, N, query.dtype, query.device, scale, use_flash)
    q, k, v = (x.contiguous() if N == n else F.pad(x, (0, 0, 0, N - n)) for x in (query, key, value))
    out = _BlockSparseFunction.apply(q, k, v, plan)
    return out[:, :, :n]


def flex_sparse_attention(
    query,
    key,
    value,
    pattern: SparsePattern,
    mode: str | None = None,
    layer_idx: int = 0,
    padding_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    block_size: int = 128,
    compile: bool = True,
) -> torch.Tensor:
    """flex_attention with a per-head BlockMask built from the layer's parts (and padding), (B, H, T, D) ->
    (B, H, T, D). One call in natural order: blocks that no part touches are skipped (for the strided pattern only
    the causal half: see docs/families/sparse.md); `compile=False` runs flex's eager reference (tests).

    On CPU flex_attention has no backward: a call that needs gradients there raises ValueError (the registered
    kernel falls back to "sparse_block" instead)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mode = _mode(pattern, mode)
    _check_qkv(query, key, value)
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    if query.device.type == "cpu" and needs_grad:
        raise ValueError("flex_attention has no backward on CPU: use 'sparse_block' for CPU training.")
    if not needs_grad:  # flex refuses CPU inputs that require grad even under no_grad
        query, key, value = query.detach(), key.detach(), value.detach()
    B, H, n, D = query.shape
    q_off = key.shape[2] - n
    pad = None if padding_mask is None else padding_mask.to(torch.bool)
    mask_mod = pattern.flex_mask_mod(pattern.head_parts(mode, layer_idx, H), q_off, pad)
    block_mask = create_block_mask(
        mask_mod, B if pad is not None else None, H, n, key.shape[2], device=query.device, BLOCK_SIZE=block_size
    )
    fn = _compiled_flex(flex_attention) if compile else flex_attention
    return fn(query, key, value, block_mask=block_mask, scale=scaling)


_FLEX = {}


def _compiled_flex(flex_attention):
    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


# ---------------------------------------------------------------------------------------- attention-interface kernels
def _module_settings(module, kwargs, kernel: str):
    pattern = kwargs.get("sparse_pattern", getattr(module, "sparse_pattern", None))
    # By name, not class (see `_piece`): the pattern may come from a remote-code copy of sparse_layouts.py.
    if type(pattern).__name__ != "SparsePattern":
        raise ValueError(
            f"The {kernel!r} attention kernel needs `module.sparse_pattern` (a SparsePattern) on "
            f"{type(module).__name__}, got {pattern!r}."
        )
    mode = kwargs.get("sparse_mode", getattr(module, "sparse_mode", None)) or pattern.mode
    layer_idx = kwargs.get("layer_idx", getattr(module, "layer_idx", 0)) or 0
    return pattern, mode, layer_idx


def sparse_dense_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    is_causal: bool | None = None, **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The dense masked reference; returns (B, T, H, D) and the attention weights."""
    pattern, mode, layer_idx = _module_settings(module, kwargs, "sparse_dense")
    check_mode(mode)
    _check_qkv(query, key, value)
    B, H, Tq, _ = query.shape
    Tk = key.shape[2]
    padding = None
    extra = None
    if attention_mask is not None and attention_mask.dim() == 4:
        extra = attention_mask[..., :Tk] if attention_mask.dtype == torch.bool else attention_mask[..., :Tk] == 0
    else:
        padding = _padding_mask_2d(attention_mask, B, Tk, "sparse_dense")
    allowed = sparse_allowed_mask(pattern, mode, layer_idx, Tq, Tk, H, padding, query.device)
    if extra is not None:
        allowed = allowed & extra
    return eager_attention_forward(module, query, key, value, allowed, scaling=scaling, dropout=dropout)


def sparse_block_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    is_causal: bool | None = None, **kwargs,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """O(n sqrt(n)) CPU kernel; returns (B, T, H, D) and None."""
    if dropout > 0.0 and module.training:
        _log_once("sparse_block has no attention dropout: falling back to the sparse_dense reference kernel.")
        return sparse_dense_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    pattern, mode, layer_idx = _module_settings(module, kwargs, "sparse_block")
    padding = _padding_mask_2d(attention_mask, query.shape[0], key.shape[2], "sparse_block")
    out = block_sparse_attention(query, key, value, pattern, mode, layer_idx, padding, scaling)
    return out.transpose(1, 2).contiguous(), None


def sparse_flex_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    is_causal: bool | None = None, **kwargs,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """flex_attention kernel; where flex cannot run the inputs (on CPU with gradients, heads under 16 dimensions on a
    GPU: `flex_attention_refusal`) it falls back to sparse_block, and with attention dropout to sparse_dense."""
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    refusal = flex_attention_refusal(query.device.type, query.shape[-1], needs_grad)
    if refusal is not None:
        _log_once(f"sparse_flex: {refusal}, falling back to sparse_block.")
        return sparse_block_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if dropout > 0.0 and module.training:
        _log_once("sparse_flex: flex_attention has no attention dropout, falling back to sparse_dense.")
        return sparse_dense_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    pattern, mode, layer_idx = _module_settings(module, kwargs, "sparse_flex")
    padding = _padding_mask_2d(attention_mask, query.shape[0], key.shape[2], "sparse_flex")
    if query.shape[2] != key.shape[2]:  # cached decoding: every new length would recompile flex
        out = block_sparse_attention(query, key, value, pattern, mode, layer_idx, padding, scaling)
        return out.transpose(1, 2).contiguous(), None
    out = flex_sparse_attention(query, key, value, pattern, mode, layer_idx, padding, scaling)
    return out.transpose(1, 2).contiguous(), None


SPARSE_KERNELS = {
    "sparse_dense": sparse_dense_attention_forward,
    "sparse_block": sparse_block_attention_forward,
    "sparse_flex": sparse_flex_attention_forward,
}
