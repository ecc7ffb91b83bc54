"""Sparse Transformer patterns against brute-force definitions (Child et al. 2019, sec. 4.2) and against independent
re-derivations of the openai/sparse_attention (`get_attn_mask`) and DeepSpeed `FixedSparsityConfig` layouts."""

from __future__ import annotations

import pytest
import torch

from hf_vit_plus.models.sparse_layouts import (
    SparsePattern,
    allowed_key_indices,
    build_pattern,
    mask_for_layer,
)


def brute_force(kind, stride, c, k, causal, n, num_heads):
    """The paper's sets written as plain Python loops (0-indexed)."""
    mask = torch.zeros(num_heads, n, n, dtype=torch.bool)
    for h in range(num_heads):
        r = h % k
        summary = set(range(stride - (r + 1) * c, stride - r * c))
        for i in range(n):
            for j in range(n):
                if causal and j > i:
                    continue
                if kind == "strided":
                    near = (0 <= i - j <= stride) if causal else abs(i - j) <= stride
                    ok = near or (i - j) % stride == 0
                else:
                    ok = i // stride == j // stride or j % stride in summary
                mask[h, i, j] = ok
    return mask


CASES = [
    ("strided", 1, 0, 1),
    ("strided", 3, 0, 1),
    ("strided", 4, 0, 1),
    ("fixed", 4, 1, 1),
    ("fixed", 4, 2, 2),
    ("fixed", 6, 2, 3),
    ("fixed", 5, 5, 1),
]


@pytest.mark.parametrize("kind,stride,c,k", CASES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 7, 13, 24])
def test_dense_mask_matches_brute_force(kind, stride, c, k, causal, n):
    pattern = SparsePattern(kind, stride, c, k, causal)
    expected = brute_force(kind, stride, c, k, causal, n, num_heads=3)
    assert torch.equal(pattern.dense_mask(n, num_heads=3), expected)
    # the predicate broadcasts over integer tensors and plain ints alike
    assert bool(pattern.allowed(5, 5)) and pattern.allowed(torch.arange(4)[:, None], torch.arange(4)).shape == (4, 4)


