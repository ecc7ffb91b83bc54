"""Opt-in fp32 math for bf16/fp16 linear layers on CPUs without native low-precision matrix instructions.

On CPUs without AVX512-BF16 / AMX (e.g. AVX2-only x86), PyTorch's bf16/fp16 GEMMs fall back to slow reference loops,
many times slower than fp32 (`scripts/benchmarks/bench_vit.py` prints the GEMM peaks;
results/cpu_bf16_gemm_fallback.csv holds a measurement). `use_fp32_matmul_for_low_precision(model)` makes every
`nn.Linear` / `nn.Conv2d` of a model compute such products in fp32 from the low-precision inputs and weights (every
bf16/fp16 value is exactly representable in fp32, and accumulating in fp32 is what the native kernels do too) and round
the result back to the dtype the caller expects (the input dtype, or the autocast dtype). Everywhere else (GPUs, fp32,
CPUs with native bf16) the layers behave exactly as `nn.Linear` / `nn.Conv2d`.

This lives outside the model definitions on purpose: the models use the standard layers, which quantizers
(`torch.ao.quantization.quantize_dynamic`), PEFT and exporters recognise by exact type. Opting in changes the
modules' classes in place (parameters, buffers, hooks and names are untouched, so checkpoints are unaffected);
`restore_standard_layers(model)` undoes it, e.g. before quantizing or wrapping with PEFT.

    model = ViTPlusForImageClassification.from_pretrained(path, dtype=torch.bfloat16)
    model = use_fp32_matmul_for_low_precision(model)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .models.compat import cpu_has_native_bf16_products as cpu_has_native_low_precision_matmul

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def cpu_output_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype to round to when the fp32 path should be taken for this op on the CPU, else None."""
    if x.device.type != "cpu":
        return None
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
    elif x.dtype in _LOW_PRECISION or weight.dtype in _LOW_PRECISION:
        dtype = x.dtype
    else:
        return None
    if dtype not in _LOW_PRECISION or cpu_has_native_low_precision_matmul():
        return None
    return dtype


class _Fp32Products:
    """The fp32 path shared by the layers below: `forward` runs the layer's own product (`_product`) on fp32 copies
    of the input and weights, then rounds to the low-precision dtype; everywhere else the standard `forward`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = cpu_output_dtype(x, self.weight)
        if out_dtype is None:
            return super().forward(x)
        bias = self.bias.float() if self.bias is not None else None
        with torch.autocast("cpu", enabled=False):
            return self._product(x.float(), self.weight.float(), bias).to(out_dtype)


class Fp32MatmulLinear(_Fp32Products, nn.Linear):
    """`nn.Linear` that computes low-precision CPU products in fp32 where the CPU lacks native support."""

    def _product(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)


class Fp32MatmulConv2d(_Fp32Products, nn.Conv2d):
    """`nn.Conv2d` (e.g. the ViT patch projection) with the same fp32 path as `Fp32MatmulLinear`."""

    def _product(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self._conv_forward(x, weight, bias)


# Exact types only: a subclass of nn.Linear (a LoRA or quantized layer, MultiheadAttention's out_proj) has its own
# forward, which a class swap would silently drop.
_OPT_IN = {nn.Linear: Fp32MatmulLinear, nn.Conv2d: Fp32MatmulConv2d}
_OPT_OUT = {fast: standard for standard, fast in _OPT_IN.items()}


def _swap_classes(model: nn.Module, mapping: dict[type, type]) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"Expected a torch.nn.Module, got {type(model).__name__}.")
    for module in model.modules():
        new_class = mapping.get(type(module))
        if new_class is not None:
            module.__class__ = new_class
    return model


def use_fp32_matmul_for_low_precision(model: nn.Module) -> nn.Module:
    """Make every `nn.Linear` / `nn.Conv2d` of `model` (exact types) compute bf16/fp16 CPU products in fp32 where
    the CPU lacks native low-precision matmul instructions. In place: returns the same model, whose modules keep
    their Parameters, names and hooks. Undo with `restore_standard_layers`."""
    return _swap_classes(model, _OPT_IN)


def restore_standard_layers(model: nn.Module) -> nn.Module:
    """Undo `use_fp32_matmul_for_low_precision` in place: the layers become plain `nn.Linear` / `nn.Conv2d`."""
    return _swap_classes(model, _OPT_OUT)


__all__ = [
    "Fp32MatmulConv2d",
    "Fp32MatmulLinear",
    "cpu_has_native_low_precision_matmul",
    "restore_standard_layers",
    "use_fp32_matmul_for_low_precision",
]
