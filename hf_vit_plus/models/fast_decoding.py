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

This module ships with the checkpoints (remote code): it imports only torch, transformers and its siblings.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import importlib
import logging
import os
import time
import warnings
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
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
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention import eager_attention_forward, select_attention_kernel
from .compat import aoti_flat_call, cache_from_kwargs, cpu_has_fast_int8_products, export_program
from .compiled_decoding import row_matmul_pass
from .decoding_rules import NEG_INF, DecodingRules, advance_greedy, beam_search_update, process_scores
from .fast_kernels import (
    INT8_WEIGHT_ONLY_MAX_ROWS,
    PRECISIONS,
    SMALL_ROWS,
    FastLinear,
    OutputScreen,
    cache_attention,
    cpp_kernels,
    fbgemm_fp16_available,
    fbgemm_int8_available,
    fused_attention_available,
    quantize_rows,
    source_attention,
    stacked_linear,
    topk_rows,
)
from .layers import residual_sublayer, split_heads

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


class FastDecoderLayer(nn.Module):
    """A decoder layer of `Seq2SeqTransformerLayer` on (rows, d_model) states: the layer's own norms, activation and
    order of sub-layers (`layers.residual_sublayer`), its projections as `FastLinear`, and attention over the fused
    step's fixed-size cache (what is particular to this engine)."""

    def __init__(self, layer: nn.Module, precision: str):
        super().__init__()
        self.normalize_before = layer.normalize_before
        self.num_heads = layer.self_attn.num_heads
        self.scaling = layer.self_attn.scaling
        attention = layer.self_attn
        # converted weights (not float32's, which are the model's own tensors): the query, key and value projections
        # as one product (the same per-row int8 / bf16 weights, one call instead of three)
        self.qkv_proj = None
        if precision != "float32":
            self.qkv_proj = FastLinear(stacked_linear(attention.q_proj, attention.k_proj, attention.v_proj), precision)
        else:
            self.q_proj = FastLinear(attention.q_proj, precision)
            self.k_proj = FastLinear(attention.k_proj, precision)
            self.v_proj = FastLinear(attention.v_proj, precision)
        self.o_proj = FastLinear(layer.self_attn.o_proj, precision)
        self.cross_q_proj = FastLinear(layer.encoder_attn.q_proj, precision)
        self.cross_o_proj = FastLinear(layer.encoder_attn.o_proj, precision)
        cross = layer.encoder_attn  # its keys and values: once per input (`cross_keys_values`), not in the step
        self.cross_kv_proj = None
        if precision != "float32":
            self.cross_kv_proj = FastLinear(stacked_linear(cross.k_proj, cross.v_proj), precision)
        else:
            self.cross_k_proj = FastLinear(cross.k_proj, precision)
            self.cross_v_proj = FastLinear(cross.v_proj, precision)
        self.fc1 = FastLinear(layer.fc1, precision)
        self.fc2 = FastLinear(layer.fc2, precision)
        self.activation_fn = layer.activation_fn
        self.self_attn_layer_norm = layer.self_attn_layer_norm
        self.encoder_attn_layer_norm = layer.encoder_attn_layer_norm
        self.final_layer_norm = layer.final_layer_norm
        # the new token's attention in one C++ kernel per layer where the CPU runs it (`fused_attention_available`)
        self.fused_attention = fused_attention_available(attention.o_proj.weight, self.num_heads)

    def self_attention(self, hidden, position, keys, values, history):
        """Masked self-attention of one new token per row over the cached positions 0..position.

        keys, values: (R, L, D) cache buffers, written at `position` in place. history: None (row r's positions are
        in slot r) or (R, L) the slot that holds each position of row r (beam search)."""
        rows, length, dim = keys.shape
        heads = self.num_heads
        if self.qkv_proj is not None:
            query, key, value = self.qkv_proj(hidden).split(dim, dim=1)  # (R, D) each
        else:
            query, key, value = self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)
        keys.index_copy_(1, position.view(1), key.unsqueeze(1))
        values.index_copy_(1, position.view(1), value.unsqueeze(1))
        if self.fused_attention:
            return self.o_proj(cache_attention(query, keys, values, position, history, heads, self.scaling))
        if history is not None:
            slots = history * length + torch.arange(length, device=history.device)  # (R, L)
            keys = keys.reshape(rows * length, dim)[slots]  # (R, L, D)
            values = values.reshape(rows * length, dim)[slots]
        query = query.reshape(rows, 1, heads, dim // heads)
        scores = (query * keys.view(rows, length, heads, dim // heads)).sum(-1) * self.scaling  # (R, L, H)
        future = torch.arange(length, device=keys.device) > position  # (L,)
        scores = scores.masked_fill(future.view(1, length, 1), NEG_INF)
        probs = scores.softmax(dim=1)
        out = (probs.unsqueeze(-1) * values.view(rows, length, heads, dim // heads)).sum(1)  # (R, H, Dh)
        return self.o_proj(out.reshape(rows, dim))

    def cross_keys_values(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cross-attention's keys and values of the encoder output `states` (B, S, D), each (B, S, D)."""
        batch, length, dim = states.shape
        flat = states.reshape(batch * length, dim)
        if self.cross_kv_proj is not None:
            keys, values = self.cross_kv_proj(flat).split(dim, dim=1)
        else:
            keys, values = self.cross_k_proj(flat), self.cross_v_proj(flat)
        return keys.view(batch, length, dim), values.view(batch, length, dim)

    def cross_attention(self, hidden, keys, values, source_bias):
        """Attention of each row over its source: keys, values (B, S, D), computed once per input; the R rows are
        B sources x R/B beams. source_bias: (B, S), 0 for real tokens, -inf for padding."""
        rows, dim = hidden.shape
        batch, length, _ = keys.shape
        heads = self.num_heads
        if self.fused_attention:
            query = self.cross_q_proj(hidden)
            return self.cross_o_proj(source_attention(query, keys, values, source_bias, heads, self.scaling))
        query = self.cross_q_proj(hidden).view(batch, rows // batch, 1, heads, dim // heads)
        keys = keys.view(batch, 1, length, heads, dim // heads)
        scores = (query * keys).sum(-1) * self.scaling + source_bias.view(batch, 1, length, 1)  # (B, N, S, H)
        probs = scores.softmax(dim=2)
        out = (probs.unsqueeze(-1) * values.view(batch, 1, length, heads, dim // heads)).sum(2)  # (B, N, H, Dh)
        return self.cross_o_proj(out.reshape(rows, dim))

    def forward(self, hidden, position, keys, values, cross, source_bias, history):
        """keys, values: (R, L, D) this layer's self-attention cache, written in place (separate graph inputs: a write
        into a view of a larger input would make the compiled graph copy all of it); cross: (2, B, S, D). The
        sub-layers are composed as the model's layer composes them (`layers.residual_sublayer`)."""
        norm_first = self.normalize_before

        def self_attention(states):
            return self.self_attention(states, position, keys, values, history)

        def cross_attention(states):
            return self.cross_attention(states, cross[0], cross[1], source_bias)

        def feed_forward(states):
            return self.fc2(self.activation_fn(self.fc1(states)))

        hidden = residual_sublayer(hidden, self_attention, self.self_attn_layer_norm, norm_first)
        hidden = residual_sublayer(hidden, cross_attention, self.encoder_attn_layer_norm, norm_first)
        return residual_sublayer(hidden, feed_forward, self.final_layer_norm, norm_first)


class FastEncoderLayer(nn.Module):
    """An encoder layer of `Seq2SeqTransformerLayer` on (B, T, D) states: the layer's own norms, activation, order of
    sub-layers (`layers.residual_sublayer`) and attention kernel (the model's choice, `select_attention_kernel`), its
    projections as `FastLinear` in the decoding precision."""

    def __init__(self, layer: nn.Module, precision: str):
        super().__init__()
        attention = layer.self_attn
        self.attention = attention  # the model's module: its kernel reads its attributes (is_causal, training, ...)
        self.normalize_before = layer.normalize_before
        self.num_heads = attention.num_heads
        self.scaling = attention.scaling
        self.qkv_proj = None
        if precision != "float32":  # one product of the converted weights (float32: the model's own tensors)
            self.qkv_proj = FastLinear(stacked_linear(attention.q_proj, attention.k_proj, attention.v_proj), precision)
        else:
            self.q_proj = FastLinear(attention.q_proj, precision)
            self.k_proj = FastLinear(attention.k_proj, precision)
            self.v_proj = FastLinear(attention.v_proj, precision)
        self.o_proj = FastLinear(attention.o_proj, precision)
        self.fc1 = FastLinear(layer.fc1, precision)
        self.fc2 = FastLinear(layer.fc2, precision)
        self.activation_fn = layer.activation_fn
        self.self_attn_layer_norm = layer.self_attn_layer_norm
        self.final_layer_norm = layer.final_layer_norm

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """hidden: (B, T, D); mask: None or (B, 1, 1, T) boolean, True for real tokens."""
        batch, length, dim = hidden.shape

        def self_attention(states):
            flat = states.reshape(batch * length, dim)
            if self.qkv_proj is not None:
                projected = self.qkv_proj(flat).split(dim, dim=1)
            else:
                projected = (self.q_proj(flat), self.k_proj(flat), self.v_proj(flat))
            query, key, value = (split_heads(t.view(batch, length, dim), self.num_heads) for t in projected)
            config = self.attention.config
            kernel = select_attention_kernel(
                config._attn_implementation, None, hidden.device.type, False, length, length, dim // self.num_heads
            )
            attention_fn = ALL_ATTENTION_FUNCTIONS.get_interface(kernel, eager_attention_forward)
            out = attention_fn(self.attention, query, key, value, mask, dropout=0.0, scaling=self.scaling)[0]
            return self.o_proj(out.reshape(batch * length, dim)).view(batch, length, dim)  # out: (B, T, H, Dh)

        def feed_forward(states):
            flat = states.reshape(batch * length, dim)
            return self.fc2(self.activation_fn(self.fc1(flat))).view(batch, length, dim)

        norm_first = self.normalize_before
        hidden = residual_sublayer(hidden, self_attention, self.self_attn_layer_norm, norm_first)
        return residual_sublayer(hidden, feed_forward, self.final_layer_norm, norm_first)


class FastEncoder(nn.Module):
    """The encoder of a `Seq2SeqTransformerForConditionalGeneration` with its linear layers in the decoding precision
    (`FastDecoding.generate`): the stack's own embeddings, checks and final norm, `FastEncoderLayer`s. Dense encoders
    only (`supports`)."""

    def __init__(self, model: nn.Module, precision: str):
        super().__init__()
        self.stack = model.get_encoder()
        self.layers = nn.ModuleList(FastEncoderLayer(layer, precision) for layer in self.stack.layers)

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """Whether this class runs `model`'s encoder: dense attention (a sparse encoder runs its own kernels)."""
        return not getattr(model.get_encoder(), "sparse_encoder", False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> BaseModelOutput:
        """input_ids, attention_mask: (B, T) -> the encoder output, as `generate` passes it on (`encoder_outputs`)."""
        hidden = self.stack.embed(input_ids, None)  # (B, T, D): the model's embeddings, positions and checks
        if attention_mask is not None:
            self.stack._check_masks(attention_mask, None, None, ("input_ids", tuple(input_ids.shape)), 0)
        mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()[:, None, None]
        for layer in self.layers:
            hidden = layer(hidden, mask)
        if self.stack.layer_norm is not None:
            hidden = self.stack.layer_norm(hidden)
        return BaseModelOutput(last_hidden_state=hidden)


class FastDecoder(nn.Module):
    """The decoder of a `Seq2SeqTransformerForConditionalGeneration` as one-token steps: `logits`, and the greedy
    and beam-search steps that `FastDecoding` compiles."""

    def __init__(self, model: nn.Module, precision: str = "float32", screen: bool = False):
        super().__init__()
        if precision not in PRECISIONS:
            raise ValueError(f"Unknown precision {precision!r}: expected one of {', '.join(map(repr, PRECISIONS))}.")
        decoder = model.get_decoder()
        self.precision = precision
        self.embed_tokens = decoder.embed_tokens
        self.embed_scale = decoder.embed_scale
        self.register_buffer("embed_positions", decoder.embed_positions, persistent=False)
        self.layers = nn.ModuleList(FastDecoderLayer(layer, precision) for layer in decoder.layers)
        self.layer_norm = decoder.layer_norm
        bias = getattr(model, "final_logits_bias", None)
        self.lm_head = FastLinear(model.get_output_embeddings(), precision, bias=None if bias is None else bias[0])
        # float32 greedy steps of few rows choose their tokens through `OutputScreen` where FBGEMM's float16 linear is
        screened = screen and precision == "float32" and self.lm_head.weight.device.type == "cpu"
        self.screen = OutputScreen(self.lm_head) if screened and fbgemm_fp16_available() else None
        self.num_layers = len(self.layers)
        self.d_model = self.embed_positions.shape[1]
        # beam search's top-k of the candidates by the C++ kernel where the CPU runs it (`fast_kernels.topk_rows`)
        self.fast_topk = self.lm_head.weight.device.type == "cpu" and cpp_kernels().level is not None
        # whether products of 2 to SMALL_ROWS rows are loops over a fixed number of rows (`row_matmul_pass`), so that
        # each such batch is compiled for its own size (`_batch_range`); float32 takes the packed product where its
        # row range holds them (`packed_float32_rows`)
        kernel, packed = self.lm_head.kernel(2), self.lm_head.packed_float32
        packs_two = packed is not None and packed[0] <= 2 and (packed[1] is None or packed[1] >= 2)
        row_loops = kernel in ("bfloat16-rows", "int8-weight-only") or (kernel == "float32" and not packs_two)
        self.static_small_rows = self.lm_head.weight.device.type == "cpu" and row_loops

    def new_cache(self, rows: int, length: int, device) -> list[torch.Tensor]:
        """Zeroed self-attention keys and values: layer 0's keys, its values, layer 1's keys, ..., each
        (rows, length, d_model)."""
        return [torch.zeros(rows, length, self.d_model, device=device) for _ in range(2 * self.num_layers)]

    def hidden(self, tokens, position, cache, cross, source_bias, history=None):
        """tokens: (R,) the token at `position` (a 0-d tensor) of every row -> (R, D) the last hidden states."""
        positions = self.embed_positions.index_select(0, position.view(1))  # (1, D)
        hidden = self.embed_tokens(tokens) * self.embed_scale + positions  # (R, D)
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, position, cache[2 * i], cache[2 * i + 1], cross[i], source_bias, history)
        if self.layer_norm is not None:
            hidden = self.layer_norm(hidden)
        return hidden

    def logits(self, tokens, position, cache, cross, source_bias, history=None):
        """tokens: (R,) the token at `position` (a 0-d tensor) of every row -> (R, V) float32 logits."""
        return self.lm_head(self.hidden(tokens, position, cache, cross, source_bias, history))

    # the logits processors (`decoding_rules.process_scores`), also called by the output screen
    process = staticmethod(process_scores)

    def greedy_step(self, tokens, position, cache, cross, source_bias, unfinished, pad, controls, screened=False):
        """One greedy token per row (transformers' `_sample` without sampling): returns the next tokens (R,), the
        rows still unfinished (R,) int64 and whether any is (0-d bool). screened: choose the tokens through
        `self.screen`, and also return whether it proved them (0-d bool) and the hidden states (R, D), from which
        `greedy_choice` takes the choice from all logits where it did not."""
        hidden = self.hidden(tokens, position, cache, cross, source_bias)
        if not screened:
            return self.greedy_choice(hidden, position, unfinished, pad, controls)
        next_tokens, certain = self.screen(hidden, position + 1, controls)
        return (*advance_greedy(next_tokens, position + 1, unfinished, pad, controls), certain, hidden)

    def greedy_choice(self, hidden, position, unfinished, pad, controls):
        """`greedy_step`'s choice from the hidden states (R, D), through all float32 logits."""
        cur_len = position + 1  # the decoder start token is position 0
        scores = self.process(self.lm_head(hidden), cur_len, controls)  # (R, V)
        # argmax as two plain reductions (the first of the largest, as argmax takes it), which inductor vectorises
        # better than its fused argmax
        vocab = scores.shape[1]
        ids = torch.arange(vocab, device=scores.device)
        best = scores.amax(dim=1, keepdim=True)
        next_tokens = torch.where(scores == best, ids, vocab).amin(dim=1).clamp(max=vocab - 1)
        return advance_greedy(next_tokens, cur_len, unfinished, pad, controls)

    def beam_step(self, position, cache, cross, source_bias, state, denominators, controls, keep: int):
        """One step of transformers' vectorised beam search (`_beam_search` without sampling) on `state`: the search's
        tensors (`decoding_rules.beam_search_update`) and the cache history (B x K, L), in which each row keeps the
        slot that holds each of its positions. Returns the new state and whether the search is over (0-d bool)."""
        *search, history = state
        running = search[0]
        batch, beams, total = running.shape
        rows = batch * beams
        cur_len = position + 1  # the length of the sequences so far, decoder start token included
        steps = torch.arange(total, device=running.device)
        tokens = running.view(rows, total).gather(1, position.view(1, 1).expand(rows, 1)).view(rows)
        own_slot = torch.arange(rows, device=history.device)[:, None]
        history = torch.where(steps[: history.shape[1]] == position, own_slot, history)
        logits = self.logits(tokens, position, cache, cross, source_bias, history)
        log_probs = process_scores(F.log_softmax(logits, dim=-1), cur_len, controls)  # (R, V)
        topk = topk_rows if self.fast_topk else torch.topk
        search, beam_idx, done = beam_search_update(
            log_probs, cur_len, tuple(search), denominators, controls, keep, steps, topk
        )
        # the cache follows the beams (transformers reorders it): row r continues row beam_idx[r]
        history = history.index_select(0, beam_idx)
        return (*search, history), done


def compile_options(device: str | torch.device = "cpu") -> dict:
    """inductor options of the fused step: on CPU the products of at most `SMALL_ROWS` rows become loops that read
    each weight once at memory speed (`row_matmul_pass`, as in compiled_decoding.py)."""
    if torch.device(device).type == "cpu":
        return {"post_grad_custom_post_pass": row_matmul_pass(SMALL_ROWS)}
    return {}


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class _Step(nn.Module):
    """One step method of a `FastDecoder` as a module (what torch.export takes), its Python-number arguments fixed."""

    def __init__(self, decoder: FastDecoder, method: str, **constants):
        super().__init__()
        self.decoder = decoder
        self.method = method
        self.constants = constants

    def forward(self, *args):
        return getattr(self.decoder, self.method)(*args, **self.constants)


def _batch_range(batch: int, group: int, static_small_rows: bool = False) -> tuple[int, int | None]:
    """The batch sizes (sources) that one compiled step serves, for `group` rows per source (beams): those whose rows
    (batch x group) take the same products (`FastLinear.kernel`) and the same greedy choice (the output screen):
    one row; at most `SMALL_ROWS` rows; more (no upper bound: None). A batch of one is a class of its own (torch.export
    specializes a size of 1); so is each batch of at most `SMALL_ROWS` rows where those products are loops over a
    fixed number of rows (`static_small_rows`: `row_matmul_pass`)."""
    rows = batch * group
    if batch == 1:
        return 1, 1
    if rows <= SMALL_ROWS:
        return (batch, batch) if static_small_rows else (2, SMALL_ROWS // group)
    return max(2, SMALL_ROWS // group + 1), None


def _step_sizes(method: str, args) -> tuple[int, int, int]:
    """(batch, rows per source, decoder layers) of a step's arguments."""
    if method == "greedy_step":  # tokens, position, cache, cross, source_bias, unfinished, pad, controls
        return args[0].shape[0], 1, len(args[2])
    running = args[4][0]  # position, cache, cross, source_bias, state (running, ...), denominators, controls
    return running.shape[0], running.shape[1], len(args[1])


def _shape_key(method: str, args, constants: dict, dynamic: bool, static_small_rows: bool = False, batch=None):
    """What selects a compiled step: the method, its fixed Python numbers and the shapes of its tensors, and torch's
    threads (inductor writes its loops for the threads of the process that compiles them). Dynamic (AOTInductor):
    the class of batch sizes (`_batch_range`) and the rows per source instead of the shapes (the cache and source
    lengths and the batch vary in the compiled code); `batch` asks for another batch size than that of `args`."""
    leaves = torch.utils._pytree.tree_leaves(args)
    if dynamic:
        size, group, layers = _step_sizes(method, args)
        shapes = (_batch_range(size if batch is None else batch, group, static_small_rows), group, layers)
    elif batch is None:
        shapes = tuple(tuple(t.shape) for t in leaves)
    else:
        return None  # a batch that is not the arguments': a shape compiled only when it comes
    dtypes = tuple(t.dtype for t in leaves)
    return method, tuple(sorted(constants.items())), shapes, dtypes, torch.get_num_threads()


def _axes(**axes) -> dict | None:
    """A `dynamic_shapes` entry: {axis: Dim} of the axes that vary (None: a static tensor)."""
    entry = {int(axis[1:]): dim for axis, dim in axes.items() if dim is not None}
    return entry or None


def _dynamic_shapes(method: str, args, batch_range: tuple[int, int | None] = (1, 1)) -> tuple:
    """torch.export's `dynamic_shapes` of a step's arguments: the self-attention cache's length L and the source
    length S vary (both at least 2: the caller pads), and the batch B over `batch_range` (rows: B x beams), so that
    one compiled step serves every length and every batch of its class."""
    from torch.export import Dim

    length, source = Dim("cache_length", min=2), Dim("source_length", min=2)
    low, high = batch_range
    batch = None
    if low != high:
        batch = Dim("batch", min=low) if high is None else Dim("batch", min=low, max=high)
    if method == "greedy_step":  # tokens, position, cache, cross, source_bias, unfinished, pad, controls
        rows = _axes(a0=batch)
        cache = [_axes(a0=batch, a1=length)] * len(args[2])
        cross, bias = _axes(a2=batch, a3=source), _axes(a0=batch, a1=source)
        return ((rows, None, cache, cross, bias, rows, None, (None,) * len(args[7])),)
    # position, cache, cross, source_bias, state, denominators, controls
    beams = args[4][0].shape[1]
    rows = None if batch is None else beams * batch
    cache = [_axes(a0=rows, a1=length)] * len(args[1])
    cross, bias = _axes(a2=batch, a3=source), _axes(a0=batch, a1=source)
    sequences, indices, per_source = _axes(a0=batch, a2=length + 1), _axes(a0=batch, a2=length), _axes(a0=batch)
    history = _axes(a0=rows, a1=length)
    state = (sequences, per_source, indices, sequences, per_source, indices, per_source, per_source, history)
    return ((None, cache, cross, bias, state, {1: length + 2}, (None,) * len(args[6])),)


# Steps this process compiled and loaded from disk ("compiled", "loaded"), over every FastDecoding
step_counts: collections.Counter = collections.Counter()


class _Steps:
    """The compiled steps of one `FastDecoder`, one per method and shape class (`_shape_key`):

    - "aoti" (the default): the step is exported (`torch.export`) and compiled by AOTInductor into a shared library,
      called from C++: no Dynamo and no guard between tokens. The library holds no weights: they are the decoder's
      own tensors, passed as user-managed constants (float32: the model's parameters themselves). The cache and
      source lengths and the batch size (within its class, `_batch_range`) are dynamic. With `cache_dir`, the
      compiled package is kept there (`step_cache.py`) and loaded by the next process instead of compiled.
    - "compile": `torch.compile(fullgraph=True, dynamic=False)`; `skip_guards=True` runs the calls after the first of
      each `generate` under `torch.compiler.set_stance(skip_guard_eval_unsafe=True)`.
    - "eager": the same step without compilation (for checks)."""

    def __init__(
        self, decoder: FastDecoder, backend: str, options: dict, skip_guards: bool, cache_dir=None, identity=None
    ):
        self.decoder = decoder
        self.backend = backend
        self.options = options
        self.skip_guards = skip_guards
        self.cache_dir = cache_dir
        self.identity = identity  # () -> the model's weights digest (`step_cache.weights_digest`), asked once
        self._weights = None
        self.runners: dict = {}

    def _key(self, method: str, args: tuple, constants: dict, batch=None):
        static = self.decoder.static_small_rows
        return _shape_key(method, args, constants, self.backend == "aoti", static, batch)

    def available(self, method: str, args: tuple, batch: int, **constants) -> bool:
        """Whether the step of `method` for `batch` sources (otherwise like `args`) runs without compiling: built
        already, kept on disk, or uncompiled (backend "eager")."""
        if self.backend == "eager":
            return True
        key = self._key(method, args, constants, batch)
        if key is None:
            return False
        if key in self.runners:
            return True
        return self.backend == "aoti" and self.cache_dir is not None and self._package_path(key).is_file()

    def get(self, method: str, args: tuple, **constants):
        """The runner of `method` for arguments shaped like `args`, built (compiled or loaded) at its first use."""
        key = self._key(method, args, constants)
        runner = self.runners.get(key)
        if runner is None:
            module = _Step(self.decoder, method, **constants)
            if self.backend == "aoti":
                runner = self._aoti_runner(key, module, args)
                runner = aoti_flat_call(runner) or runner
            elif self.backend == "compile":
                runner = _compiled_runner(module, args, self.options, len(self.runners))
            else:
                runner = module
            self.runners[key] = runner
        return runner

    def _package_path(self, key):
        from .step_cache import step_key

        if self._weights is None:
            self._weights = self.identity() if self.identity is not None else ""
        method, constants, shapes, dtypes, _ = key
        parts = dict(method=method, constants=constants, shapes=shapes, dtypes=dtypes, weights=self._weights)
        parts.update(precision=self.decoder.precision, options=_options_identity(self.options))
        # the ops the step calls: the C++ kernels' (`hf_vit_plus_cpp::...`) where they are built, else the Python ones
        # (asked of the module, as the decoder's products ask it when they choose their op)
        kernels = importlib.import_module(cpp_kernels.__module__)
        parts.update(cpp_kernels=(kernels.cpp_fbgemm_ops(), tuple(kernels.cpp_kernels())))
        return Path(self.cache_dir) / step_key(**parts)

    def _aoti_runner(self, key, module: nn.Module, args: tuple):
        (low, high), group = key[2][0], key[2][1]
        sizes = f"{low}" if low == high else f"{low}-{high}" if high is not None else f"{low}+"
        what = f"the {key[0].replace('_step', '')} step ({self.decoder.precision}, batch {sizes}"
        what += f" x {group} beams)" if group > 1 else ")"
        dynamic_shapes = _dynamic_shapes(key[0], args, key[2][0])
        if self.cache_dir is None:
            started = time.perf_counter()
            logger.info("FastDecoding: compiling %s (not kept: no step cache)", what)
            runner = aoti_compile(module, args, dynamic_shapes, self.options)
            step_counts["compiled"] += 1
            logger.info("FastDecoding: compiled %s in %.1f s", what, time.perf_counter() - started)
            return runner
        from .step_cache import load_or_build

        path = self._package_path(key)
        started = time.perf_counter()

        def build(target: str) -> None:
            logger.info("FastDecoding: compiling %s, once per machine, into %s", what, path)
            aoti_package(module, args, dynamic_shapes, self.options, target)
            step_counts["compiled"] += 1

        runner, built = load_or_build(path, build, functools.partial(aoti_load, module))
        if built:
            logger.info("FastDecoding: compiled %s in %.1f s", what, time.perf_counter() - started)
        else:
            step_counts["loaded"] += 1
            logger.info("FastDecoding: loaded %s from %s in %.2f s", what, path, time.perf_counter() - started)
        return runner

    def loop_context(self):
        """The context of the calls after the first of a `generate` call."""
        if self.backend == "compile" and self.skip_guards:
            return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
        return contextlib.nullcontext()


def _options_identity(options: dict) -> dict:
    """inductor options as text for a step's key (a custom pass by its own `uuid`)."""
    out = {}
    for name, value in sorted(options.items()):
        uuid = getattr(value, "uuid", None)
        out[name] = uuid().hex() if callable(uuid) else repr(value)
    return out


def aoti_package(module: nn.Module, args: tuple, dynamic_shapes, options: dict | None, path: str) -> str:
    """`module` exported with `args` (`torch.export`, `dynamic_shapes` as it takes them) and compiled by AOTInductor
    with the inductor `options` (default `compile_options()`) into the package `path`, without its parameters and
    buffers (`aoti_load` passes the module's own tensors)."""
    import torch._inductor

    options = compile_options() if options is None else options
    exported = export_program(module, args, dynamic_shapes=dynamic_shapes, strict=False)
    configs = {**options, "aot_inductor.package_constants_in_so": False}
    return torch._inductor.aoti_compile_and_package(exported, package_path=path, inductor_configs=configs)


def aoti_load(module: nn.Module, path: str):
    """The AOTInductor package at `path` (`aoti_package`) loaded, its constants the tensors of `module` (user-managed:
    not copied)."""
    import torch._inductor

    runner = torch._inductor.aoti_load_package(path)
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    constants = {name: tensors[name] for name in runner.get_constant_fqns()}
    runner.load_constants(constants, check_full_update=True, user_managed=True)
    return runner


def aoti_compile(module: nn.Module, args: tuple, dynamic_shapes=None, options: dict | None = None):
    """`module` exported with `args` (`torch.export`, `dynamic_shapes` as it takes them), compiled by AOTInductor
    with the inductor `options` (default `compile_options()`) and loaded; its parameters and buffers are not copied
    into the library but passed as user-managed constants (the module's own tensors). Returns the callable."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hf_vit_plus_fast_decoding_") as folder:
        path = aoti_package(module, args, dynamic_shapes, options, os.path.join(folder, "step.pt2"))
        return aoti_load(module, path)


def _compiled_runner(module: nn.Module, args: tuple, options: dict, compiled_so_far: int):
    """`module` under torch.compile, compiled now on `args` (each shape is one more entry of the same code object:
    torch's recompile limit is raised to hold them all)."""
    import torch._dynamo

    compiled = torch.compile(module, fullgraph=True, dynamic=False, options=options)
    limit = max(torch._dynamo.config.recompile_limit, compiled_so_far + 2)
    with torch._dynamo.config.patch(recompile_limit=limit):
        compiled(*copy_args(args))
    return compiled


def copy_args(args):
    """A copy of the tensors of `args` (a trial call must not write into the caller's cache)."""
    return torch.utils._pytree.tree_map(lambda t: t.clone() if torch.is_tensor(t) else t, args)


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
        self.versions = self._versions(model)
        self.decoder = FastDecoder(model, precision, screen=screen).eval()
        self.encoder = FastEncoder(model, precision).eval() if FastEncoder.supports(model) else None
        reference = weakref.ref(model)  # not the model itself: the engine's dictionary of models holds it weakly

        def identity() -> str:
            return weights_digest(reference())

        self.steps = _Steps(self.decoder, backend, options, skip_guards, cache_dir, identity)

    def _versions(self, model: nn.Module) -> tuple:
        # float32 steps read the model's tensors themselves: only replaced tensors make them stale; the converted
        # (bfloat16, int8) copies also go stale when a tensor is changed in place.
        tensors = [*model.parameters(), *model.buffers()]
        if self.precision == "float32":
            return tuple(id(t) for t in tensors)
        return tuple((id(t), t._version) for t in tensors)

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
            encoder_outputs = state.encoder(input_ids, attention_mask)
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
        cross, source_bias = self._encoder_inputs(state.decoder, settings, model_kwargs)
        if settings.num_beams == 1:
            return self._greedy(state, settings, input_ids, cross, source_bias)
        return self._beam_search(state, settings, input_ids, cross, source_bias)

    def _encoder_inputs(self, decoder, settings, model_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Every decoder layer's cross-attention keys and values, once per source (not per beam), in the decoding
        precision, padded to a multiple of `shape_multiple` positions and at least 2: (layers, 2, B, S, D), and the
        source bias (B, S): 0 or -inf."""
        group = settings.expand
        encoder_states = model_kwargs["encoder_outputs"].last_hidden_state[::group]  # (B, S, D)
        mask = model_kwargs.get("attention_mask")
        batch, length, dim = encoder_states.shape
        padded = max(2, _round_up(length, self.shape_multiple))
        layers = decoder.layers
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
        cache = state.decoder.new_cache(rows, length, device)
        controls, pad = settings.controls(device), torch.tensor(settings.pad_token_id, device=device)
        unfinished = torch.ones(rows, dtype=torch.long, device=device)
        positions = [torch.tensor(p, device=device) for p in range(min(settings.max_length - 1, length))]
        tokens = input_ids[:, 0]

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
                    cache = [buffer.index_select(0, keep) for buffer in cache]
                    cross, source_bias = cross.index_select(2, keep), source_bias.index_select(0, keep)
                    alive = keep if alive is None else alive[keep]
                    compiled, screened = runner(tokens, cache, cross, source_bias, unfinished)
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
        cache = state.decoder.new_cache(rows, length, device)
        controls = settings.controls(device)
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
        positions = [torch.tensor(p, device=device) for p in range(min(settings.max_length - 1, length))]
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
                cache = [buffer.index_select(0, kept_rows) for buffer in cache]
                cross, source_bias = cross.index_select(2, kept), source_bias.index_select(0, kept)
                alive = alive[kept]
                args = (positions[0], cache, cross, source_bias, beam_state, denominators, controls)
                step = state.steps.get("beam_step", args, keep=keep)
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


__all__ = [
    "BACKENDS",
    "INT8_WEIGHT_ONLY_MAX_ROWS",
    "PRECISIONS",
    "SMALL_ROWS",
    "FastDecoder",
    "FastDecoding",
    "FastLinear",
    "aoti_compile",
    "compile_options",
    "quantize_rows",
]
