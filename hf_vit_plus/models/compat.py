"""The one place where the models meet differences between the transformers releases they support (5.17 onwards).

A checkpoint carries this file with the model code (remote code), so a model saved under one release runs under
whatever release the loading user has. Nothing here compares version numbers: each item asks the installed
transformers what it does, so a release that changes it again is met by the same test. The modeling files call the
helpers below and never look at `transformers.__version__`.

- 5.24 renamed the generation cache from `past_key_values` to `cache`: `generate` passes it to `forward` as
  `cache=...`, reads it back from the output field `cache` (the output dataclasses renamed the field), and the mask
  builders of `transformers.masking_utils` take `cache=...`. The old names still work there until 5.40, with a
  deprecation message on every call. Our `forward` methods take the cache under either name (`resolve_cache`), return
  it in the field the installed release reads (`cache_field`, `output_cache`), and call the mask builders with the
  keyword they declare (`mask_cache_argument`).
- 5.20 gave `AutoVideoProcessor.register` a `video_processor_classes={backend: class}` argument in place of one
  `video_processor_class` (5.17 takes only that one): `register_video_processor` passes whichever the installed
  release declares.
- 5.23 renamed `gradient_checkpointing_enable` / `_disable` to `activation_checkpointing_enable` / `_disable` (the
  old names warn since): `enable_activation_checkpointing` and `disable_activation_checkpointing` call whichever the
  installed release has.

From torch: torch 2.11's shape solver cannot prove some guards that hold over a named `Dim`'s whole range (the fast
beam step's `min(L + 1, 3L + 3) == L + 1`) and `torch.export` refuses the named dims (a constraint violation);
`export_program` then exports with the same axes marked `Dim.AUTO`, which keeps them symbolic. And the block-sparse CPU
kernel calls torch's private flash-attention-for-CPU ops (the only CPU
attention ops that return the log-sum-exp) only while their schemas are exactly those it was written for
(`cpu_flash_attention_ops`); otherwise it runs the same computation on public ops. And what the CPU multiplies
natively: bf16 and int8 products are slow loops on CPUs without AVX512-BF16 / AMX or VNNI / AMX
(`cpu_has_native_bf16_products`, `cpu_has_fast_int8_products`; FastDecoding and `hf_vit_plus.cpu_precision` ask).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os

import torch
from transformers import masking_utils
from transformers.modeling_outputs import CausalLMOutputWithPast

from .cpu_isa import cpu_isa

# The name of the cache in the installed release: the `forward` keyword `generate` passes, and the output field it
# reads back ("cache" from 5.24, "past_key_values" before).
_OUTPUT_FIELDS = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
CACHE_NAME = "cache" if "cache" in _OUTPUT_FIELDS else "past_key_values"
# Every name a cache may arrive under, newest first (a config's `keys_to_ignore_at_inference` lists them all).
CACHE_NAMES = ("cache", "past_key_values")
_MASK_PARAMETERS = inspect.signature(masking_utils.create_causal_mask).parameters
_MASK_CACHE_NAME = "cache" if "cache" in _MASK_PARAMETERS else "past_key_values"


def resolve_cache(cache, past_key_values):
    """The cache a `forward` was given as `cache` or as `past_key_values` (its name before transformers 5.24).

    Either name works on every release; both at once is a ValueError, unless they are the same object."""
    if past_key_values is None:
        return cache
    if cache is not None and cache is not past_key_values:
        raise ValueError(
            "Pass the cache once, as `cache` (or under its older name `past_key_values`), not both: got two "
            f"different objects ({type(cache).__name__} and {type(past_key_values).__name__})."
        )
    return past_key_values


def cache_from_kwargs(kwargs: dict):
    """The cache in a dict of keyword arguments (e.g. those given to `generate` or to a model call) under any of its
    names, or None."""
    for name in CACHE_NAMES:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def cache_field(cache) -> dict:
    """`{field: cache}` for a transformers output dataclass: `Output(logits=..., **cache_field(cache))`."""
    return {CACHE_NAME: cache}


def output_cache(outputs):
    """The cache of a transformers output dataclass (its `cache` or `past_key_values` field)."""
    return getattr(outputs, CACHE_NAME)


def mask_cache_argument(cache) -> dict:
    """`{keyword: cache}` for `masking_utils.create_causal_mask` and its siblings."""
    return {_MASK_CACHE_NAME: cache}


def register_video_processor(auto_class, config_class: type, processor_class: type, backend: str = "torchvision"):
    """`auto_class.register(config_class, ...)` for `AutoVideoProcessor`: with `video_processor_classes={backend:
    processor_class}` where the installed release takes it, else with `video_processor_class=processor_class`."""
    if "video_processor_classes" in inspect.signature(auto_class.register).parameters:
        auto_class.register(config_class, video_processor_classes={backend: processor_class}, exist_ok=True)
    else:
        auto_class.register(config_class, video_processor_class=processor_class, exist_ok=True)


def enable_activation_checkpointing(model, checkpointing_kwargs: dict | None = None) -> None:
    """Recompute every layer's activations in the backward pass (transformers' activation checkpointing), with
    `checkpointing_kwargs` for `torch.utils.checkpoint` (e.g. `{"use_reentrant": False}`)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=checkpointing_kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs)