@pytest.mark.parametrize("kind,stride,c,k", CASES)
@pytest.mark.parametrize("causal", [True, False])
def test_parts_are_disjoint_cover_the_pattern_and_keep_the_diagonal(kind, stride, c, k, causal):
    pattern = SparsePattern(kind, stride, c, k, causal)
    n, heads = 29, 3
    i, j, h = torch.arange(n)[None, :, None], torch.arange(n)[None, None, :], torch.arange(heads)[:, None, None]
    parts = pattern.parts()
    assert [p.name for p in parts] == (["band", "residue"] if kind == "strided" else ["block", "summary"])
    exclusive = [p.exclusive(i, j, h).expand(heads, n, n) for p in parts]
    assert not (exclusive[0] & exclusive[1]).any()
    assert torch.equal(exclusive[0] | exclusive[1], pattern.dense_mask(n, heads))
    for part in parts:
        standalone = pattern.part_mask(part.index, n, heads)
        assert torch.equal(standalone, part.allowed(i, j, h).expand(heads, n, n))
        assert standalone.diagonal(dim1=1, dim2=2).all()  # no row is ever empty
        assert not (standalone & ~pattern.dense_mask(n, heads) & ~torch.eye(n, dtype=torch.bool)).any()
    # the standalone parts are the paper's A^(1), A^(2) (the summary part gains only the diagonal)
    if kind == "strided":
        band = (i - j >= 0) & (i - j <= stride) if causal else (i - j).abs() <= stride
        assert torch.equal(pattern.part_mask(0, n, heads), band.expand(heads, n, n))
    else:
        own = (i // stride == j // stride) & ((j <= i) | (not causal))
        assert torch.equal(pattern.part_mask(0, n, heads), own.expand(heads, n, n))


def openai_style_strided(n, stride):
    """Re-derivation of openai/sparse_attention get_attn_mask: 'local' keeps a band of `stride` positions
    (i - j in [0, stride - 1]) and 'strided' keeps q >= k with (q - k) mod stride == 0; the merged head is their
    union."""
    q = torch.arange(n)[:, None]
    kk = torch.arange(n)[None, :]
    local = (q - kk >= 0) & (q - kk <= min(n - 1, stride - 1))
    strided = (q >= kk) & ((q - kk) % stride == 0)
    return local | strided


@pytest.mark.parametrize("n,stride", [(16, 4), (30, 5), (64, 8), (9, 1)])
def test_strided_matches_openai_sparse_attention(n, stride):
    assert torch.equal(build_pattern("strided", stride).dense_mask(n)[0], openai_style_strided(n, stride))


def deepspeed_style_fixed(num_heads, n, block, num_local_blocks, num_global_blocks, unidirectional, num_patterns):
    """Re-derivation of DeepSpeed FixedSparsityConfig (no horizontal global attention): a (heads, blocks, blocks)
    layout with local windows of `num_local_blocks` blocks (lower-triangular when unidirectional) and, per head,
    the global block `num_local_blocks - (1 + h % num_patterns) * num_global_blocks` of every window as columns
    (from its own row on when unidirectional, for all rows otherwise); expanded to elements and ANDed with the
    element causal mask when unidirectional."""
    nb = n // block
    layout = torch.zeros(num_heads, nb, nb, dtype=torch.bool)
    for h in range(num_heads):
        for start in range(0, nb, num_local_blocks):
            for row in range(start, min(start + num_local_blocks, nb)):
                stop = row + 1 if unidirectional else min(start + num_local_blocks, nb)
                layout[h, row, start:stop] = True
        first = num_local_blocks - (1 + h % num_patterns) * num_global_blocks
        for g in range(first, nb, num_local_blocks):
            layout[h, (g if unidirectional else 0) :, g : g + num_global_blocks] = True
    mask = layout.repeat_interleave(block, 1).repeat_interleave(block, 2)
    if unidirectional:
        mask &= torch.ones(n, n, dtype=torch.bool).tril()
    return mask


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("stride,c,k,n", [(8, 2, 1, 32), (8, 2, 4, 48), (12, 4, 3, 36), (4, 4, 1, 16)])
def test_fixed_matches_deepspeed_fixed_sparsity_config(causal, stride, c, k, n):
    pattern = build_pattern("fixed", stride, c, k, causal)
    expected = deepspeed_style_fixed(5, n, c, stride // c, 1, causal, k)
    assert torch.equal(pattern.dense_mask(n, num_heads=5), expected)


def test_modes_over_the_network():
    pattern = build_pattern("fixed", 4, 1, 2)
    n, heads = 12, 4
    assert torch.equal(mask_for_layer(pattern, "merged", 3, n, heads), pattern.dense_mask(n, heads))
    for layer in range(4):
        assert torch.equal(
            mask_for_layer(pattern, "interleaved", layer, n, heads), pattern.part_mask(layer % 2, n, heads)
        )
    per_head = mask_for_layer(pattern, "heads", 0, n, heads)
    for h in range(heads):
        assert torch.equal(per_head[h], pattern.part_mask(h % 2, n, heads)[h])
    assert pattern.head_parts("heads", 5, heads) == [0, 1, 0, 1]
    assert pattern.head_parts("interleaved", 5, heads) == [1] * heads
    assert pattern.head_parts("merged", 5, heads) == [None] * heads
    for mode in ("merged", "interleaved", "heads"):
        for layer in range(2):
            assert mask_for_layer(pattern, mode, layer, n, heads).any(-1).all()


@pytest.mark.parametrize("kind,stride,c,k", [("strided", 4, 0, 1), ("fixed", 4, 1, 2), ("fixed", 6, 2, 3)])
def test_allowed_key_indices_for_cached_decoding(kind, stride, c, k):
    pattern = build_pattern(kind, stride, c, k)
    n, heads = 27, 3
    for part in (None, 0, 1):
        mask = pattern.dense_mask(n, heads) if part is None else pattern.part_mask(part, n, heads)
        for h in range(heads):
            for i in range(n):
                got = allowed_key_indices(pattern, i, head=h, part_index=part)
                assert got.tolist() == mask[h, i].nonzero().flatten().tolist(), (part, h, i)
    # strided: window tail + residue class, l + floor(i / l) keys (plus one once the window is full)
    assert len(allowed_key_indices(build_pattern("strided", 128), 16383)) == 128 + 16383 // 128


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(kind="strided", stride=0), "`sparse_stride` must be a positive integer, got 0"),
        (dict(kind="strided", stride=-3), "`sparse_stride` must be a positive integer, got -3"),
        (dict(kind="fixed", stride=8, summary_size=9), "`sparse_summary_size`=9 and `sparse_stride`=8"),
        (dict(kind="fixed", stride=8, summary_size=0), "`sparse_summary_size`=0"),
        (dict(kind="fixed", stride=8, summary_size=4, num_summary_blocks=3), r"\(4\) x .* \(3\) = 12 .*\(8\)"),
        (dict(kind="dilated", stride=8), "'dilated'"),
        (dict(kind="dense", stride=8), "Unknown `attention_type` 'dense'"),
        (dict(kind="strided", stride=8, mode="stacked"), "'stacked'"),
        (dict(kind="strided", stride=8, num_summary_blocks=2), "`sparse_num_summary_blocks`=2 only applies"),
        (dict(kind="fixed", stride=8, summary_size=2, num_summary_blocks=0), "`sparse_num_summary_blocks` must be"),
        (dict(kind="fixed", stride=8, summary_size=9, field_prefix="encoder_"), "`encoder_sparse_summary_size`=9"),
    ],
)
def test_bad_patterns_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SparsePattern(**kwargs)


