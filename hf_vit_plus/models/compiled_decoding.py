"""Compiled decoding with a static cache, for the seq2seq Transformer and the Sparse Transformer LM.

`model.generate(..., cache_implementation="static")` pre-allocates every key/value buffer at its final size, so that
each decoding step has the same shapes and can run as one compiled graph (`torch.compile(fullgraph=True)`); the
encoder output and the cross-attention keys/values are computed once, by the uncompiled first step. transformers
compiles that step itself only on GPUs and only for greedy decoding and sampling; with `GenerationWithCompiledDecoding`
our models compile it on every device (CPU included) and for beam search too:

- `generate` picks a `CompileConfig` when the cache is static: the one passed as `compile_config=...`, else
  `compiled_generation_config(device)`. `disable_compile=True` keeps the static cache and decodes eagerly. Without a
  static cache `generate` is transformers' own, unchanged.
- each decoding step on a static cache (one new token per row, the cache already filled by the first step) goes
  through `model.get_compiled_call(compile_config)`, the compiled `__call__` that transformers' greedy and sampling
  loops use too, so that greedy, sampling and beam search share one compiled function per model.
- beam search reorders the static buffers in place (`reorder_cache_in_place`): a compiled graph reads the cache
  buffers at fixed addresses, and new tensors would cost a copy into them (CUDA graphs) or guard failures.

On CPU the default config also rewrites the one-row matrix products of a batch-1 step into loops that stream the
weights at memory speed (`row_matmul_pass`) and drives the kernels from C++ (`cpp_wrapper`); the dense attentions of a
traced one-token step run the reference kernel, which inductor fuses, instead of sdpa (`select_attention_kernel`).

The compiled step is traced once per combination of its static properties and recompiled when one changes: the
number of rows (batch size x beams, or x `num_return_sequences` when sampling), the static cache's length (the
largest `max_length` seen so far by this model, or `generation_config.max_cache_len`), the source length (encoder
output) of the seq2seq model, the dtype and device, the attention implementation, and the flags that change the
outputs (`output_attentions`, `output_hidden_states`). With `dynamic=False` (the default here) every such change is a
new graph: seconds of compilation on a CPU for a small model, less when inductor's on-disk cache
(`TORCHINDUCTOR_CACHE_DIR`) already holds it from an earlier process. Torch stops compiling a function after
`torch._dynamo.config.recompile_limit` (8) graphs, counted over every model of these two families in the process
(they share one `__call__`), and then runs it eagerly. Pad sources to a few lengths (`pad_to_multiple_of` in the
tokenizer) and set `max_cache_len` to keep the number of graphs small, or pass
`compile_config=compiled_generation_config(dynamic=None)` to let torch make the changing sizes symbolic after the
first recompile.
"""

from __future__ import annotations

import copy
import functools

import torch
from transformers import CompileConfig
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache, StaticLayer
from transformers.generation.configuration_utils import ALL_STATIC_CACHE_IMPLEMENTATIONS

from .compat import cache_from_kwargs
from .input_checks import check_generate_arguments


def compiled_generation_config(device: str | torch.device = "cpu", **overrides) -> CompileConfig:
    """The `CompileConfig` that `generate` uses for a static cache when none is passed: the whole step as one graph
    (`fullgraph=True`), fixed shapes (`dynamic=False`), flagged to compile on every device, CPU included.

    - CUDA: CUDA graphs (`mode="reduce-overhead"`, transformers' default).
    - CPU: inductor's default mode (CUDA graphs are CUDA-only) with two options: `row_matmul_pass()`, which turns the
      vector-matrix products of a one-row step into loops that stream the weights at memory speed, and
      `cpp_wrapper=True`, which runs the compiled step's kernel calls from C++ instead of Python (longer
      compilation, less overhead per step).

    `overrides` are `CompileConfig` fields, e.g. `dynamic=None`, or `options={...}` (which replaces the CPU options:
    merge them with `compiled_generation_config().options` to keep them)."""
    device_type = torch.device(device).type
    if device_type == "cuda":
        settings = dict(fullgraph=True, dynamic=False, mode="reduce-overhead")
    elif device_type == "cpu":
        # torch.compile takes a mode or options, not both; mode None with options is the default mode.
        options = {"post_grad_custom_post_pass": row_matmul_pass(), "cpp_wrapper": True}
        settings = dict(fullgraph=True, dynamic=False, mode=None, options=options)
    else:
        settings = dict(fullgraph=True, dynamic=False, mode="default")
    settings.update(overrides)
    config = CompileConfig(**settings)
    # transformers compiles on CPU only for a config carrying this flag (`GenerationMixin`'s auto-compile criteria).
    config._compile_all_devices = True
    return config


