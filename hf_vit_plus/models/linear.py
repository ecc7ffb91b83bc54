"""Linear and patch-projection layers that pick the fastest exact math on the CPU they run on.

On CPUs without native bf16/fp16 matrix instructions (no AVX512-BF16 / AMX: e.g. AVX2-only x86), PyTorch's
low-precision GEMMs fall back to slow reference loops: about 1-5 GFLOP/s against ~55 GFLOP/s per core in fp32
(measured on this project's 2-core AMD EPYC CI machine). There, these layers compute the product in fp32 from the
low-precision inputs and weights (every bf16/fp16 value is exactly representable in fp32, and accumulating in fp32
is what the native kernels do too) and round the result back to the dtype the caller expects (the input dtype, or
the autocast dtype). Everywhere else (GPUs, CPUs with native bf16) they are plain `nn.Linear` / `F.conv2d`.
Parameter names are those of `nn.Linear` / `nn.Conv2d`, so checkpoints are unaffected.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn import functional as F

_LOW_PRECISION = (torch.bfloat16, torch.float16)


@functools.cache
def cpu_has_native_low_precision_matmul() -> bool:
    """Whether this CPU has native bf16 matrix instructions (oneDNN's own check where torch exposes it)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if check is not None:
        try:
            return bool(check())
        except RuntimeError:
            pass
    return torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2")


def cpu_output_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype to round to when the fp32 path should be taken for this CPU op, else None."""
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


class Linear(nn.Linear):
    """`nn.Linear` that computes low-precision CPU products in fp32 where the CPU lacks native support."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = cpu_output_dtype(x, self.weight)
        if out_dtype is None:
            return super().forward(x)
        bias = self.bias.float() if self.bias is not None else None
        with torch.autocast("cpu", enabled=False):
            return F.linear(x.float(), self.weight.float(), bias).to(out_dtype)


class PatchConv2d(nn.Conv2d):
    """`nn.Conv2d` (the ViT patch projection) with the same fp32 path as `Linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = cpu_output_dtype(x, self.weight)
        if out_dtype is None:
            return super().forward(x)
        bias = self.bias.float() if self.bias is not None else None
        with torch.autocast("cpu", enabled=False):
            out = F.conv2d(x.float(), self.weight.float(), bias, self.stride, self.padding, self.dilation, self.groups)
        return out.to(out_dtype)
