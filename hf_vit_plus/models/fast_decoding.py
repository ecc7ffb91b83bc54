"""Decoding without per-token framework overhead for the encoder-decoder Transformer: one compiled graph per token.

`generate(..., cache_implementation="static")` (compiled_decoding.py) compiles the model's `forward` and leaves the
loop to transformers: per token the loop prepares inputs, checks Dynamo's guards, runs the graph, then processes the
logits and does the beam bookkeeping eagerly, which costs milliseconds per step at many beams
(`scripts/benchmarks/bench_seq2seq.py` measures it). Here the whole step is one graph, called once per token from a
short Python loop:

- the decoder layers on a fixed-size self-attention cache, the output projection, the logits processors that
  translation uses (min length, single-token bad words, forced BOS / EOS) and the greedy choice, or transformers'
  vectorised beam search (top-k continuations, finished hypotheses with the length penalty, the early-stop heuristic);
- the encoder output and each layer's cross-attention keys and values are computed once per input, outside it;
- beam search never copies the self-attention cache: each row keeps the slot that holds each of its positions
  (`history`, gathered like the beams), and the attention reads keys and values through it;
- the loop calls the compiled graph under `torch.compiler.set_stance(skip_guard_eval_unsafe=True)`, so that Dynamo
  checks only the guards that tell its compiled shapes apart, not every weight, between tokens.

It is reached through transformers' own hook for a decoding loop, `generate(custom_generate=callable)`: `generate`
prepares everything as usual (settings, special tokens, the encoder output, the logits processors and stopping
criteria) and hands over the loop, so the settings mean exactly what they mean in eager `generate`:

    from hf_vit_plus.models.fast_decoding import FastDecoding

    fast = FastDecoding()                                   # float32: the tokens of eager `generate`
    model.generate(**batch, num_beams=4, max_new_tokens=64, custom_generate=fast)
    model.generate(**batch, custom_generate=FastDecoding(precision="int8"))   # int8 weights, see below

One `FastDecoding` object keeps, per model, the converted weights and the compiled steps; reuse it. A step is
compiled by AOTInductor at its first use for a decoding mode and a class of batch sizes (one row; up to `SMALL_ROWS`
rows; more: `_batch_range`), and serves every batch size of its class and every source and output length (all three
are dynamic in the compiled code); the compilation takes seconds to minutes per step, once per machine: the package
is kept on disk (`step_cache.py`, keyed by the weights, the step, the precision, torch, Python, threads and the
instruction set) and the next process loads it. An INFO line says which step is compiled and which is loaded from
where. Rows that are finished (greedy) and sources whose beams are (beam search) leave the running batch when the
step of the smaller batch is at hand (compiled or kept already): the same tokens, fewer rows per step.

Precisions (`fast_kernels.py`: the decoder's linear layers, the projections of its cross-attention keys and values,
and the output projection; the encoder's linear layers too under `FastDecoding.generate`, not under
`generate(custom_generate=...)`, which runs the model's encoder; embeddings, layer norms and attention stay in
float32): "float32" gives the tokens of eager decoding (tested): its greedy steps of
at most `SMALL_ROWS` rows choose each token through `OutputScreen`, a float16 pass over the output projection with an
error bound on every logit, the few candidates it leaves recomputed in float32, so that the token is float32's by
proof; a token the bound cannot prove (counted in `FastDecoding.screen_fallbacks`) is chosen from all float32 logits
(`screened_greedy=False`: always). "bfloat16", "int8", "int8-weight-only", "int8-dynamic" and "int8-fbgemm" convert
the weights (not the tokens of float32: see the docs' quality table); "int8" and "bfloat16" take the product the CPU
runs natively.

Supported: greedy decoding and beam search (`do_sample=False`), `max_length` / `max_new_tokens`, `min_length` /
`min_new_tokens`, `eos_token_id` (one or several), `pad_token_id`, `length_penalty`, `early_stopping`,
`num_return_sequences`, single-token `bad_words_ids`, `forced_bos_token_id`, `forced_eos_token_id`. Anything else
that changes the decoding (other logits processors or stopping criteria, sampling, scores or attentions in the
output, a decoder prompt, a filled cache) raises a ValueError naming it: use `generate` without `custom_generate`.

The engine is in three files: fast_layers.py holds the converted layers, encoder and decoder and their one-token
steps; fast_steps.py the compiled-step machinery (which compiled step serves a call, AOTInductor's packages, the
step cache's key); this module `FastDecoding` with its greedy and beam-search loops, the checks of the settings
(`_Settings`) and the conversions on the fly (`decodable_model`), and it re-exports the others' public names.
These modules ship with the checkpoints (remote code): they import only torch, transformers and their siblings.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
import importlib
import logging
import math
import os
import threading
import warnings
import weakref

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.generation import (
    EosTokenCriteria,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    MaxLengthCriteria,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
)

from .compat import cache_from_kwargs, cpu_has_fast_int8_products
from .decoding_rules import NEG_INF, DecodingRules
from .fast_kernels import (
    INT8_WEIGHT_ONLY_MAX_ROWS,
    PRECISIONS,
    SMALL_ROWS,
    FastLinear,
    fbgemm_int8_available,
    quantize_rows,
)
from .fast_layers import FastDecoder, FastDecoderLayer, FastEncoder, FastEncoderLayer
from .fast_steps import (
    _batch_range,  # noqa: F401 (imported from here by the tests)
    _shape_key,  # noqa: F401 (imported from here by the tests)
    _Steps,
    aoti_compile,
    aoti_load,
    aoti_package,
    compile_options,
    copy_args,
    step_counts,
)

logger = logging.getLogger(__name__)

# int8 products that do not pay on a CPU without native int8 products: "int8" takes FBGEMM's int8 linear there
# (the measurements are in the results of scripts/benchmarks/bench_seq2seq.py).
SLOW_INT8_WARNING = (
    "FastDecoding(precision={precision!r}) decodes more slowly than precision='float32' on the running CPU: it has no "
    "native int8 products (VNNI or AMX), so weight-only int8 converts the weights inside every product and dynamic "
    "int8 (torch._int_mm) runs a slow loop. For speed here use {advice}."
)
SUPPORTED_PROCESSORS = (
    NoBadWordsLogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
)
SUPPORTED_CRITERIA = (MaxLengthCriteria, EosTokenCriteria)
# Generation settings that would need the model's own outputs at each step, which the fused step does not return.
_UNSUPPORTED_OUTPUTS = (
    "return_dict_in_generate",
    "output_scores",
    "output_logits",
    "output_attentions",
    "output_hidden_states",
)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class _CacheSlabs:
    """Reused storage for the decoding loops' self-attention caches: one slab holds a call's every cache buffer
    ((2 x layers, rows, length, d_model), each buffer a contiguous view). A fresh tensor of a few megabytes costs its
    page faults at every call (about 1 ms per 2 MB here, more than a batch's short translations take to decode),
    reused memory only its zeroing. Slabs are taken out while a loop uses them and handed back after it (so that
    threads decoding at once never share one); at most `keep` idle slabs are kept, the largest."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self._idle: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, shape: tuple, device, zero: bool) -> torch.Tensor:
        """A float32 tensor of `shape` (a stacked cache: `FastDecoder.cache_shape`) on `device`, zeroed if `zero`."""
        numel = math.prod(shape)
        with self._lock:
            fits = [i for i, slab in enumerate(self._idle) if slab.device == device and slab.numel() >= numel]
            slab = self._idle.pop(min(fits, key=lambda i: self._idle[i].numel())) if fits else None
        if slab is None:
            slab = torch.empty(numel, device=device)
        out = slab[:numel].view(shape)
        return out.zero_() if zero else out

    def give(self, buffers: list[torch.Tensor]) -> None:
        """Hand back the slab under a cache (`take`'s views): it may serve the next call."""
        if not buffers or buffers[0]._base is None:
            return
        slab = buffers[0]._base
        with self._lock:
            if all(slab is not idle for idle in self._idle):
                self._idle.append(slab)
                self._idle.sort(key=torch.Tensor.numel, reverse=True)
                del self._idle[self.keep :]

    def cache(self, decoder: FastDecoder, rows: int, length: int, device) -> list[torch.Tensor]:
        """A self-attention cache of `decoder` (`FastDecoder.cache_shape`) in a reused slab, one tensor per layer's
        keys and values: zeroed where the decoder's attention reads positions not yet written
        (`FastDecoder.cache_needs_zeros`; a slab of a few megabytes takes longer to zero than a batch of short
        translations to decode), else as the last call left it."""
        return list(self.take(decoder.cache_shape(rows, length), device, zero=self.needs_zeros(decoder)).unbind(0))

    @staticmethod
    def needs_zeros(decoder) -> bool:
        """Whether `decoder`'s attention reads cache positions not yet written (`FastDecoder.cache_needs_zeros`;
        True for a decoder that does not say)."""
        return getattr(decoder, "cache_needs_zeros", True)

    def selected(
        self, decoder, cache: list[torch.Tensor], rows: torch.Tensor, written: int | None = None
    ) -> list[torch.Tensor]:
        """`decoder`'s cache's `rows` (indices) in a slab of their own; the old slab handed back. `written`: the
        positions written so far (None: all), the only ones copied (a loop drops rows a few steps into a cache of the
        longest length); the positions after them zeroed where the decoder needs zeros (`needs_zeros`, as `cache`
        zeroes), else left as the slab was."""
        zero = self.needs_zeros(decoder)
        shape = (len(cache), rows.shape[0]) + tuple(cache[0].shape[1:])
        out = self.take(shape, cache[0].device, zero=False)
        written = cache[0].shape[1] if written is None else min(written, cache[0].shape[1])
        for source, target in zip(cache, out.unbind(0)):
            torch.index_select(source[:, :written], 0, rows, out=target[:, :written])
            if zero and written < target.shape[1]:
                target[:, written:].zero_()
        self.give(cache)
        return list(out.unbind(0))


class _ModelDecoding:
    """What `FastDecoding` keeps per model: the converted decoder, its compiled steps, and the versions of the model's
    tensors it was built from (a change, e.g. by training, rebuilds it)."""

    def __init__(
        self,
        model: nn.Module,
        precision: str,
        backend: str,
        options: dict,
        skip_guards: bool,
        screen: bool,
        cache_dir=None,
    ):
        from .step_cache import weights_digest

        self.precision = precision
        self._owners = [(m._parameters, m._buffers, m._modules) for m in model.modules()]  # see `_versions`
        self.versions = self._versions(model)
        self.decoder = FastDecoder(model, precision, screen=screen).eval()
        self.encoder = FastEncoder(model, precision).eval() if FastEncoder.supports(model) else None
        reference = weakref.ref(model)  # not the model itself: the engine's dictionary of models holds it weakly

        def identity() -> str:
            return weights_digest(reference())

        self.steps = _Steps(self.decoder, backend, options, skip_guards, cache_dir, identity)
        self.slabs = _CacheSlabs()
        # tensors of every call that depend on the settings only (positions, pad token, logits processors' controls),
        # made once: a batch of short translations pays for each small tensor it makes
        self._constants: dict = {}

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
        """The encoder output of a source batch: the `FastEncoder`, compiled with the steps ("aoti": one call of a
        graph whose batch and source length are dynamic, kept in the step cache) after its eager checks."""
        compiled = functools.partial(self.steps.encoder_runner, self.encoder)
        return self.encoder(input_ids, attention_mask, compiled=compiled)

    def positions(self, count: int, device) -> list[torch.Tensor]:
        """The positions 0 .. count - 1, each a 0-d int64 tensor (the steps' `position`), made once per device."""
        made = self._constants.get(("positions", device), [])
        if len(made) < count:
            made = made + [torch.tensor(p, device=device) for p in range(len(made), count)]
            self._constants[("positions", device)] = made
        return made[:count]

    def token(self, token_id: int, device) -> torch.Tensor:
        """`token_id` as a 0-d int64 tensor, made once per device."""
        key = ("token", token_id, device)
        if key not in self._constants:
            self._constants[key] = torch.tensor(token_id, device=device)
        return self._constants[key]

    def controls(self, settings, device) -> tuple:
        """`settings.controls(device)`, made once per rules and device (the last few kept)."""
        key = ("controls", settings.rules, settings.vocab_size, device)
        controls = self._constants.get(key)
        if controls is None:
            for old in [k for k in self._constants if k[0] == "controls"][:-7]:  # a bound: each max_length is a key
                del self._constants[old]
            controls = self._constants[key] = settings.controls(device)
        return controls

    def _versions(self, model: nn.Module) -> tuple:
        # float32 steps read the model's tensors themselves: only replaced tensors make them stale; the converted
        # (bfloat16, int8) copies also go stale when a tensor is changed in place. Read from the dictionaries of
        # tensors and submodules of every module the model had when this state was built (`_owners`), not from a
        # walk of the modules at every call (a batch of short translations takes a millisecond or two): a tensor or
        # submodule replaced anywhere changes one of those dictionaries, so the check is as exact as a walk.
        owners = self._owners
        tensors = [t for parameters, buffers, _ in owners for owned in (parameters, buffers) for t in owned.values()]
        tensors = [t for t in tensors if t is not None]
        children = tuple(id(child) for _, _, modules in owners for child in modules.values())
        if self.precision == "float32":
            return (*map(id, tensors), children)
        return (*((id(t), t._version) for t in tensors), children)

    def current(self, model: nn.Module) -> bool:
        if self.versions != self._versions(model):
            return False
        if self.decoder.screen is not None:  # float32 weights changed in place: the screen's bounds follow
            self.decoder.screen.refresh()
        return True


BACKENDS = ("aoti", "compile", "eager")
# (engine, model, state) while `FastDecoding.generate` runs `model.generate`: the decoding loop it calls takes the
# state checked a moment before instead of walking the model's tensors again (per thread: a context variable)
_CHECKED_STATE: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("fast_decoding_state", default=None)


# Checkpoints FastDecoding converts on the fly, exactly: model_type -> (module, converter, the command that converts a
# folder once). Named as data, as a family record names its training task: the converters live above models/, which
# imports nothing of the package outside it, and where this file runs as a checkpoint's remote code without the
# package there is none to call.
EXACT_CONVERSIONS = {"marian": ("hf_vit_plus.conversion.marian", "seq2seq_from_marian", "hf-vit-plus convert marian")}


def decodable_model(model: nn.Module, converted: weakref.WeakKeyDictionary | None = None) -> nn.Module:
    """`model` where FastDecoding decodes it (the Seq2seq Transformer); a model of `EXACT_CONVERSIONS` (an opus-mt
    `MarianMTModel`) converted, with one log line saying so, kept in `converted` until its tensors change.

    Args:
        model: the model `generate` was called on.
        converted: where conversions are kept, per model (None: convert, keep nothing).

    Returns:
        The model to decode.

    Raises:
        ValueError: in one line, a model FastDecoding neither decodes nor converts, naming the command that
            converts a checkpoint once.
    """
    if hasattr(model.get_decoder() if hasattr(model, "get_decoder") else None, "max_positions"):
        return model
    name = type(model).__name__
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in EXACT_CONVERSIONS:
        commands = ", ".join(f"`{command}`" for _, _, command in EXACT_CONVERSIONS.values())
        raise ValueError(
            f"FastDecoding decodes the Seq2seq Transformer (Seq2SeqTransformerForConditionalGeneration), not {name}; "
            f"it converts an opus-mt MarianMTModel on the fly ({commands} converts one once)."
        )
    module, function, command = EXACT_CONVERSIONS[model_type]
    versions = tuple((id(t), t._version) for t in (*model.parameters(), *model.buffers()))
    cached = converted.get(model) if converted is not None else None
    if cached is not None and cached[0] == versions:
        return cached[1]
    try:
        convert = getattr(importlib.import_module(module), function)
    except ImportError:
        raise ValueError(
            f"FastDecoding converts a {name} on the fly with the hf_vit_plus package installed: install it, or "
            f"convert the checkpoint once with `{command} FOLDER OUTPUT` and decode the output."
        ) from None
    try:
        result = convert(model)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"FastDecoding: {error} (`{command}` refuses it too); use generate() without custom_generate."
        ) from None
    logger.warning(
        "FastDecoding: converted the %s to a Seq2SeqTransformerForConditionalGeneration on the fly (exact: the same "
        "tokens); `%s FOLDER OUTPUT` saves the converted checkpoint once.",
        name,
        command,
    )
    if converted is not None:
        converted[model] = (versions, result)
    return result


