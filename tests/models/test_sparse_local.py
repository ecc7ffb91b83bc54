"""The sliding-window ("local") pattern: against a brute-force definition, against transformers' own sliding-window
mask functions (Mistral's causal window, the bidirectional window), and through every kernel and cached decoding."""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import sliding_window_bidirectional_mask_function, sliding_window_causal_mask_function

from hf_vit_plus.models.sparse_attention import block_sparse_attention, dense_sparse_attention, flex_sparse_attention
from hf_vit_plus.models.sparse_layouts import ATTENTION_TYPES, SparsePattern, build_pattern, mask_for_layer
from tests.models.test_sparse_kernels import assert_close_with_grads, qkv, reference


def brute_force(window: int, global_tokens: int, causal: bool, n: int) -> torch.Tensor:
    """Longformer's pattern written as loops: a window of `window` keys on each allowed side, and `global_tokens`
    tokens at the start that every query sees (and that see every token, bidirectional)."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            if causal and j > i:
                continue
            near = 0 <= i - j <= window if causal else abs(i - j) <= window
            is_global = j < global_tokens or (not causal and i < global_tokens)
            mask[i, j] = near or is_global
    return mask


def transformers_mask(mask_function, n: int) -> torch.Tensor:
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return mask_function(0, 0, i, j).expand(n, n)


CASES = [(1, 0), (3, 0), (4, 1), (4, 3), (6, 2)]  # (window w, global tokens g)


def test_local_is_registered_and_selectable():
    assert "local" in ATTENTION_TYPES
    assert build_pattern("local", 4, 2, num_summary_blocks=5).num_summary_blocks == 1  # not read: dropped
    with pytest.raises(ValueError, match="`sparse_num_summary_blocks`=2 only applies to the 'fixed' pattern"):
        SparsePattern("local", 4, 1, 2)


@pytest.mark.parametrize("window,global_tokens", CASES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 9, 20])
def test_mask_matches_the_definition(window, global_tokens, causal, n):
    pattern = build_pattern("local", window, global_tokens, causal=causal)
    expected = brute_force(window, global_tokens, causal, n)
    assert torch.equal(pattern.dense_mask(n, num_heads=2), expected.expand(2, n, n))
    assert pattern.num_parts == (2 if global_tokens else 1)


@pytest.mark.parametrize("window", [1, 3, 8])
def test_without_global_tokens_it_is_transformers_sliding_window(window):
    """Mistral's causal sliding window of s keys (the query included) is w = s - 1 here; transformers' bidirectional
    window |i - j| <= s is w = s."""
    n = 23
    causal = build_pattern("local", window, causal=True).dense_mask(n)[0]
    assert torch.equal(causal, transformers_mask(sliding_window_causal_mask_function(window + 1), n))
    both_ways = build_pattern("local", window, causal=False).dense_mask(n)[0]
    assert torch.equal(both_ways, transformers_mask(sliding_window_bidirectional_mask_function(window), n))


@pytest.mark.parametrize("window,global_tokens", [(4, 1), (6, 2)])
@pytest.mark.parametrize("causal", [True, False])
def test_parts_are_disjoint_cover_the_pattern_and_keep_the_diagonal(window, global_tokens, causal):
    pattern = build_pattern("local", window, global_tokens, causal=causal)
    n = 29
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    parts = pattern.parts()
    assert [p.name for p in parts] == ["window", "global"]
    exclusive = [p.exclusive(i, j).expand(n, n) for p in parts]
    assert not (exclusive[0] & exclusive[1]).any()
    assert not exclusive[0][:, :global_tokens].any()  # the global part owns the global tokens (the kernel's layout)
    assert torch.equal(exclusive[0] | exclusive[1], pattern.dense_mask(n)[0])
    for part in parts:
        standalone = pattern.part_mask(part.index, n)[0]
        assert standalone.diagonal().all()
        assert not (standalone & ~pattern.dense_mask(n)[0] & ~torch.eye(n, dtype=torch.bool)).any()


@pytest.mark.parametrize("window,global_tokens", CASES)
def test_key_indices_for_cached_decoding(window, global_tokens):
    pattern = build_pattern("local", window, global_tokens)
    n = 25
    for part in [None, *range(pattern.num_parts)]:
        mask = pattern.dense_mask(n) if part is None else pattern.part_mask(part, n)
        for i in range(n):
            got = pattern.key_indices(i, part_index=part)
            assert got.tolist() == mask[0, i].nonzero().flatten().tolist(), (part, i)
    assert len(build_pattern("local", 128, 4).key_indices(16383)) == 129 + 4  # O(w + g) keys, whatever the length


@pytest.mark.parametrize("window,global_tokens", [(4, 0), (4, 2), (5, 3)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode,layer", [("merged", 0), ("interleaved", 1), ("heads", 0)])
@pytest.mark.parametrize("padded", [False, True])
def test_block_and_dense_kernels_match_the_reference(window, global_tokens, causal, mode, layer, padded):
    pattern = build_pattern("local", window, global_tokens, causal=causal)
    n = 37  # not a multiple of the window: the kernel pads
    padding = None
    if padded:
        padding = torch.ones(2, n, dtype=torch.bool)
        padding[0, :6] = False  # left padding over the global tokens
    inputs = qkv(2, 4, n)
    for fn in (block_sparse_attention, dense_sparse_attention):
        assert_close_with_grads(
            lambda q, k, v, fn=fn: fn(q, k, v, pattern, mode, layer, padding),
            lambda q, k, v: reference(q, k, v, pattern, mode, layer, padding),
            inputs,
        )
    # the flash-op and public paths of the block kernel agree
    for use_flash in (True, False):
        assert_close_with_grads(
            lambda q, k, v, use_flash=use_flash: block_sparse_attention(
                q, k, v, pattern, mode, layer, padding, use_flash=use_flash
            ),
            lambda q, k, v: reference(q, k, v, pattern, mode, layer, padding),
            inputs,
        )


@pytest.mark.parametrize("causal", [True, False])
def test_flex_mask_matches_the_reference(causal):
    pattern = build_pattern("local", 4, 2, causal=causal, mode="heads")
    q, k, v = (x.detach() for x in qkv(1, 4, 48))
    with torch.no_grad():
        out = flex_sparse_attention(q, k, v, pattern, compile=False)
        torch.testing.assert_close(out, reference(q, k, v, pattern, "heads", 0), atol=1e-5, rtol=0)


def test_a_layer_mask_sees_every_row():
    pattern = build_pattern("local", 3, 1)
    for mode in ("merged", "interleaved", "heads"):
        for layer in range(2):
            assert mask_for_layer(pattern, mode, layer, 16, 4).any(-1).all()
