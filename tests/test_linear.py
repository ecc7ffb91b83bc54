"""The CPU low-precision path of `Linear` / `PatchConv2d`: exact fp32 math, rounded to the expected dtype."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from hf_vit_plus.models import linear as linear_module
from hf_vit_plus.models.linear import Linear, PatchConv2d


@pytest.fixture(params=[True, False], ids=["native-bf16-cpu", "no-native-bf16-cpu"])
def native(request, monkeypatch):
    monkeypatch.setattr(linear_module, "cpu_has_native_low_precision_matmul", lambda: request.param)
    return request.param


def test_linear_bf16_weights(native):
    torch.manual_seed(0)
    layer = Linear(16, 8).to(torch.bfloat16)
    x = torch.randn(4, 16).to(torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    exact = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    if not native:  # the fp32 path: the exactly rounded fp32 result
        torch.testing.assert_close(out, exact.to(torch.bfloat16), atol=0, rtol=0)
    torch.testing.assert_close(out.float(), exact, atol=0.05, rtol=0.02)


def test_linear_under_autocast_returns_the_autocast_dtype(native):
    torch.manual_seed(0)
    layer = Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert layer.weight.grad is not None


def test_fp32_is_untouched(native):
    layer = Linear(16, 8)
    x = torch.randn(4, 16)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=0, rtol=0)


def test_patch_conv_bf16(native):
    torch.manual_seed(0)
    conv = PatchConv2d(3, 8, kernel_size=4, stride=4).to(torch.bfloat16)
    x = torch.randn(2, 3, 8, 8).to(torch.bfloat16)
    out = conv(x)
    exact = F.conv2d(x.float(), conv.weight.float(), conv.bias.float(), stride=4)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 8, 2, 2)
    torch.testing.assert_close(out.float(), exact, atol=0.05, rtol=0.02)
