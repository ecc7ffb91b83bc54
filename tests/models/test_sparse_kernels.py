"""Every sparse attention kernel against the dense masked reference, forward and backward."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from hf_vit_plus.models import sparse_attention as sa
from hf_vit_plus.models.sparse_attention import (
    FLASH_OPS_AVAILABLE,
    SPARSE_KERNELS,
    block_sparse_attention,
    dense_sparse_attention,
    flex_sparse_attention,
    sparse_padding_mask,
)
from hf_vit_plus.models.sparse_layouts import PATTERN_KINDS, PATTERNS, build_pattern

TOL = 1e-5  # fp32, outputs and input gradients


def patterns(causal):
    """Every registered pattern, stride 8, its default second setting, two summary blocks where it has them."""
    return {
        kind: build_pattern(kind, 8, **PATTERNS[kind].default_settings(8), num_summary_blocks=2, causal=causal)
        for kind in PATTERN_KINDS
    }


def qkv(B, H, n, D=16, q_len=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, q_len or n, D, generator=g, requires_grad=True)
    k, v = (torch.randn(B, H, n, D, generator=g, requires_grad=True) for _ in range(2))
    return q, k, v


def reference(q, k, v, pattern, mode, layer, padding=None):
    """Written from the definition: softmax over the allowed keys of `mask_for_layer`, padding keys masked except
    the diagonal."""
    from hf_vit_plus.models.sparse_layouts import mask_for_layer

    n = k.shape[2]
    allowed = mask_for_layer(pattern, mode, layer, n, q.shape[1])[None, :, n - q.shape[2] :]  # (1, H, Tq, Tk)
    if padding is not None:
        eye = torch.eye(n, dtype=torch.bool)[n - q.shape[2] :]
        allowed = allowed & (padding[:, None, None, :] | eye)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def assert_close_with_grads(fn, ref_fn, inputs, tol=TOL):
    """The kernel in fp32 against the reference evaluated in fp64, so that `tol` bounds the kernel's own error.

    An fp32 reference has rounding errors of its own: a summary key's gradient sums over every query (2,100 in
    the longest case), and the dense fp32 reference was 4e-6 off there, the block kernel 1.3e-6; on a CI machine
    the two differed by 1.0001e-5 and the test failed on the reference's error.
    """
    out = fn(*inputs)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, grad)
    exact = [x.detach().double().requires_grad_() for x in inputs]
    ref = ref_fn(*exact)
    ref_grads = torch.autograd.grad(ref, exact, grad.double())
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref.float(), atol=tol, rtol=0)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r.float(), atol=tol, rtol=0)


def test_flash_ops_are_pinned():
    """The private CPU flash ops keep the schema the kernel was written against (else the public path is used)."""
    assert FLASH_OPS_AVAILABLE, "torch changed the flash-for-cpu ops: check the schemas and update the pin"
    assert str(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default._schema) == sa.FLASH_FORWARD_SCHEMA


@pytest.mark.parametrize("kind", PATTERN_KINDS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [37, 64])
@pytest.mark.parametrize("mode,layer", [("merged", 0), ("interleaved", 0), ("interleaved", 1), ("heads", 0)])
@pytest.mark.parametrize("use_flash", [True, False])
def test_block_kernel_matches_reference(kind, causal, n, mode, layer, use_flash):
    pattern = patterns(causal)[kind]
    inputs = qkv(2, 4, n)
    assert_close_with_grads(
        lambda q, k, v: block_sparse_attention(q, k, v, pattern, mode, layer, use_flash=use_flash),
        lambda q, k, v: reference(q, k, v, pattern, mode, layer),
        inputs,
    )


@pytest.mark.parametrize("kind", PATTERN_KINDS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode,layer", [("merged", 0), ("interleaved", 1), ("heads", 0)])
def test_left_padding_no_nan(kind, causal, mode, layer):
    pattern = patterns(causal)[kind]
    n = 45
    padding = torch.ones(3, n, dtype=torch.bool)
    padding[0, :11] = False  # left padding longer than a stride: some pad rows have no real key at all
    padding[1, :1] = False
    inputs = qkv(3, 4, n)
    for fn in (block_sparse_attention, dense_sparse_attention):
        assert_close_with_grads(
            lambda q, k, v, fn=fn: fn(q, k, v, pattern, mode, layer, padding),
            lambda q, k, v: reference(q, k, v, pattern, mode, layer, padding),
            inputs,
        )


def test_fp64_flash_and_public_paths_agree_tightly():
    pattern = build_pattern("fixed", 16, 4, 4)
    q, k, v = (x.detach().double().requires_grad_() for x in qkv(1, 4, 100))
    outs = [block_sparse_attention(q, k, v, pattern, use_flash=f) for f in (True, False)]
    torch.testing.assert_close(outs[0], outs[1], atol=1e-12, rtol=0)
    torch.testing.assert_close(outs[0], reference(q, k, v, pattern, "merged", 0), atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_band_backward_in_chunks(monkeypatch, causal):
    monkeypatch.setattr(sa._Band, "backward_chunk_tokens", 12)  # 3 query blocks of w = 4 per flash call
    pattern = patterns(causal)["strided"]
    padding = torch.ones(2, 61, dtype=torch.bool)
    padding[1, :9] = False
    assert_close_with_grads(
        lambda q, k, v: block_sparse_attention(q, k, v, pattern, "merged", 0, padding),
        lambda q, k, v: reference(q, k, v, pattern, "merged", 0, padding),
        qkv(2, 4, 61),
    )


def test_larger_stride_several_summary_chunks():
    """l = 16 with 1024-token summary chunks: n = 2100 crosses two chunk borders and is not a multiple of l."""
    pattern = build_pattern("fixed", 16, 4, 2)
    inputs = qkv(1, 2, 2100, D=8)
    assert_close_with_grads(
        lambda q, k, v: block_sparse_attention(q, k, v, pattern),
        lambda q, k, v: reference(q, k, v, pattern, "merged", 0),
        inputs,
    )


class Attn(nn.Module):
    def __init__(self, pattern, mode="merged", layer_idx=0):
        super().__init__()
        self.sparse_pattern, self.sparse_mode, self.layer_idx = pattern, mode, layer_idx


def test_kernels_are_registered_with_both_interfaces():
    """attention.py registers a shim per kernel (it imports this module on its first call); the shim returns what
    the kernel returns."""
    from hf_vit_plus.models.attention import SPARSE_KERNEL_NAMES, SPARSE_KERNEL_SHIMS

    assert tuple(SPARSE_KERNELS) == SPARSE_KERNEL_NAMES
    pattern = patterns(True)["fixed"]
    q, k, v = (x.detach() for x in qkv(1, 4, 24))
    for name, fn in SPARSE_KERNELS.items():
        assert AttentionInterface()[name] is SPARSE_KERNEL_SHIMS[name]
        assert AttentionMaskInterface()[name] is sparse_padding_mask
        if name == "sparse_flex":  # compiles for seconds: test_flex_kernel_compiled runs it
            continue
        with torch.no_grad():
            torch.testing.assert_close(SPARSE_KERNEL_SHIMS[name](Attn(pattern), q, k, v, None)[0],
                                       fn(Attn(pattern), q, k, v, None)[0], rtol=0, atol=0)  # fmt: skip
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    assert sparse_padding_mask(2, 4, 4, attention_mask=mask).tolist() == mask.bool().tolist()
    assert sparse_padding_mask(2, 4, 4, attention_mask=torch.ones(2, 4)) is None
    assert sparse_padding_mask(2, 4, 4, attention_mask=None) is None


@pytest.mark.parametrize("name", ["sparse_dense", "sparse_block"])
@pytest.mark.parametrize("mode,layer", [("merged", 0), ("interleaved", 1), ("heads", 0)])
def test_interface_kernels(name, mode, layer):
    pattern = patterns(True)["fixed"]
    module = Attn(pattern, mode, layer)
    q, k, v = qkv(2, 4, 30)
    padding = torch.ones(2, 30, dtype=torch.bool)
    padding[1, :6] = False
    out, weights = AttentionInterface()[name](module, q, k, v, padding.long(), scaling=0.3)
    assert out.shape == (2, 30, 4, 16)
    assert (weights is not None) == (name == "sparse_dense")
    ref = reference(q * 0.3 / 16**-0.5, k, v, pattern, mode, layer, padding)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=TOL, rtol=0)


@pytest.mark.parametrize("kind", PATTERN_KINDS)
@pytest.mark.parametrize("mode", ["merged", "heads"])
def test_cached_decoding_queries(kind, mode):
    """Tq < Tk (a cache): queries are the last Tq positions."""
    pattern = patterns(True)[kind]
    inputs = qkv(2, 4, 40, q_len=3)
    padding = torch.ones(2, 40, dtype=torch.bool)
    padding[0, :4] = False
    assert_close_with_grads(
        lambda q, k, v: block_sparse_attention(q, k, v, pattern, mode, 0, padding),
        lambda q, k, v: reference(q, k, v, pattern, mode, 0, padding),
        inputs,
    )


def test_dropout_falls_back_to_the_reference_and_logs_once(caplog):
    module = Attn(patterns(True)["strided"]).train()
    q, k, v = qkv(1, 2, 20)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            out, _ = sa.sparse_block_attention_forward(module, q, k, v, None, dropout=0.5)
    assert out.shape == (1, 20, 2, 16)
    assert sum("sparse_dense" in r.message for r in caplog.records) <= 1


def test_bad_inputs_raise(monkeypatch):
    q, k, v = qkv(2, 3, 16)
    strided = patterns(True)["strided"]
    with pytest.raises(ValueError, match="num_heads=3"):
        block_sparse_attention(q, k, v, strided, "heads")
    with pytest.raises(ValueError, match="'stacked'"):
        block_sparse_attention(q, k, v, strided, "stacked")
    with pytest.raises(ValueError, match="sparse_pattern"):
        sa.sparse_block_attention_forward(nn.Module(), q, k, v, None)
    with pytest.raises(ValueError, match=r"\(2, 5\)"):
        sa.sparse_block_attention_forward(Attn(strided), q, k, v, torch.ones(2, 5))
    with pytest.raises(ValueError, match="More queries"):
        block_sparse_attention(q, k[:, :, :8], v[:, :, :8], strided)
    monkeypatch.setattr(sa, "FLASH_OPS_AVAILABLE", False)
    with pytest.raises(ValueError, match="flash"):
        block_sparse_attention(q, k, v, strided, use_flash=True)
    out = block_sparse_attention(q, k, v, strided)  # the public fallback
    torch.testing.assert_close(out, reference(q, k, v, strided, "merged", 0), atol=TOL, rtol=0)


@pytest.mark.parametrize("kind", PATTERN_KINDS)
@pytest.mark.parametrize("causal", [True, False])
def test_flex_kernel_matches_reference_eager(kind, causal):
    """flex_attention's eager reference path (compile=False): the BlockMask and mask_mod are right."""
    pattern = patterns(causal)[kind]
    q, k, v = qkv(2, 4, 40)
    padding = torch.ones(2, 40, dtype=torch.bool)
    padding[0, :5] = False
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mode, layer in [("merged", 0), ("heads", 0), ("interleaved", 1)]:
            out = flex_sparse_attention(q, k, v, pattern, mode, layer, padding, block_size=16, compile=False)
            torch.testing.assert_close(out, reference(q, k, v, pattern, mode, layer, padding), atol=TOL, rtol=0)


