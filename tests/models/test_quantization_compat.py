"""Tools that recognise layers by exact type (dynamic quantization here; PEFT and exporters alike) see every linear
layer of each family: the model definitions use the standard `nn.Linear` / `nn.Conv2d`, no subclasses."""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.ao.nn.quantized import dynamic as quantized_dynamic

from tests.conftest import ModelCase


def _count(model: nn.Module, cls: type) -> int:
    return sum(type(module) is cls for module in model.modules())


def test_quantize_dynamic_replaces_every_linear_layer(model_case: ModelCase):
    """Every family and variant of the common matrix (tests/conftest.py), the ViT with the tanh pre-logits head too."""
    extra = {"classifier_head": "mlp_tanh"} if model_case.family == "vit" else {}
    model = model_case.model(**extra)
    inputs = model_case.inputs()
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    assert linears, "the model has no linear layers"
    subclassed = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and type(m) is not nn.Linear]
    assert not subclassed, f"nn.Linear subclasses hide these layers from type-matching tools: {subclassed}"
    assert not [m for m in model.modules() if isinstance(m, nn.Conv2d) and type(m) is not nn.Conv2d]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)

    assert _count(quantized, nn.Linear) == 0
    assert _count(quantized, quantized_dynamic.Linear) == len(linears)
    with torch.no_grad():
        expected, got = model(**inputs).logits, quantized(**inputs).logits
    if model_case.family == "image-lm":  # the start token's logit is -inf by design (never drawn)
        expected, got = expected[..., :256], got[..., :256]
    assert expected.abs().max() > 0.1
    # int8 weights: close to the float model, relative to the logits' scale
    assert (got - expected).abs().max() <= 0.05 * expected.abs().max()
