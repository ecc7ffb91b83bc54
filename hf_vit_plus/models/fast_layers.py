"""The encoder-decoder Transformer converted for the fused decoding step (`fast_decoding.py`): its layers, encoder and
decoder with the linear layers in the decoding precision (`fast_kernels.FastLinear`), and the one-token step methods
that the engine compiles.

- `FastDecoderLayer`: a decoder layer on (rows, d_model) states, self-attention over a fixed-size cache that beam
  search reads through each row's slot history (never copied), cross-attention over keys and values computed once
  per input (`cross_keys_values`);
- `FastEncoderLayer` and `FastEncoder`: the dense encoder in the decoding precision (`FastDecoding.generate`);
- `FastDecoder`: the decoder stack and output projection as `logits`, and the steps `greedy_step` (float32's
  choice proven through `OutputScreen` where it runs) and `beam_step` (transformers' vectorised beam search,
  `decoding_rules.beam_search_update`).

The compiled-step machinery is fast_steps.py's; the decoding loops and the engine, fast_decoding.py's. This module
ships with the checkpoints (remote code): it imports only torch, transformers and its siblings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention import eager_attention_forward, select_attention_kernel
from .decoding_rules import NEG_INF, advance_greedy, beam_search_update, process_scores
from .fast_kernels import (
    PRECISIONS,
    FastLinear,
    OutputScreen,
    cache_attention,
    cpp_kernels,
    fbgemm_fp16_available,
    fused_attention_available,
    source_attention,
    stacked_linear,
    topk_rows,
)
from .input_checks import check_token_ids
from .layers import residual_sublayer, split_heads


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

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None, kernel: str | None = None) -> torch.Tensor:
        """hidden: (B, T, D); mask: None or (B, 1, 1, T) boolean, True for real tokens; kernel: the attention kernel
        (None: the model's choice for this length, `select_attention_kernel`; a compiled encoder names it, since its
        length is a symbol)."""
        batch, length, dim = hidden.shape

        def self_attention(states):
            flat = states.reshape(batch * length, dim)
            if self.qkv_proj is not None:
                projected = self.qkv_proj(flat).split(dim, dim=1)
            else:
                projected = (self.q_proj(flat), self.k_proj(flat), self.v_proj(flat))
            query, key, value = (split_heads(t.view(batch, length, dim), self.num_heads) for t in projected)
            attention_fn = ALL_ATTENTION_FUNCTIONS.get_interface(
                kernel or self.kernel(length, hidden.device.type), eager_attention_forward
            )
            out = attention_fn(self.attention, query, key, value, mask, dropout=0.0, scaling=self.scaling)[0]
            return self.o_proj(out.reshape(batch * length, dim)).view(batch, length, dim)  # out: (B, T, H, Dh)

        def feed_forward(states):
            flat = states.reshape(batch * length, dim)
            return self.fc2(self.activation_fn(self.fc1(flat))).view(batch, length, dim)

        norm_first = self.normalize_before
        hidden = residual_sublayer(hidden, self_attention, self.self_attn_layer_norm, norm_first)
        return residual_sublayer(hidden, feed_forward, self.final_layer_norm, norm_first)

    def kernel(self, length: int, device_type: str) -> str:
        """The attention kernel the model's own layer runs over `length` tokens."""
        requested = self.attention.config._attn_implementation
        head_dim = self.o_proj.weight.shape[1] // self.num_heads
        return select_attention_kernel(requested, None, device_type, False, length, length, head_dim)


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

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, compiled=None
    ) -> BaseModelOutput:
        """input_ids, attention_mask: (B, T) -> the encoder output, as `generate` passes it on (`encoder_outputs`).

        `compiled`: None, or `(kernel, length) -> runner or None`, the compiled `hidden_states` for the attention
        kernel and the source length (`fast_steps._Steps.encoder_runner`): after the checks, the encoder is one call
        of it (None: this module's own layers run)."""
        runner = None
        shaped = torch.is_tensor(input_ids) and input_ids.dim() == 2 and input_ids.shape[0] > 0
        if compiled is not None and shaped and 2 <= input_ids.shape[1] <= self.stack.max_positions:
            length = input_ids.shape[1]
            kernel = self.layers[0].kernel(length, input_ids.device.type) if len(self.layers) else "eager"
            runner = compiled(kernel, length)
        if runner is None:
            hidden = self.stack.embed(input_ids, None)  # (B, T, D): the model's embeddings, positions and checks
        else:  # the check of `embed` that reads the ids (its others hold: the shape and length are checked above)
            check_token_ids("input_ids", input_ids, self.stack.embed_tokens.num_embeddings)
        if attention_mask is not None:
            self.stack._check_masks(attention_mask, None, None, ("input_ids", tuple(input_ids.shape)), 0)
        if runner is not None:
            real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
            # contiguous: the compiled code reads its inputs with the strides of a contiguous tensor of their shape
            hidden = runner(input_ids.contiguous(), real.contiguous()[:, None, None])
            return BaseModelOutput(last_hidden_state=hidden)
        mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()[:, None, None]
        for layer in self.layers:
            hidden = layer(hidden, mask)
        if self.stack.layer_norm is not None:
            hidden = self.stack.layer_norm(hidden)
        return BaseModelOutput(last_hidden_state=hidden)

    def hidden_states(self, input_ids: torch.Tensor, mask: torch.Tensor, kernel: str) -> torch.Tensor:
        """What a compiled encoder computes (`fast_steps._Steps.encoder_runner`): input_ids (B, T), mask (B, 1, 1, T)
        boolean (True: a real token), the attention kernel named -> (B, T, D) the last hidden states. The checks are
        `forward`'s, made before the call."""
        hidden = self.stack.embed(input_ids, None)
        for layer in self.layers:
            hidden = layer(hidden, mask, kernel)
        if self.stack.layer_norm is not None:
            hidden = self.stack.layer_norm(hidden)
        return hidden


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
        # whether a new cache must be zeroed: the tensor attention weighs every cached position (a later one by 0,
        # which leaves NaN from stale memory NaN); the C++ kernels read the positions written so far only
        self.cache_needs_zeros = not all(layer.fused_attention for layer in self.layers)
        # beam search's top-k of the candidates by the C++ kernel where the CPU runs it (`fast_kernels.topk_rows`)
        self.fast_topk = self.lm_head.weight.device.type == "cpu" and cpp_kernels().level is not None
        # whether products of 2 to SMALL_ROWS rows are loops over a fixed number of rows (`row_matmul_pass`), so that
        # each such batch is compiled for its own size (`_batch_range`); float32 takes the packed product where its
        # row range holds them (`packed_float32_rows`)
        kernel, packed = self.lm_head.kernel(2), self.lm_head.packed_float32
        packs_two = packed is not None and packed[0] <= 2 and (packed[1] is None or packed[1] >= 2)
        row_loops = kernel in ("bfloat16-rows", "int8-weight-only") or (kernel == "float32" and not packs_two)
        self.static_small_rows = self.lm_head.weight.device.type == "cpu" and row_loops

    def cache_shape(self, rows: int, length: int) -> tuple[int, int, int, int]:
        """The self-attention cache's keys and values stacked: (2 x layers, rows, length, d_model), in the order layer
        0's keys, its values, layer 1's keys, ...; the steps take it unbound, one (rows, length, d_model) tensor each
        (`fast_decoding._CacheSlabs.cache` makes it, zeroed)."""
        return (2 * self.num_layers, rows, length, self.d_model)

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


__all__ = ["FastDecoder", "FastDecoderLayer", "FastEncoder", "FastEncoderLayer"]