def test_flex_without_backward_on_cpu(caplog):
    pattern = patterns(True)["strided"]
    q, k, v = qkv(1, 2, 24)
    with pytest.raises(ValueError, match="no backward on CPU"):
        flex_sparse_attention(q, k, v, pattern)
    with caplog.at_level(logging.WARNING):
        out, _ = sa.sparse_flex_attention_forward(Attn(pattern), q, k, v, None)  # falls back to sparse_block
    assert any("falling back to sparse_block" in r.message for r in caplog.records) or sa._logged
    out.sum().backward()
    torch.testing.assert_close(out, reference(q, k, v, pattern, "merged", 0).transpose(1, 2), atol=TOL, rtol=0)


def test_flex_kernel_compiled():
    """The compiled CPU path (10-30 s of compilation on a loaded 2-core machine)."""
    pattern = patterns(True)["fixed"]
    q, k, v = (x.detach() for x in qkv(1, 4, 200))
    with torch.no_grad():
        out, _ = sa.sparse_flex_attention_forward(Attn(pattern, "heads"), q, k, v, None)
    torch.testing.assert_close(out, reference(q, k, v, pattern, "heads", 0).transpose(1, 2), atol=TOL, rtol=0)


def test_flex_kernel_decoding_uses_the_cache_path():
    """Tq < Tk never reaches flex (each cache length would recompile it); the result is the reference's."""
    pattern = patterns(True)["fixed"]
    q, k, v = (x.detach() for x in qkv(1, 4, 33, q_len=1))
    with torch.no_grad():
        out, _ = sa.sparse_flex_attention_forward(Attn(pattern, "heads"), q, k, v, None)
    torch.testing.assert_close(out, reference(q, k, v, pattern, "heads", 0).transpose(1, 2), atol=TOL, rtol=0)