def decompose_row_matmuls(graph: torch.fx.Graph, max_rows: int = 1) -> int:
    """Rewrite each float32 CPU `mm` / `addmm` whose left operand has at most `max_rows` rows, x (M, K) @ W (K, N),
    as an elementwise product summed over K, and return how many were rewritten. Inductor compiles the product and
    the sum into one vectorised loop that reads W once; ATen's GEMM (MKL) reaches about half the memory bandwidth on
    such a vector-matrix product here, and a small decoding step is nothing but those. (Inductor's own
    `decompose_mm_pass` does the same but only up to 2,048 columns: not the output layer.)

    One row: sum_k x[k] * W[k, :]. Several rows (`max_rows` > 1): sum_k W^T[n, k] * x[m, k], with n outside m, so
    that each column of W is read once and used for every row while it is in the cache (MKL reads W once per row
    block; the loop pays at a few rows and not at many, so keep `max_rows` small: `bench_seq2seq.py` measures
    it)."""
    aten = torch.ops.aten
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.kwargs:  # addmm's beta / alpha: left alone
            continue
        if node.target is aten.mm.default:
            bias, (left, right) = None, node.args
        elif node.target is aten.addmm.default:
            bias, left, right = node.args
        else:
            continue
        value = left.meta.get("val") if isinstance(left, torch.fx.Node) else None
        if value is None or value.device.type != "cpu" or value.dtype != torch.float32:
            continue
        if value.dim() != 2 or not isinstance(value.shape[0], int) or not 1 <= value.shape[0] <= max_rows:
            continue
        with graph.inserting_before(node):
            if value.is_contiguous():
                # An identity view that inductor computes from a stored buffer (`as_strided` takes realized inputs):
                # otherwise a pointwise producer of x (a LayerNorm, an activation, the attention's weighted sum)
                # is inlined into the product's loop and recomputed for every column of W.
                left = graph.call_function(aten.as_strided.default, (left, list(value.shape), list(value.stride())))
            if value.shape[0] == 1:
                column = graph.call_function(aten.permute.default, (left, [1, 0]))  # (K, 1)
                product = graph.call_function(aten.mul.Tensor, (column, right))  # (K, N)
                result = graph.call_function(aten.sum.dim_IntList, (product, [0], True))  # (1, N)
            else:
                columns = graph.call_function(aten.permute.default, (right, [1, 0]))  # (N, K)
                columns = graph.call_function(aten.unsqueeze.default, (columns, 0))  # (1, N, K)
                rows = graph.call_function(aten.unsqueeze.default, (left, 1))  # (M, 1, K)
                product = graph.call_function(aten.mul.Tensor, (rows, columns))  # (M, N, K)
                result = graph.call_function(aten.sum.dim_IntList, (product, [2]))  # (M, N)
            if bias is not None:
                result = graph.call_function(aten.add.Tensor, (result, bias))
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


