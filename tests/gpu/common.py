"""What the GPU tests share: the device parameters, one tiny model per family whose heads flex attention accepts on
CUDA, and gradient comparisons.

Each GPU test is marked `gpu` (`pytest -m gpu tests/gpu`; `make gpu-check` runs them on a fresh GPU machine). A test
whose code also runs on the CPU takes `device` in `DEVICES` and runs there too; a CUDA-only one is `needs_cuda`.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import MODEL_CASES, ModelCase

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (the local host has none)")
# The CUDA cell first: `make gpu-check` reads it; the CPU cell is the same code on the CPU's kernels.
DEVICES = [pytest.param("cuda", marks=needs_cuda), "cpu"]

# Head size 16 everywhere: flex_attention's CUDA kernels refuse heads of fewer than 16 dimensions (the common suite's
# tiny configs have 8), and flex is the kernel the sparse models take on CUDA.
WIDE_HEADS = {
    "vit": dict(num_attention_heads=2),
    "seq2seq": dict(encoder_attention_heads=2, decoder_attention_heads=2),
    "sparse-lm": dict(num_attention_heads=2),
    "image-lm": dict(num_attention_heads=2),
}
_CASES = {case.id: case for case in MODEL_CASES}
# One case per family, each with a sparse pattern where the family has one (the code that differs on CUDA), and the
# dense ViT and LM: every kernel (eager, sdpa, flex) of the dense families' attention.
FAMILY_CASES = [
    _CASES[name] for name in ("vit-strided", "seq2seq-fixed", "sparse-lm-strided-heads", "image-lm-strided-heads")
]
DENSE_CASES = [_CASES[name] for name in ("vit-dense", "seq2seq-dense", "sparse-lm-dense")]


def case_ids(cases: list[ModelCase]) -> list[str]:
    return [case.id for case in cases]


def tiny_model(case: ModelCase, device: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """The case's tiny model (heads of 16 dimensions) on `device`, in training mode (its dropout is 0)."""
    return case.model(seed=seed, **{**WIDE_HEADS[case.family], **overrides}).to(device).train()


def batch(case: ModelCase, device: str, batch_size: int = 2) -> dict:
    """The case's inputs with labels on `device`."""
    return {key: value.to(device) for key, value in case.inputs(batch=batch_size, labels=True).items()}


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's gradient in float32 on the CPU (zeros where it got none)."""
    return {
        name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().cpu()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def cosine(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Cosine similarity of two sets of gradients, flattened into one vector each."""
    x = torch.cat([a[name].flatten() for name in sorted(a)])
    y = torch.cat([b[name].flatten() for name in sorted(a)])
    return float(torch.nn.functional.cosine_similarity(x, y, dim=0))


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||b|| over all gradients."""
    diff = sum(float((a[n] - b[n]).pow(2).sum()) for n in a)
    norm = sum(float(b[n].pow(2).sum()) for n in a)
    return (diff / max(norm, 1e-30)) ** 0.5


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