def disable_activation_checkpointing(model) -> None:
    """Undo `enable_activation_checkpointing`."""
    disable = getattr(model, "activation_checkpointing_disable", None)
    if disable is not None:
        disable()
    else:
        model.gradient_checkpointing_disable()


def _auto_dims(dynamic_shapes):
    """`dynamic_shapes` with every dim (named or derived) replaced by `Dim.AUTO`."""
    if isinstance(dynamic_shapes, dict):
        return {key: _auto_dims(value) for key, value in dynamic_shapes.items()}
    if isinstance(dynamic_shapes, (list, tuple)):
        return type(dynamic_shapes)(_auto_dims(value) for value in dynamic_shapes)
    if dynamic_shapes is None or isinstance(dynamic_shapes, int):
        return dynamic_shapes
    return torch.export.Dim.AUTO


def export_program(module, args: tuple, dynamic_shapes=None, **kwargs):
    """`torch.export.export(module, args, dynamic_shapes=..., **kwargs)`; where the installed torch refuses the named
    dims as a constraint violation it cannot prove (torch 2.11), the same axes again as `Dim.AUTO`."""
    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes, **kwargs)
    except RuntimeError as error:
        kind = getattr(getattr(error, "error_type", None), "name", None)
        if dynamic_shapes is None or kind != "CONSTRAINT_VIOLATION":
            raise
    return torch.export.export(module, args, dynamic_shapes=_auto_dims(dynamic_shapes), **kwargs)


def _tensor_leaves(tree, out: list) -> list:
    """The tensors of nested tuples and lists, depth first (pytree's order for them)."""
    for item in tree:
        if isinstance(item, (tuple, list)):
            _tensor_leaves(item, out)
        elif isinstance(item, torch.Tensor):
            out.append(item)
    return out


def _filled(template, flat: list):
    """`template` (tuples and lists of leaf numbers) with each number i replaced by `flat[i]`."""
    if isinstance(template, int):
        return flat[template]
    return type(template)(_filled(item, flat) for item in template)


def _plain_template(template) -> bool:
    """Whether `template` is made of plain tuples and lists of ints only (what `_filled` rebuilds)."""
    if isinstance(template, int):
        return True
    return type(template) in (tuple, list) and all(_plain_template(item) for item in template)


def aoti_flat_call(runner):
    """A callable `f(*args)` that runs an AOTInductor package loaded by `torch._inductor.aoti_load_package` as its
    `__call__` does, for arguments that are tensors in nested tuples and lists, without its pytree flattening and
    unflattening and its parsing of the call spec (Python work at every call, which a decoding step pays per token).
    The inputs must be contiguous (the compiled code reads every input with a contiguous tensor's strides, whatever
    its own: an expanded tensor's rows past the first would be read from memory beyond it): a ValueError names one
    that is not. None where the loaded model lacks its loader's `boxed_run` and `get_call_spec` (torch 2.14's and
    2.15's have them) or its outputs are more than tuples and lists of leaves (a dict, a named tuple): call `runner`.
    """
    loader = getattr(runner, "loader", None)
    if not (callable(getattr(loader, "boxed_run", None)) and callable(getattr(loader, "get_call_spec", None))):
        return None
    try:
        from torch.utils import _pytree

        out_spec = _pytree.treespec_loads(loader.get_call_spec()[1])
        template = _pytree.tree_unflatten(list(range(out_spec.num_leaves)), out_spec)
    except Exception:  # a spec this torch writes differently: the runner's own call
        return None
    if not _plain_template(template):  # dicts, named tuples: the runner's own call rebuilds them
        return None
    boxed_run = loader.boxed_run

    def call(*args):
        leaves = _tensor_leaves(args, [])
        for index, tensor in enumerate(leaves):
            if not tensor.is_contiguous():  # the compiled code would read it with a contiguous tensor's strides
                raise ValueError(
                    f"A compiled graph's input {index} (shape {tuple(tensor.shape)}) has strides {tensor.stride()}: "
                    "it reads contiguous tensors only; pass tensor.contiguous()."
                )
        return _filled(template, boxed_run(leaves))

    return call


