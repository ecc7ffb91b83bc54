"""Every attention kernel on CUDA (and its CPU path) against the dense reference, forward and backward.

1. Kernel level: the Sparse Transformer's patterns through flex_attention's block masks (`flex_sparse_attention`, the
   compiled kernel the sparse models train with on CUDA) against dense attention with the pattern as a boolean mask
   (`F.scaled_dot_product_attention`), outputs and the gradients of q, k and v, up to 16,384 tokens on CUDA. On the
   CPU flex has no backward: the forward runs flex's own reference path and the gradients go through the registered
   kernel's CPU fallback (`sparse_block`), at a few hundred tokens.
2. Model level: each family with each kernel it offers (dense: eager, sdpa, and flex_attention for the ViT; sparse:
   sparse_dense, the masked reference, sparse_block and sparse_flex) gives the reference kernel's loss and gradients.

Tolerances: relative errors (norm of the difference over the norm of the reference) of at most 2e-3 for outputs and
5e-3 for gradients at the kernel level, 1e-4 / 1e-3 at the model level. A wrong block or mask is off by O(1); the
margin covers TF32-like rounding in the CUDA kernels and summation orders over 16k keys.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from hf_vit_plus.models import sparse_attention as sa
from hf_vit_plus.models.sparse_layouts import PATTERN_KINDS, PATTERNS, build_pattern, mask_for_layer
from tests.gpu.common import (
    CUDA,
    DENSE_CASES,
    DEVICES,
    FAMILY_CASES,
    WIDE_HEADS,
    case_ids,
    gradients,
    relative_error,
    tiny_model,
)
from tests.gpu.common import batch as make_batch

pytestmark = pytest.mark.gpu

OUT_RTOL, GRAD_RTOL = 2e-3, 5e-3
MODEL_LOSS_RTOL, MODEL_GRAD_RTOL = 1e-4, 1e-3
HEADS, HEAD_DIM = 4, 64


@pytest.fixture(autouse=True)
def exact_fp32_and_fresh_dynamo():
    """Full fp32 products (no TF32) and no compiled code left over: torch stops compiling a function after 8
    graphs, and each pattern and length is one."""
    torch._dynamo.reset()
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous
    torch._dynamo.reset()


def pattern_of(kind: str, n: int, causal: bool = True):
    """The pattern at the benchmark's stride for `n` tokens (about sqrt(n)), with two summary blocks where it has
    them."""
    stride = 32 if n <= 2048 else 64 if n <= 4096 else 128
    return build_pattern(kind, stride, **PATTERNS[kind].default_settings(stride), num_summary_blocks=2, causal=causal)


def qkv(n: int, device: str, batch: int = 1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, HEADS, n, HEAD_DIM, generator=g).to(device).requires_grad_() for _ in range(3)]


def dense_reference(q, k, v, pattern, mode, layer, padding=None):
    """Dense attention over the keys the layer's pattern allows (padding keys masked except on the diagonal)."""
    n = k.shape[2]
    allowed = mask_for_layer(pattern, mode, layer, n, q.shape[1], device=q.device)[None]  # (1, H, n, n)
    if padding is not None:
        eye = torch.eye(n, dtype=torch.bool, device=q.device)
        allowed = allowed & (padding[:, None, None, :] | eye)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm().clamp_min(1e-30))


# (kind, mode, layer, n, padded): each pattern at 16k merged, at 4k one part per head, and a short padded batch whose
# length is no multiple of the block size in the interleaved mode
CUDA_CELLS = [
    cell
    for kind in PATTERN_KINDS
    for cell in (
        (kind, "merged", 0, 16384, False),
        (kind, "heads", 0, 4096, False),
        (kind, "interleaved", 1, 1000, True),
    )
]
CPU_CELLS = [(kind, mode, layer, 200, True) for kind in PATTERN_KINDS for mode, layer in (("merged", 0), ("heads", 0))]


def _padding(n: int, device: str, padded: bool):
    if not padded:
        return None
    padding = torch.ones(2, n, dtype=torch.bool, device=device)
    padding[1, : n // 10] = False  # left padding of a tenth of the row
    return padding


@pytest.mark.skipif(not CUDA, reason="flex_attention's compiled backward needs a CUDA device")
@pytest.mark.parametrize("kind,mode,layer,n,padded", CUDA_CELLS, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CUDA_CELLS])
def test_flex_block_masks_match_the_dense_reference_on_cuda(kind, mode, layer, n, padded):
    pattern = pattern_of(kind, n)
    q, k, v = qkv(n, "cuda", batch=2 if padded else 1)
    padding = _padding(n, "cuda", padded)
    out = sa.flex_sparse_attention(q, k, v, pattern, mode, layer, padding)
    ref = dense_reference(q, k, v, pattern, mode, layer, padding)
    # padding queries give finite garbage in both: compared through the real queries only
    rows = torch.ones(1, 1, n, 1, device="cuda") if padding is None else padding[:, None, :, None].float()
    assert not out.isnan().any()
    assert rel(out * rows, ref * rows) <= OUT_RTOL
    grad = torch.randn_like(out) * rows
    grads = torch.autograd.grad(out, (q, k, v), grad)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    for name, g, r in zip("qkv", grads, ref_grads):
        assert rel(g, r) <= GRAD_RTOL, name