def test_bad_usage_raises():
    pattern = build_pattern("strided", 4, summary_size=99)  # summary_size is ignored for strided
    assert pattern.summary_size == 0
    with pytest.raises(ValueError, match="num_heads=3"):
        pattern.head_parts("heads", 0, 3)
    with pytest.raises(ValueError, match="'stacked'"):
        mask_for_layer(pattern, "stacked", 0, 8, 2)
    with pytest.raises(ValueError, match="part_index"):
        pattern.part_mask(2, 8)
    with pytest.raises(ValueError, match="bidirectional"):
        allowed_key_indices(build_pattern("strided", 4, causal=False), 5)


def test_check_fits_names_the_fields():
    pattern = SparsePattern("strided", 8, mode="heads")
    pattern.check_fits(num_heads=4, max_length=8)
    with pytest.raises(ValueError, match=r"`sparse_stride` \(8\) is longer than the sequence, at most `n` \(7\)"):
        pattern.check_fits(num_heads=4, max_length=7, length_field="n")
    with pytest.raises(ValueError, match=r"`encoder_sparse_pattern_mode`='heads'.*`heads` \(3\) must be divisible"):
        pattern.check_fits(num_heads=3, max_length=8, heads_field="heads", field_prefix="encoder_")


def test_the_paper_parts_are_the_standalone_parts_without_the_added_diagonal():
    n = 20
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    for pattern in (SparsePattern("strided", 4), SparsePattern("fixed", 4, 1, 2, causal=False)):
        for part in pattern.parts():
            defined = part.defined(i, j, 1).expand(n, n)
            assert torch.equal(defined | torch.eye(n, dtype=torch.bool), part.allowed(i, j, 1).expand(n, n))
    summary = SparsePattern("fixed", 4, 1).parts()[1]
    assert summary.defined(10, torch.arange(12)).nonzero().flatten().tolist() == [3, 7]  # not the diagonal 10