FLASH_FORWARD_SCHEMA = (
    "aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, float dropout_p=0., "
    "bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) -> (Tensor output, Tensor logsumexp)"
)
FLASH_BACKWARD_SCHEMA = (
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, Tensor key, "
    "Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, Tensor? attn_mask=None, "
    "float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)"
)


def cpu_flash_attention_ops():
    """torch's private (forward, backward) flash-attention-for-CPU ops if their schemas are exactly
    `FLASH_FORWARD_SCHEMA` / `FLASH_BACKWARD_SCHEMA` (torch 2.14 and 2.15), else None: the caller then uses public
    ops."""
    try:
        forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
        backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    except (AttributeError, RuntimeError):
        return None
    if str(forward._schema) != FLASH_FORWARD_SCHEMA or str(backward._schema) != FLASH_BACKWARD_SCHEMA:
        return None
    return forward, backward


# /proc/cpuinfo flags of native int8 dot products (VNNI, AMX). Without them `torch._int_mm` is a slow loop, far
# slower than the float32 product of the same shape (`bench_vit.py --precisions int8-dynamic` measures
# both GEMM peaks).
INT8_PRODUCT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@functools.cache
def _cpu_flags() -> frozenset[str] | None:
    """The flags of /proc/cpuinfo; None where there is no such file (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return None


# Of those, the ones each instruction-set level (`cpu_isa`) may use: a cap at AVX2 leaves AVX-VNNI only
INT8_PRODUCT_FLAGS_AT = {"avx512": INT8_PRODUCT_FLAGS, "avx2": ("avx_vnni",), "generic": ()}
# oneDNN's caps (ONEDNN_MAX_CPU_ISA) that leave out every int8 dot-product instruction
ONEDNN_WITHOUT_VNNI = frozenset({"SSE41", "AVX", "AVX2"})


def cpu_has_fast_int8_products() -> bool:
    """Whether the running CPU multiplies int8 matrices natively (VNNI or AMX) at the level the package's kernels run
    at (`cpu_isa`, capped by `HF_VIT_PLUS_CPU_ISA`), so that dynamic int8 pays."""
    flags = _cpu_flags()
    if flags is None:
        return torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2")
    usable = INT8_PRODUCT_FLAGS_AT[cpu_isa()]
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ONEDNN_WITHOUT_VNNI:
        usable = ()  # oneDNN, which runs torch._int_mm, is capped below its AVX2_VNNI (`capped_environment`)
    return any(flag in flags for flag in usable)


@functools.cache
def cpu_has_native_bf16_products() -> bool:
    """Whether the running CPU's bf16 matrix products are native (oneDNN's own check), not slow reference loops."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if check is not None:
        try:
            return bool(check())
        except RuntimeError:
            pass
    return torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2")


__all__ = [
    "aoti_flat_call",
    "CACHE_NAME",
    "FLASH_BACKWARD_SCHEMA",
    "FLASH_FORWARD_SCHEMA",
    "CACHE_NAMES",
    "INT8_PRODUCT_FLAGS",
    "cache_field",
    "cache_from_kwargs",
    "cpu_flash_attention_ops",
    "cpu_has_fast_int8_products",
    "cpu_has_native_bf16_products",
    "disable_activation_checkpointing",
    "enable_activation_checkpointing",
    "export_program",
    "mask_cache_argument",
    "output_cache",
    "register_video_processor",
    "resolve_cache",
]