@functools.cache
def row_matmul_pass(max_rows: int = 1):
    """`decompose_row_matmuls` (products of at most `max_rows` rows) as an inductor post-grad pass (the option
    `post_grad_custom_post_pass`); one object per `max_rows`, which compares equal to its copies (transformers
    compares compile configs to reuse a compiled function), with a hash of this file and `max_rows` as its identity
    in inductor's cache. Built on first use: importing inductor takes a second."""
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

    class RowMatmulPass(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            decompose_row_matmuls(graph, max_rows)

        def uuid(self) -> bytes:
            return get_hash_for_files((__file__,)) + str(max_rows).encode()

        def __deepcopy__(self, memo) -> RowMatmulPass:
            return self

    return RowMatmulPass()


def is_static_cache(cache) -> bool:
    """A cache whose decoder buffers have a fixed size (transformers' criterion for compiling the decoding step)."""
    if not isinstance(cache, Cache) or not cache.is_compileable:
        return False
    decoder_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    return type(decoder_cache) is not DynamicCache


def reorder_cache_in_place(cache: Cache, beam_idx: torch.LongTensor) -> None:
    """Beam search's reordering of the rows of `cache`, writing the filled part of each static layer's buffers in
    place (their addresses stay those the compiled step was traced with); other layers reorder as usual."""
    filled = None  # the static layers' common count of tokens (the slots after it hold nothing yet), read once
    for layer in cache.layers:
        if type(layer) is not StaticLayer:
            layer.reorder_cache(beam_idx)
            continue
        if not layer.is_initialized:
            continue
        if filled is None:
            filled = int(layer.get_seq_length())
        if filled == 0:
            continue
        index = beam_idx.to(layer.keys.device)
        layer.keys[:, :, :filled] = layer.keys[:, :, :filled].index_select(0, index)
        layer.values[:, :, :filled] = layer.values[:, :, :filled].index_select(0, index)


class GenerationWithCompiledDecoding:
    """Mixin (before `GenerationMixin`) that runs each decoding step on a static cache compiled, on every device and
    for every decoding mode; see the module docstring."""

    # The CompileConfig of the `generate` call in progress when it decodes compiled, else None.
    _decoding_compile_config: CompileConfig | None = None

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, **kwargs):
        """transformers' `GenerationMixin.generate` (same arguments), compiled on a static cache.

        With a static cache (`cache_implementation="static"`, or a static `cache`, also accepted as
        `past_key_values`) the decoding steps run compiled with `compile_config`, by default
        `compiled_generation_config(self.device)`, unless `disable_compile=True`.

        Args:
            inputs: the prompt (decoder-only) or source (encoder-decoder) token ids.
            generation_config: the `GenerationConfig`; None: the model's.
            **kwargs: `generate`'s other arguments and generation settings.

        Returns:
            What `GenerationMixin.generate` returns: the token ids, or a `GenerateOutput` when asked for one.
        """
        check_generate_arguments(inputs, kwargs, generation_config or self.generation_config, self.config)
        compile_config = self._resolve_decoding_compile_config(generation_config, kwargs)
        if compile_config is None:
            return super().generate(inputs, generation_config=generation_config, **kwargs)
        kwargs["compile_config"] = compile_config
        outer = self._decoding_compile_config  # generate can nest (assisted decoding)
        self._decoding_compile_config = compile_config
        try:
            return super().generate(inputs, generation_config=generation_config, **kwargs)
        finally:
            self._decoding_compile_config = outer

    def _resolve_decoding_compile_config(self, generation_config, kwargs: dict) -> CompileConfig | None:
        """The CompileConfig to decode with, or None (no static cache, or `disable_compile=True`)."""
        base = generation_config if generation_config is not None else self.generation_config

        def setting(name: str):
            return kwargs[name] if name in kwargs else getattr(base, name, None)

        if setting("disable_compile") or setting("use_cache") is False:
            return None
        static = setting("cache_implementation") in ALL_STATIC_CACHE_IMPLEMENTATIONS
        if not (static or is_static_cache(cache_from_kwargs(kwargs))):
            return None
        config = setting("compile_config")
        if config is None:
            return compiled_generation_config(self.device)
        if not isinstance(config, CompileConfig):
            raise TypeError(f"`compile_config` must be a transformers.CompileConfig, got {type(config).__name__}.")
        if not config._compile_all_devices:
            config = copy.deepcopy(config)  # the caller's object stays as it was
            config._compile_all_devices = True
        return config

    def __call__(self, *args, **kwargs):
        # Beam search calls the model itself; greedy decoding and sampling call `get_compiled_call` already (then
        # this runs inside the compiled function, where `is_compiling()` is True).
        if not torch.compiler.is_compiling():
            config = self._decoding_compile_config
            if config is not None and not args and self._is_static_decoding_step(kwargs):
                return self.get_compiled_call(config)(**kwargs)
        return super().__call__(*args, **kwargs)

    def _is_static_decoding_step(self, kwargs: dict) -> bool:
        """One new token per row on top of a static cache that the first (uncompiled) step filled."""
        encoder_decoder = self.config.is_encoder_decoder
        ids = kwargs.get("decoder_input_ids" if encoder_decoder else "input_ids")
        cache = cache_from_kwargs(kwargs)
        if ids is None or ids.dim() != 2 or ids.shape[1] != 1 or not is_static_cache(cache):
            return False
        decoder_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        return decoder_cache.is_initialized


__all__ = [
    "GenerationWithCompiledDecoding",
    "compiled_generation_config",
    "decompose_row_matmuls",
    "is_static_cache",
    "reorder_cache_in_place",
    "row_matmul_pass",
]
