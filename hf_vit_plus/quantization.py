"""int8 inference for every family with torchao (`pip install "hf_vit_plus[fast]"`).

    from hf_vit_plus.quantization import quantize

    model = AutoModelForSeq2SeqLM.from_pretrained(path).eval()
    quantize(model, "int8-dynamic")          # in place; returns the model
    model.generate(**batch)

`quantize` applies torchao's own `quantize_` to every `nn.Linear` of the model (the families use the standard
layers, so each projection, MLP layer and head is found by type; the ViT's patch embedding is a `Conv2d` and stays in
float, as do embeddings and LayerNorms). The weights become torchao `Int8Tensor`s (per-row symmetric scales):

- "int8-dynamic": `Int8DynamicActivationInt8WeightConfig`, int8 weights and activations quantized per row at run
  time; the products are int8 GEMMs (`torch._int_mm`). The fast one on CPUs with int8 dot-product instructions.
- "int8-weight-only": `Int8WeightOnlyConfig`, int8 weights dequantized for each product: a quarter of the fp32 weight
  memory, no faster than fp32 on CPU.

In eager mode "int8-dynamic" runs the per-row quantization of each activation as separate element-wise operations:
they cost more than the int8 products save for narrow models (the digits ViT, width 64, or ViT-Ti/16, width 192, are
slower than in fp32), and about half of ViT-B/16's time. `torch.compile(model)` fuses them (torchao's `quantize_`
also sets its recommended inductor options, process-wide). Those passes also fall out of the CPU's caches on large
inputs, and `torch._int_mm` slows there too, so on the CPU an "int8-dynamic" layer multiplies at most
`CPU_INT8_DYNAMIC_ROWS` rows at a time (`RowBlockedLinear`; the same numbers: each row is quantized on its own).

A tied output projection (the seq2seq `lm_head` and the Sparse Transformer's, tied to the token embeddings) is
quantized too: it gets its own int8 copy, while the embedding lookup keeps the float matrix.

On a CPU without int8 dot-product instructions (no AVX512-VNNI, AVX-VNNI or AMX: AMD before Zen 4, older Intel,
or a run capped below them by `HF_VIT_PLUS_CPU_ISA`, see `hf_vit_plus.models.cpu_isa`), `torch._int_mm` has no fast
path and "int8-dynamic" would be many times slower than fp32. There `quantize` gives each layer FBGEMM's dynamic int8
linear instead (`FbgemmInt8Linear`: `torch.ops.quantized.linear_dynamic` on weights packed once, with AVX2 and
AVX-512 kernels): int8 weights per output row as before, activations quantized per tensor to 7 bits at run time (the
`reduce_range` of torch's own dynamic quantization, which keeps AVX2's 16-bit pair sums from saturating). Its
numbers differ from the VNNI path's within int8 rounding. `dynamic_int8_backend()` says which one `quantize` uses
("torchao" or "fbgemm"); the weights are `torch.qint8` tensors there (`is_quantized_weight` knows both).

Saving: a model quantized this way is for inference in the running process. Its `save_pretrained` (and
`push_to_hub`) raise a `ValueError`: safetensors cannot store torchao's tensor subclasses directly, and transformers'
loader would tie the float embedding back over a quantized output projection. Save the float checkpoint and call
`quantize` again after `from_pretrained`: it takes well under a second (0.4 s for ViT-B/16 on one CPU thread) and
gives the same int8 weights. (transformers' own route, `from_pretrained(path, quantization_config=TorchAoConfig(
Int8DynamicActivationInt8WeightConfig()))`, also works with these models and can be saved; it leaves the output
projection in float.)
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .utils.extras import require

logger = logging.getLogger(__name__)

SCHEMES = ("int8-dynamic", "int8-weight-only")
# Rows of a dynamic-int8 product on the CPU at once (`RowBlockedLinear`; chosen with `bench_vit.py`'s int8 rows)
CPU_INT8_DYNAMIC_ROWS = 1024


class RowBlockedLinear(nn.Linear):
    """An `nn.Linear` with torchao's dynamic-int8 weights whose CPU products of more than `CPU_INT8_DYNAMIC_ROWS`
    rows run in blocks of that many rows. In eager mode each activation is quantized by separate element-wise
    passes, which fall out of cache on a large input (ViT-B/16 at batch 32: 6,304 rows), and `torch._int_mm` slows
    there too. Each row is quantized over its own range, so the blocks give the numbers of the whole. Under
    `torch.compile` (which fuses the passes) and off the CPU it is the plain layer."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        flat = input.reshape(-1, input.shape[-1])
        if input.device.type != "cpu" or len(flat) <= CPU_INT8_DYNAMIC_ROWS or torch.compiler.is_compiling():
            return super().forward(input)
        out = torch.cat([F.linear(block, self.weight, self.bias) for block in flat.split(CPU_INT8_DYNAMIC_ROWS)])
        return out.view(*input.shape[:-1], out.shape[-1])