class FastDecoding:
    """A decoding loop for `generate(custom_generate=...)` that runs each token as one compiled graph (see the module
    docstring).

    precision: one of `PRECISIONS`. backend: "aoti" (AOTInductor, the default), "compile" (torch.compile) or "eager"
    (no compilation, for checks). shape_multiple: source and cache lengths are rounded up to a multiple of it (the
    padding is masked out); with backend "compile", which compiles a step per length, so that nearby lengths share
    one. options: inductor options (default `compile_options(device)`). skip_guards: with backend "compile", skip
    Dynamo's guards between tokens (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`). screened_greedy: in
    float32, greedy steps of at most `SMALL_ROWS` rows choose each token through `OutputScreen` (a float16 pass over
    the output projection, the candidates recomputed in float32, float32's token proven by an error bound), where
    torch has FBGEMM's float16 linear; False computes all logits in float32. The same tokens either way;
    `screened_steps` counts the greedy steps that went through the screen, `screen_fallbacks` those of them where it
    could not prove every row's token (chosen from all float32 logits instead). step_cache: with backend "aoti",
    where compiled steps are kept for the next process (`step_cache.py`): True (the default) for
    `step_cache.step_cache_dir()`, a folder, or False to keep nothing. drop_finished: finished rows (greedy) and
    sources whose beams are finished (beam search) leave the running batch (the same tokens; `dropped_rows` counts
    them); False keeps the whole batch to the end."""

    def __init__(
        self,
        precision: str = "float32",
        backend: str = "aoti",
        shape_multiple: int = 1,
        options: dict | None = None,
        skip_guards: bool = True,
        screened_greedy: bool = True,
        step_cache: bool | str | os.PathLike = True,
        drop_finished: bool = True,
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"Unknown precision {precision!r}: expected one of {', '.join(map(repr, PRECISIONS))}.")
        if backend not in BACKENDS:
            raise ValueError(f"Unknown backend {backend!r}: expected one of {', '.join(map(repr, BACKENDS))}.")
        if shape_multiple < 1:
            raise ValueError(f"shape_multiple must be >= 1, got {shape_multiple}.")
        self.precision = precision
        self.backend = backend
        self.shape_multiple = shape_multiple
        self.options = options
        self.skip_guards = skip_guards
        self.screened_greedy = screened_greedy
        if not isinstance(step_cache, (bool, str, os.PathLike)):
            raise TypeError(f"step_cache must be a bool or a folder, got {type(step_cache).__name__}.")
        self.step_cache = step_cache
        self.drop_finished = drop_finished
        self.screened_steps = 0
        self.screen_fallbacks = 0
        self.dropped_rows = 0
        self._models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._converted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Marian -> (versions, converted)
        self._warned = False

    def __repr__(self) -> str:
        return f"FastDecoding(precision={self.precision!r}, backend={self.backend!r})"

    def decoding_state(self, model: nn.Module) -> _ModelDecoding:
        """The converted decoder and compiled steps of `model`, built on first use and rebuilt when its weights
        changed since."""
        state = self._models.get(model)
        if state is None or not state.current(model):
            options = self.options if self.options is not None else compile_options(model.device)
            cache_dir = self.step_cache
            if cache_dir is True:
                from .step_cache import step_cache_dir

                cache_dir = step_cache_dir()
            state = _ModelDecoding(
                model,
                self.precision,
                self.backend,
                options,
                self.skip_guards,
                self.screened_greedy,
                cache_dir=cache_dir or None,
            )
            self._models[model] = state
            self._warn_if_slower_than_float32(state.decoder)
        return state

    @torch.no_grad()
    def generate(
        self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> torch.LongTensor:
        """`model.generate(input_ids, attention_mask=..., custom_generate=self, **kwargs)` with the encoder run by this
        engine too: its linear layers in `precision` (`FastEncoder`; the model's own encoder for a sparse one). In
        float32 the same tokens as `generate`'s own encoder gives; in the converted precisions the encoder's products
        are converted as the decoder's are.

        Args:
            model: a `Seq2SeqTransformerForConditionalGeneration`.
            input_ids: (B, S) source tokens.
            attention_mask: (B, S), 1 for real tokens (None: all real).
            **kwargs: `generate`'s settings (`num_beams`, `max_new_tokens`, ...).

        Returns:
            The sequences, as `generate` returns them.
        """
        if torch.is_tensor(input_ids) and input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, source length), got shape {tuple(input_ids.shape)}.")
        model = decodable_model(model, self._converted)
        state = self.decoding_state(model)
        checked = _CHECKED_STATE.set((self, model, state))
        try:
            if state.encoder is None:
                return model.generate(input_ids, attention_mask=attention_mask, custom_generate=self, **kwargs)
            encoder_outputs = state.encode(input_ids, attention_mask)
            kwargs.setdefault("use_cache", False)  # this loop keeps its own cache: generate need not build one
            return model.generate(
                encoder_outputs=encoder_outputs, attention_mask=attention_mask, custom_generate=self, **kwargs
            )
        finally:
            _CHECKED_STATE.reset(checked)

    def _warn_if_slower_than_float32(self, decoder: FastDecoder) -> None:
        """On a CPU without native int8 products (VNNI / AMX), weight-only and dynamic int8 decode more slowly than
        float32: say so, once. Read from the product the decoder's layers really use (FBGEMM's and our C++ kernel's
        vpmaddubsw path, `cpp_int8_rows`, are the fast ones)."""
        if self._warned or decoder.lm_head.weight.device.type != "cpu" or cpu_has_fast_int8_products():
            return
        head = decoder.lm_head
        if head.kernel(1) == "int8-weight-only" or (head.kernel(1) == "int8-dynamic" and head.cpp_int8 is None):
            self._warned = True
            advice = (
                "precision='int8', which takes FBGEMM's int8 products on such CPUs, or precision='float32'"
                if fbgemm_int8_available()
                else "precision='float32' (this torch has no FBGEMM int8 linear)"
            )
            message = SLOW_INT8_WARNING.format(precision=self.precision, advice=advice)
            warnings.warn(message, UserWarning, stacklevel=4)

    @torch.no_grad()
    def __call__(
        self,
        model,
        input_ids: torch.LongTensor,
        logits_processor=None,
        stopping_criteria=None,
        generation_config: GenerationConfig | None = None,
        synced_gpus: bool = False,
        **model_kwargs,
    ) -> torch.LongTensor:
        """The decoding loop `generate` calls with `custom_generate=self`, after its own preparation: `input_ids` are
        the decoder start tokens (batch x beams rows), `model_kwargs` hold the encoder output. Returns the sequences,
        as `generate` does."""
        model = decodable_model(model, self._converted)  # an opus-mt MarianMTModel: its exact conversion
        settings = _Settings(model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs)
        if synced_gpus:
            raise ValueError("FastDecoding does not run with synced_gpus=True (several processes): use generate().")
        checked = _CHECKED_STATE.get()
        if checked is not None and checked[0] is self and checked[1] is model:
            state = checked[2]  # checked by `generate` for this call
        else:
            state = self.decoding_state(model)
        encoder_outputs, mask = model_kwargs["encoder_outputs"], model_kwargs.get("attention_mask")
        return self.decode(state, settings, input_ids, encoder_outputs, mask)

    @staticmethod
    def checked_settings(model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs):
        """The settings of a call as the loop reads them (`__call__`'s arguments), checked: a ValueError names what the
        fused step does not implement. A caller that hands the same preparation over again (`Translator`) checks it
        once and calls `decode` with `settings.with_max_length(...)`."""
        return _Settings(model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs)

    @torch.no_grad()
    def decode(self, state, settings, input_ids, encoder_outputs, attention_mask=None) -> torch.LongTensor:
        """The decoding loop after the checks: `state` from `decoding_state(model)`, `settings` from
        `checked_settings`, `input_ids` the decoder start tokens (batch x beams rows), the encoder output and the
        source mask as `generate` expands them. Returns the sequences, as `generate` does."""
        cross, source_bias = self._encoder_inputs(state.decoder, settings, encoder_outputs, attention_mask)
        if settings.num_beams == 1:
            return self._greedy(state, settings, input_ids, cross, source_bias)
        return self._beam_search(state, settings, input_ids, cross, source_bias)

    def _encoder_inputs(self, decoder, settings, encoder_outputs, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Every decoder layer's cross-attention keys and values, once per source (not per beam), in the decoding
        precision, padded to a multiple of `shape_multiple` positions and at least 2: (layers, 2, B, S, D), and the
        source bias (B, S): 0 or -inf."""
        group = settings.expand
        encoder_states = encoder_outputs.last_hidden_state[::group]  # (B, S, D)
        batch, length, dim = encoder_states.shape
        padded = max(2, _round_up(length, self.shape_multiple))
        layers = decoder.layers
        if padded == length and mask is not None:  # no padding to add: one concatenation, the bias from the mask
            cross = torch.cat([t for layer in layers for t in layer.cross_keys_values(encoder_states)])
            source_bias = torch.where(mask[::group].bool(), 0.0, NEG_INF)  # (B, S) float32
            return cross.view(len(layers), 2, batch, length, dim), source_bias
        cross = encoder_states.new_zeros(len(layers), 2, batch, padded, dim)
        for i, layer in enumerate(layers):
            cross[i, 0, :, :length], cross[i, 1, :, :length] = layer.cross_keys_values(encoder_states)
        real = torch.zeros(batch, padded, dtype=torch.bool, device=encoder_states.device)
        real[:, :length] = True if mask is None else mask[::group].bool()
        source_bias = torch.zeros(batch, padded, device=encoder_states.device).masked_fill(~real, NEG_INF)
        return cross, source_bias

    def _greedy(self, state, settings, input_ids, cross, source_bias) -> torch.LongTensor:
        """transformers' greedy loop (`_sample` with do_sample=False), one `greedy_step` per token; finished rows
        leave the running batch (`_drops`), their later tokens are the padding eager decoding gives them."""
        rows, device = input_ids.shape[0], input_ids.device
        length = self._cache_length(settings)
        cache = state.slabs.cache(state.decoder, rows, length, device)
        controls, pad = state.controls(settings, device), state.token(settings.pad_token_id, device)
        unfinished = torch.ones(rows, dtype=torch.long, device=device)
        positions = state.positions(min(settings.max_length - 1, length), device)
        tokens = input_ids[:, 0].contiguous()  # the compiled step reads its inputs as contiguous (not expanded)

        def runner(tokens, cache, cross, source_bias, unfinished):
            args = (tokens, positions[0], cache, cross, source_bias, unfinished, pad, controls)
            screened = state.decoder.screen is not None and tokens.shape[0] <= SMALL_ROWS
            return state.steps.get("greedy_step", args, screened=screened), screened

        compiled, screened = runner(tokens, cache, cross, source_bias, unfinished)
        alive = None  # the row of the output of each running row (None: every row, in order)
        generated = []  # (alive, tokens) of each step
        with contextlib.ExitStack() as loop:
            for index, position in enumerate(positions):
                out = compiled(tokens, position, cache, cross, source_bias, unfinished, pad, controls)
                if screened:
                    self.screened_steps += 1
                    if not out[3]:
                        self.screen_fallbacks += 1  # not proven: the choice from all float32 logits
                        out = state.decoder.greedy_choice(out[4], position, unfinished, pad, controls)
                tokens, unfinished, more = out[:3]
                generated.append((alive, tokens))
                if not more:
                    break
                if index == 0:
                    loop.enter_context(state.steps.loop_context())
                args = (tokens, positions[0], cache, cross, source_bias, unfinished, pad, controls)
                keep = self._drops(state, "greedy_step", unfinished.bool(), args)
                if keep is not None:
                    self.dropped_rows += tokens.shape[0] - keep.shape[0]
                    tokens, unfinished = tokens[keep], unfinished[keep]
                    cache = state.slabs.selected(state.decoder, cache, keep, written=index + 1)
                    cross, source_bias = cross.index_select(2, keep), source_bias.index_select(0, keep)
                    alive = keep if alive is None else alive[keep]
                    compiled, screened = runner(tokens, cache, cross, source_bias, unfinished)
        state.slabs.give(cache)
        if more:
            settings.check_length(len(generated))
        return torch.cat([input_ids, _scattered(generated, rows, settings.pad_token_id)], dim=1)

    def _drops(self, state, method: str, running: torch.Tensor, args: tuple) -> torch.Tensor | None:
        """The sources to keep running (indices), when enough of them are finished (`running`: (B,) bool) that
        dropping the others pays (an eighth of the batch, one source at least) and the step for the smaller batch is
        at hand (built, kept on disk, or uncompiled: no compilation to drop rows); else None."""
        batch = running.shape[0]
        if not self.drop_finished or batch == 1:
            return None
        left = int(running.sum())
        if left == batch or left == 0 or (batch - left) * 8 < batch:
            return None
        if method == "beam_step":
            constants = {"keep": args[-1]}
            args = args[:-1]
        else:
            constants = {"screened": state.decoder.screen is not None and left <= SMALL_ROWS}
        if not state.steps.available(method, args, left, **constants):
            return None
        return running.nonzero()[:, 0]

    def _beam_search(self, state, settings, input_ids, cross, source_bias) -> torch.LongTensor:
        """transformers' beam search (`_beam_search` without sampling), one `beam_step` per token; a source whose
        hypotheses can no longer change (`_finished_sources`) leaves the running batch with them."""
        rows, device = input_ids.shape[0], input_ids.device
        beams = settings.num_beams
        batch = rows // beams
        length = self._cache_length(settings)
        total = length + 1  # sequence slots: the start token and `length` new tokens (>= max_length)
        cache = state.slabs.cache(state.decoder, rows, length, device)
        controls = state.controls(settings, device)
        denominators = settings.denominators(total, device)
        running = torch.full((batch, beams, total), settings.fill_value, dtype=torch.long, device=device)
        running[:, :, 0] = input_ids[:, 0].view(batch, beams)
        running_scores = torch.zeros(batch, beams, device=device)
        running_scores[:, 1:] = -1e9
        running_indices = torch.full((batch, beams, total - 1), -1, dtype=torch.int32, device=device)
        beam_state = (
            running,
            running_scores,
            running_indices,
            running.clone(),
            torch.full((batch, beams), -1e9, device=device),
            running_indices.clone(),
            torch.zeros(batch, beams, dtype=torch.bool, device=device),
            torch.ones(batch, 1, dtype=torch.bool, device=device),
            torch.arange(rows, device=device)[:, None].repeat(1, length),  # the cache history: no position yet
        )
        keep = max(2, 1 + len(settings.eos_token_ids)) * beams
        early_stopping = settings.rules.early_stopping is True
        positions = state.positions(min(settings.max_length - 1, length), device)
        returned = settings.num_return_sequences
        sequences = running.new_empty(batch, returned, total)  # each source's hypotheses, once final
        indices = running_indices.new_empty(batch, returned, total - 1)
        alive = torch.arange(batch, device=device)  # the source of each running source
        step = state.steps.get(
            "beam_step", (positions[0], cache, cross, source_bias, beam_state, denominators, controls), keep=keep
        )
        steps = 0
        with contextlib.ExitStack() as loop:
            for position in positions:
                beam_state, done = step(position, cache, cross, source_bias, beam_state, denominators, controls)
                steps += 1
                if done:
                    break
                if steps == 1:
                    loop.enter_context(state.steps.loop_context())
                running_sources = ~_finished_sources(beam_state, early_stopping)
                args = (positions[0], cache, cross, source_bias, beam_state, denominators, controls, keep)
                kept = self._drops(state, "beam_step", running_sources, args)
                if kept is None:
                    continue
                gone = (~running_sources).nonzero()[:, 0]
                self.dropped_rows += gone.shape[0] * beams
                sequences[alive[gone]] = beam_state[3][gone, :returned]
                indices[alive[gone]] = beam_state[5][gone, :returned]
                kept_rows = (kept[:, None] * beams + torch.arange(beams, device=device)).view(-1)
                renumbered = torch.full((beam_state[8].shape[0],), -1, dtype=torch.long, device=device)
                renumbered[kept_rows] = torch.arange(kept_rows.shape[0], device=device)
                *search, history = beam_state
                beam_state = (
                    *(t.index_select(0, kept) for t in search),
                    renumbered[history.index_select(0, kept_rows)],
                )
                cache = state.slabs.selected(state.decoder, cache, kept_rows, written=steps)
                cross, source_bias = cross.index_select(2, kept), source_bias.index_select(0, kept)
                alive = alive[kept]
                args = (positions[0], cache, cross, source_bias, beam_state, denominators, controls)
                step = state.steps.get("beam_step", args, keep=keep)
        state.slabs.give(cache)
        if not done:
            settings.check_length(steps)
        sequences[alive] = beam_state[3][:, :returned]
        indices[alive] = beam_state[5][:, :returned]
        sequences = sequences.reshape(batch * returned, total)
        indices = indices.reshape(batch * returned, total - 1)
        generated = int(((indices + 1).bool()).sum(dim=1).max())
        return sequences[:, : 1 + generated]

    def _cache_length(self, settings) -> int:
        """The self-attention cache's positions: max_length - 1 rounded up to `shape_multiple`, at least 2, within the
        position table (eager decoding raises when it gets past the table; so does `check_length`)."""
        needed = settings.max_length - 1
        return max(2, min(_round_up(needed, self.shape_multiple), settings.max_positions))


def _scattered(generated: list, rows: int, pad: int) -> torch.Tensor:
    """(rows, steps) tokens from `generated`, each step's (rows it ran, tokens): padding where a row did not run."""
    out = torch.full((rows, len(generated)), pad, dtype=generated[0][1].dtype, device=generated[0][1].device)
    start = 0
    while start < len(generated):
        alive, end = generated[start][0], start + 1
        while end < len(generated) and generated[end][0] is alive:
            end += 1
        block = torch.stack([tokens for _, tokens in generated[start:end]], dim=1)
        if alive is None:
            out[:, start:end] = block
        else:
            out[alive, start:end] = block
        start = end
    return out


def _finished_sources(beam_state: tuple, early_stopping: bool) -> torch.Tensor:
    """(B,) bool: the sources whose finished hypotheses no later step changes (`beam_search_update` adds none): no
    running beam can beat the worst finished one any more (the early-stop heuristic), or all are finished under
    `early_stopping=True`."""
    finished, improvable = beam_state[6], beam_state[7][:, 0]
    if early_stopping:
        return ~improvable | finished.all(dim=1)
    return ~improvable


class _Settings:
    """The decoding settings of one `generate` call, read from what `generate` prepared, and checked: anything that
    the fused step does not implement is a ValueError naming it."""

    def __init__(self, model, input_ids, logits_processor, stopping_criteria, config, model_kwargs):
        problems = []
        if config is None:
            raise ValueError("FastDecoding is called by generate(custom_generate=...), with a generation_config.")
        if not getattr(model.config, "is_encoder_decoder", False) or not hasattr(model.get_decoder(), "layers"):
            raise ValueError(f"FastDecoding decodes the encoder-decoder Transformer, not {type(model).__name__}.")
        if input_ids.shape[1] != 1:
            problems.append(f"a decoder prompt of {input_ids.shape[1]} tokens (only the decoder start token)")
        if config.do_sample:
            problems.append("do_sample=True (sampling)")
        problems += [f"{name}=True" for name in _UNSUPPORTED_OUTPUTS if getattr(config, name, False)]
        problems += [
            f"the logits processor {type(p).__name__}"
            for p in logits_processor or []
            if type(p) not in SUPPORTED_PROCESSORS
        ]
        problems += [
            f"the stopping criterion {type(c).__name__}"
            for c in stopping_criteria or []
            if type(c) not in SUPPORTED_CRITERIA
        ]
        bad_words = config.bad_words_ids or []
        if any(len(sequence) != 1 for sequence in bad_words):
            problems.append("bad_words_ids of more than one token")
        cache = cache_from_kwargs(model_kwargs)
        if cache is not None and cache.get_seq_length() > 0:
            problems.append("a cache that already holds tokens")
        if model_kwargs.get("decoder_attention_mask") is not None:
            problems.append("a decoder_attention_mask")
        if model_kwargs.get("encoder_outputs") is None:
            problems.append("no encoder output (pass input_ids to generate)")
        if problems:
            raise ValueError(
                "FastDecoding (generate(custom_generate=FastDecoding(...))) does not implement "
                + "; ".join(problems)
                + ". Call generate() without custom_generate for these."
            )
        self.model = model
        # generate resolved max_length (max_new_tokens included) before handing over the loop
        self.rules = DecodingRules.from_generation_config(config)
        self.num_beams = self.rules.num_beams
        self.num_return_sequences = self.rules.num_return_sequences
        self.expand = max(self.num_beams, self.num_return_sequences)
        self.max_length = self.rules.max_length
        self.max_positions = model.get_decoder().max_positions
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.eos_token_ids = self.rules.eos_token_ids
        self.pad_token_id = self.rules.pad_token_id
        self.fill_value = self.rules.beam_fill_value

    def with_max_length(self, max_length: int) -> _Settings:
        """These settings with another `max_length` (a call of the same settings with another length limit)."""
        if max_length == self.max_length:
            return self
        changed = copy.copy(self)
        changed.rules = dataclasses.replace(self.rules, max_length=int(max_length))
        changed.max_length = changed.rules.max_length
        return changed

    def controls(self, device) -> tuple:
        """The logits processors' tensors for `decoding_rules.process_scores`."""
        return self.rules.controls(self.vocab_size, device)

    def denominators(self, total: int, device) -> torch.Tensor:
        """(2, total + 1): the length penalty's and the early-stop heuristic's denominators."""
        return self.rules.length_penalty_denominators(total, device)

    def check_length(self, generated: int) -> None:
        """Decoding stopped with sequences unfinished: only because the position table ended before max_length.
        Eager decoding raises there too."""
        if generated < self.max_length - 1:
            raise ValueError(
                f"The target sequence has {generated + 1} positions but max_position_embeddings is "
                f"{self.max_positions}; shorten or split the input (no silent truncation)."
            )


# The engine's names, the converted layers' (fast_layers.py) and the compiled steps' (fast_steps.py) among them: users,
# tests and scripts import them from here.
__all__ = [
    "BACKENDS",
    "INT8_WEIGHT_ONLY_MAX_ROWS",
    "PRECISIONS",
    "SMALL_ROWS",
    "FastDecoder",
    "FastDecoderLayer",
    "FastDecoding",
    "FastEncoder",
    "FastEncoderLayer",
    "FastLinear",
    "aoti_compile",
    "aoti_load",
    "aoti_package",
    "compile_options",
    "copy_args",
    "quantize_rows",
    "step_counts",
]