@pytest.mark.parametrize("kind,mode,layer,n,padded", CPU_CELLS, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CPU_CELLS])
def test_flex_block_masks_cpu_path(kind, mode, layer, n, padded):
    """The CPU path of the same kernel: flex's forward (its eager reference, the block mask and mask_mod unchanged),
    and training through the registered `sparse_flex` kernel, which falls back to `sparse_block` on the CPU."""
    pattern = pattern_of(kind, n)
    q, k, v = qkv(n, "cpu", batch=2)
    padding = _padding(n, "cpu", padded)
    rows = padding[:, None, :, None]
    ref = dense_reference(q, k, v, pattern, mode, layer, padding)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = sa.flex_sparse_attention(q, k, v, pattern, mode, layer, padding, block_size=64, compile=False)
    assert rel(out * rows, ref * rows) <= OUT_RTOL

    class Attention(torch.nn.Module):
        sparse_pattern, sparse_mode, layer_idx = pattern, mode, layer

    trained, _ = sa.sparse_flex_attention_forward(Attention(), q, k, v, padding.long())  # (B, T, H, D)
    grad = torch.randn_like(ref) * rows
    grads = torch.autograd.grad(trained.transpose(1, 2), (q, k, v), grad)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    for name, g, r in zip("qkv", grads, ref_grads):
        assert rel(g, r) <= GRAD_RTOL, name


# ------------------------------------------------------------------------------------------------- model level
def _step(case, device: str, kernel: str, grad: bool = True):
    model = tiny_model(case, device)
    model.set_attn_implementation(kernel)
    with torch.set_grad_enabled(grad):
        loss = model(**make_batch(case, device)).loss
    if grad:
        loss.backward()
    return loss.item(), gradients(model) if grad else None


def _kernels(case) -> list[str]:
    if case.sparse:
        return ["sparse_block", "sparse_flex"]
    return ["sdpa", "flex_attention"] if case.family == "vit" else ["sdpa"]


MODEL_CELLS = [(case, kernel) for case in FAMILY_CASES + DENSE_CASES for kernel in _kernels(case)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case,kernel", MODEL_CELLS, ids=[f"{c.id}-{k}" for c, k in MODEL_CELLS])
def test_each_kernel_gives_the_reference_loss_and_gradients(case, kernel, device):
    """On the CPU `sparse_flex` trains through its `sparse_block` fallback, and the ViT's flex_attention (no CPU
    backward) is compared forward only."""
    reference = "sparse_dense" if case.sparse else "eager"
    grad = not (kernel == "flex_attention" and device == "cpu")
    ref_loss, ref_grads = _step(case, device, reference, grad)
    loss, grads = _step(case, device, kernel, grad)
    assert abs(loss - ref_loss) <= MODEL_LOSS_RTOL * max(1.0, abs(ref_loss)), (loss, ref_loss)
    if grad:
        assert relative_error(grads, ref_grads) <= MODEL_GRAD_RTOL
        assert sum(float(g.abs().sum()) for g in grads.values()) > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", FAMILY_CASES, ids=case_ids(FAMILY_CASES))
def test_heads_too_narrow_for_flex_train_on_the_block_kernel(case, device):
    """Heads of 8 dimensions (the common suite's tiny configs), which flex_attention's CUDA kernels refuse: the model
    chooses `sparse_block` by itself (and `sparse_flex`, asked for, falls back to it), with the reference's loss and
    gradients."""
    narrow = {key: 2 * value for key, value in WIDE_HEADS[case.family].items()}  # width 32 over 4 heads: 8 dims

    def step(kernel):
        model = tiny_model(case, device, **narrow)
        if kernel is not None:
            model.set_attn_implementation(kernel)
        loss = model(**make_batch(case, device)).loss
        loss.backward()
        return loss.item(), gradients(model)

    ref_loss, ref_grads = step("sparse_dense")
    for kernel in ("sdpa", "sparse_flex"):
        loss, grads = step(kernel)
        assert abs(loss - ref_loss) <= MODEL_LOSS_RTOL * max(1.0, abs(ref_loss)), (kernel, loss, ref_loss)
        assert relative_error(grads, ref_grads) <= MODEL_GRAD_RTOL, kernel