class FbgemmInt8Linear(nn.Linear):
    """An `nn.Linear` whose weight is int8 per output row (a `torch.qint8` tensor, in `weight`) multiplied by FBGEMM's
    dynamic int8 linear on the weight packed once (`torch.ops.quantized.linear_dynamic`): the input is quantized per
    tensor to 7 bits at run time, the product accumulates in int32, the output is float. The "int8-dynamic" layer of
    CPUs without int8 dot-product instructions, where `torch._int_mm` is slow (see the module docstring)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = torch.ops.quantized.linear_dynamic(input.float(), self.packed_weight, True)
        return out.to(input.dtype)

    @classmethod
    def from_float(cls, module: nn.Linear) -> None:
        """Quantize `module` (an `nn.Linear`) in place into this class."""
        weight = module.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).eps).double()
        zero_points = torch.zeros(len(weight), dtype=torch.long)
        with warnings.catch_warnings():  # torch 2.15 deprecates its quantized tensors: tests/models/ see it go
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor, torch.quantize_per_channel", UserWarning)
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        bias = None if module.bias is None else module.bias.detach().float()
        previous = torch.backends.quantized.engine
        # the packed weight belongs to the engine it was packed with; the process's engine is left as it was
        torch.backends.quantized.engine = _fbgemm_engine()
        try:
            packed = torch.ops.quantized.linear_prepack(qweight, bias)
        finally:
            torch.backends.quantized.engine = previous
        # a new Parameter: a tied output projection gets its own int8 copy, the embedding keeps its float matrix
        module.weight = nn.Parameter(qweight, requires_grad=False)
        module.packed_weight = packed
        module.__class__ = cls


def _fbgemm_engine() -> str | None:
    """torch's quantized engine that runs FBGEMM's x86 kernels ("x86", or "fbgemm" in older builds), or None."""
    engines = torch.backends.quantized.supported_engines
    return next((engine for engine in ("x86", "fbgemm") if engine in engines), None)


def dynamic_int8_backend() -> str:
    """What "int8-dynamic" uses on the CPU at the instruction-set level in use: "torchao" (`torch._int_mm`, fast with
    VNNI or AMX, and the choice off x86) or "fbgemm" (`FbgemmInt8Linear`, fast with AVX2 alone). A bad
    `HF_VIT_PLUS_CPU_ISA` raises its ValueError."""
    from .models.compat import cpu_has_fast_int8_products

    if cpu_has_fast_int8_products() or _fbgemm_engine() is None:
        return "torchao"
    return "fbgemm"


def _torchao_config(scheme: str):
    require("fast", "int8 quantization", ("torchao",))
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    if scheme == "int8-dynamic":
        return Int8DynamicActivationInt8WeightConfig()
    return Int8WeightOnlyConfig()


def is_quantized_weight(weight) -> bool:
    """Whether `weight` is a quantized tensor: torchao's (any torchao tensor subclass), or torch's own (the
    `torch.qint8` weights of `FbgemmInt8Linear`)."""
    if isinstance(weight, torch.Tensor) and weight.is_quantized:
        return True
    try:
        from torchao.utils import TorchAOBaseTensor
    except ImportError:
        return False
    return isinstance(weight, TorchAOBaseTensor)


def quantize(model: nn.Module, scheme: str) -> nn.Module:
    """Quantize every `nn.Linear` of `model` in place with torchao's `quantize_` (or, for "int8-dynamic" on a CPU
    without int8 dot-product instructions, FBGEMM's dynamic int8 linear: `dynamic_int8_backend()`) and return the
    model.

    scheme: "int8-dynamic" (int8 weights and activations) or "int8-weight-only". The model should be in eval mode
    (quantized weights have no gradients). Afterwards `save_pretrained` raises a `ValueError`: save the float model
    and quantize again after loading (see the module docstring).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize() takes a torch.nn.Module, got {type(model).__name__}.")
    if scheme not in SCHEMES:
        raise ValueError(f"Unknown quantization scheme {scheme!r}: expected one of {', '.join(map(repr, SCHEMES))}.")
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layer to quantize.")
    already = [name for name in linears if is_quantized_weight(model.get_submodule(name).weight)]
    if already:
        raise ValueError(
            f"{type(model).__name__} is already quantized ({len(already)} linear layers, e.g. {already[0]!r}): "
            "quantize the float model once."
        )
    on_cpu = all(model.get_submodule(name).weight.device.type == "cpu" for name in linears)
    if scheme == "int8-dynamic" and on_cpu and dynamic_int8_backend() == "fbgemm":
        for name in linears:
            FbgemmInt8Linear.from_float(model.get_submodule(name))
        logger.info(
            "quantized %d linear layers of %s with FBGEMM's dynamic int8 (no int8 dot-product instructions at %s)",
            len(linears),
            type(model).__name__,
            _isa_in_use(),
        )
        return _refuse_saving(model)
    config = _torchao_config(scheme)
    from torchao.quantization import quantize_

    quantize_(model, config)
    if scheme == "int8-dynamic":
        for name in linears:
            module = model.get_submodule(name)
            if type(module) is nn.Linear and is_quantized_weight(module.weight):
                module.__class__ = RowBlockedLinear
    logger.info("quantized %d linear layers of %s with torchao (%s)", len(linears), type(model).__name__, scheme)
    return _refuse_saving(model)


def _isa_in_use() -> str:
    from .models.cpu_isa import isa_label

    return isa_label()


def _refuse_saving(model: nn.Module) -> nn.Module:
    # Instance attributes shadow the classes' methods (deepcopy keeps them); push_to_hub is refused before it
    # creates a repository.
    for method in ("save_pretrained", "push_to_hub"):
        if hasattr(model, method):
            setattr(model, method, _refuse_save)
    return model


def _refuse_save(*args, **kwargs):
    raise ValueError(
        "This model was quantized with hf_vit_plus.quantization.quantize() and cannot be saved: safetensors cannot "
        "store its int8 tensors (torchao's, or FBGEMM's packed weights) as they are. Save the float model and call "
        "quantize(model, scheme) again after from_pretrained (it gives the same int8 weights), or load with "
        "transformers' from_pretrained(..., quantization_config=TorchAoConfig(...)), which can be saved (its output "
        "projection stays float)."
    )


__all__ = [
    "CPU_INT8_DYNAMIC_ROWS",
    "SCHEMES",
    "FbgemmInt8Linear",
    "RowBlockedLinear",
    "dynamic_int8_backend",
    "is_quantized_weight",
    "quantize",
]
