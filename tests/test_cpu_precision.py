"""The opt-in CPU low-precision path (`hf_vit_plus.cpu_precision`): exact fp32 math rounded to the expected dtype,
applied to a model's standard layers in place and undone again."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, cpu_precision
from hf_vit_plus.cpu_precision import (
    Fp32MatmulConv2d,
    Fp32MatmulLinear,
    restore_standard_layers,
    use_fp32_matmul_for_low_precision,
)


@pytest.fixture(params=[True, False], ids=["native-bf16-cpu", "no-native-bf16-cpu"])
def native(request, monkeypatch):
    monkeypatch.setattr(cpu_precision, "cpu_has_native_low_precision_matmul", lambda: request.param)
    return request.param


def test_linear_bf16_weights(native):
    torch.manual_seed(0)
    layer = Fp32MatmulLinear(16, 8).to(torch.bfloat16)
    x = torch.randn(4, 16).to(torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    exact = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    if not native:  # the fp32 path: the exactly rounded fp32 result
        torch.testing.assert_close(out, exact.to(torch.bfloat16), atol=0, rtol=0)
    torch.testing.assert_close(out.float(), exact, atol=0.05, rtol=0.02)


def test_linear_under_autocast_returns_the_autocast_dtype(native):
    torch.manual_seed(0)
    layer = Fp32MatmulLinear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert layer.weight.grad is not None


def test_fp32_is_untouched(native):
    layer = Fp32MatmulLinear(16, 8)
    x = torch.randn(4, 16)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=0, rtol=0)


def test_patch_conv_bf16(native):
    torch.manual_seed(0)
    conv = Fp32MatmulConv2d(3, 8, kernel_size=4, stride=4).to(torch.bfloat16)
    x = torch.randn(2, 3, 8, 8).to(torch.bfloat16)
    out = conv(x)
    exact = F.conv2d(x.float(), conv.weight.float(), conv.bias.float(), stride=4)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 8, 2, 2)
    if not native:
        torch.testing.assert_close(out, exact.to(torch.bfloat16), atol=0, rtol=0)
    torch.testing.assert_close(out.float(), exact, atol=0.05, rtol=0.02)


def _tiny_vit() -> ViTPlusForImageClassification:
    torch.manual_seed(0)
    config = ViTPlusConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_labels=5,
    )
    model = ViTPlusForImageClassification(config).eval()
    nn.init.normal_(model.classifier.weight, std=0.5)
    return model


def test_models_use_standard_layers_until_the_opt_in():
    model = _tiny_vit()
    assert {type(m) for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))} == {nn.Linear, nn.Conv2d}


def test_opt_in_swaps_every_layer_in_place_sharing_parameters_and_undoes(native):
    model = _tiny_vit()
    params = dict(model.named_parameters())
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fp32_logits = model(x).logits

    assert use_fp32_matmul_for_low_precision(model) is model
    assert sum(type(m) is Fp32MatmulLinear for m in model.modules()) == n_linear
    assert type(model.vit.embeddings.patch_embeddings.projection) is Fp32MatmulConv2d
    assert not [m for m in model.modules() if type(m) in (nn.Linear, nn.Conv2d)]
    assert all(p is params[name] for name, p in model.named_parameters())
    assert set(model.state_dict()) == set(params)  # checkpoints unaffected
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, fp32_logits, atol=0, rtol=0)  # fp32: plain layers' math

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(bf16(x).logits.float(), fp32_logits, atol=0.1, rtol=0.05)

    assert restore_standard_layers(model) is model
    assert sum(type(m) is nn.Linear for m in model.modules()) == n_linear
    assert not [m for m in model.modules() if type(m) in (Fp32MatmulLinear, Fp32MatmulConv2d)]
    assert all(p is params[name] for name, p in model.named_parameters())


def test_opt_in_leaves_linear_subclasses_alone():
    model = nn.Sequential(nn.Linear(4, 4), nn.MultiheadAttention(4, 2))
    use_fp32_matmul_for_low_precision(model)
    assert type(model[0]) is Fp32MatmulLinear
    # MultiheadAttention's out_proj is an nn.Linear subclass with its own type: not swapped
    assert type(model[1].out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear
    with pytest.raises(TypeError, match="torch.nn.Module"):
        use_fp32_matmul_for_low_precision("model")
