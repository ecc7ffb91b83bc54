"""The encoder-decoder Transformer (Vaswani et al., NeurIPS 2017, "Attention Is All You Need", arXiv 1706.03762).

Read top to bottom: multi-head attention (sec. 3.2) -> one layer class for both stacks (sec. 3.1: self-attention,
cross-attention in the decoder only, position-wise feed-forward network, each sub-layer wrapped as
LayerNorm(x + Dropout(Sublayer(x)))) -> one stack class with an `is_decoder` flag (embeddings scaled by
sqrt(d_model) plus sinusoidal positions, sec. 3.4-3.5) -> the pre-trained base -> the bare model -> the model
with the tied pre-softmax projection and the label-smoothed loss (sec. 5.4). Parameter names follow
transformers' BART/Marian, so `model.encoder.layers.0.self_attn.q_proj.weight` means what it means there.

Optional sparse encoder (`config.encoder_attention_type` "strided" or "fixed"): the encoder's self-attention follows
the bidirectional Sparse Transformer pattern (Child et al. 2019; `sparse_layouts.py`), computed by a sparse kernel of
`sparse_attention.py`, loaded only then; the source padding mask reaches it as a 2-D boolean key mask. The decoder's
self-attention and the cross-attention stay dense. `attention.select_attention_kernel` says which kernel each
attention runs; the dense attentions' masks are built for that kernel.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask, create_masks_for_generate
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention import eager_attention_forward, select_attention_kernel, sparse_padding_mask
from .compat import cache_field, mask_cache_argument, output_cache, resolve_cache
from .compiled_decoding import GenerationWithCompiledDecoding, reorder_cache_in_place
from .configuration_seq2seq_transformer import Seq2SeqTransformerConfig
from .hub_mixin import HubMixin
from .input_checks import IGNORE_INDEX, check_mask_shape, check_not_empty, check_token_ids, tracing
from .layers import config_flag, residual_sublayer, split_heads, token_cross_entropy
from .positional import sinusoidal_position_table
from .sparse_layouts import SparsePattern, pattern_from_config

# The paper's decoding (sec. 6.1): beam size 4, length penalty alpha = 0.6. Its maximum output length,
# "input length + 50", depends on each input: pass `max_new_tokens=input_ids.shape[1] + 50` to `generate`.
PAPER_GENERATION_SETTINGS = {"num_beams": 4, "length_penalty": 0.6}


def refuse_position_ids(kwargs: dict) -> None:
    """The model numbers each row's tokens 0..T-1 itself (sinusoidal positions), so it has no `position_ids`, and
    padding-free packing (several sequences in one row, marked by restarting `position_ids`, as
    `DataCollatorWithFlattening` gives) would let them attend to one another: refuse both rather than ignore them."""
    given = [name for name in ("position_ids", "decoder_position_ids") if kwargs.get(name) is not None]
    if given:
        raise ValueError(
            f"Seq2SeqTransformer takes no {' or '.join(f'`{name}`' for name in given)}: it numbers the tokens of each "
            "row from 0 itself, so padding-free packing (several sequences in one row) is not supported. Pad the "
            "batch instead (`attention_mask` / `decoder_attention_mask`, e.g. DataCollatorForSeq2Seq)."
        )


class _MaskConfig:
    """The config as transformers' mask builders see it, with `_attn_implementation` the kernel the dense attentions
    run (`select_attention_kernel`), when that is not the configured one (a sparse kernel's mask function returns a
    2-D padding mask, which the dense attentions cannot use)."""

    def __init__(self, config: Seq2SeqTransformerConfig, kernel: str):
        self._config = config
        self._attn_implementation = kernel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int | None, decoder_start_token_id: int | None):
    """Decoder inputs are the targets shifted right by one position (sec. 3.1): prepend `decoder_start_token_id`,
    drop the last label and replace the loss's ignore index -100 by the pad id."""
    if decoder_start_token_id is None:
        raise ValueError(
            "`config.decoder_start_token_id` is None: it is needed to build `decoder_input_ids` from `labels`. "
            "Set it on the config (e.g. to the tokenizer's bos or pad id)."
        )
    if pad_token_id is None:
        raise ValueError(
            "`config.pad_token_id` is None: it is needed to replace the ignored label -100 in `decoder_input_ids`."
        )
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class Seq2SeqTransformerAttention(nn.Module):
    """Multi-head attention (sec. 3.2.2): MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O.

    Self-attention when `key_value_states` is None, else cross-attention with queries from the decoder and keys and
    values from the encoder output. `select_attention_kernel` picks the kernel from `config._attn_implementation`.
    With a `sparse_pattern` (the encoder's self-attention of a sparse encoder) a sparse kernel computes it; the
    pattern travels to the kernel as the attributes `sparse_pattern` and `layer_idx`.
    """

    def __init__(
        self,
        config: Seq2SeqTransformerConfig,
        num_heads: int,
        layer_idx: int,
        is_causal: bool,
        sparse_pattern: SparsePattern | None = None,
    ):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5  # 1 / sqrt(d_k), eq. 1
        self.attention_dropout = config.attention_dropout
        # sdpa assumes a causal mask when it gets none: only the decoder's self-attention is causal.
        self.is_causal = is_causal
        self.sparse_pattern = sparse_pattern
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.o_proj = nn.Linear(config.d_model, config.d_model)

    def _project(self, states: torch.Tensor, proj: nn.Linear) -> torch.Tensor:
        return split_heads(proj(states), self.num_heads)  # (B, H, T, Dh)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_len, _ = hidden_states.shape
        is_cross_attention = key_value_states is not None
        query = self._project(hidden_states, self.q_proj)  # (B, H, Tq, Dh)

        if is_cross_attention and cache is not None and cache.is_updated.get(self.layer_idx):
            # The encoder output does not change while decoding: its keys/values were computed at the first step.
            layer_cache = cache.cross_attention_cache.layers[self.layer_idx]
            key, value = layer_cache.keys, layer_cache.values
        else:
            source = key_value_states if is_cross_attention else hidden_states
            key = self._project(source, self.k_proj)  # (B, H, Tk, Dh)
            value = self._project(source, self.v_proj)
            if cache is not None:
                if is_cross_attention:
                    key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                    cache.is_updated[self.layer_idx] = True
                else:
                    key, value = cache.self_attention_cache.update(key, value, self.layer_idx)

        # A sparse self-attention's attention_mask is None or the (B, Tk) boolean padding mask (True = real token).
        implementation = select_attention_kernel(
            self.config._attn_implementation,
            self.sparse_pattern,
            query.device.type,
            output_attentions,
            seq_len,
            head_dim=query.shape[-1],
        )
        attention_fn = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        dropout = self.attention_dropout if self.training else 0.0
        attn_output, attn_weights = attention_fn(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling
        )
        attn_output = attn_output.reshape(batch_size, seq_len, -1).contiguous()  # (B, Tq, H*Dh)
        return self.o_proj(attn_output), attn_weights


class Seq2SeqTransformerLayer(GradientCheckpointingLayer):
    """One encoder layer (self-attention, FFN) or decoder layer (masked self-attention, cross-attention, FFN).

    Each sub-layer is LayerNorm(x + Dropout(Sublayer(x))) (post-norm, sec. 3.1 and 5.4); with
    `config.normalize_before` it is x + Dropout(Sublayer(LayerNorm(x))) (pre-norm). The FFN is
    max(0, x W_1 + b_1) W_2 + b_2 (eq. 2).
    """

    def __init__(self, config: Seq2SeqTransformerConfig, layer_idx: int, is_decoder: bool):
        super().__init__()
        self.is_decoder = is_decoder
        self.normalize_before = config.normalize_before
        num_heads = config.decoder_attention_heads if is_decoder else config.encoder_attention_heads
        ffn_dim = config.decoder_ffn_dim if is_decoder else config.encoder_ffn_dim
        self.self_attn = Seq2SeqTransformerAttention(
            config,
            num_heads,
            layer_idx,
            is_causal=is_decoder,
            sparse_pattern=None if is_decoder else pattern_from_config(config),
        )
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        if is_decoder:
            self.encoder_attn = Seq2SeqTransformerAttention(config, num_heads, layer_idx, is_causal=False)
            self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        # Plain floats applied through `_dropout`, which returns its input untouched in eval mode or when p = 0:
        # a decoding step then makes no dropout calls at all (generation speed is dominated by per-call overhead).
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout

    def _dropout(self, hidden_states: torch.Tensor, p: float) -> torch.Tensor:
        if p == 0.0 or not self.training:
            return hidden_states
        return nn.functional.dropout(hidden_states, p=p, training=True)

    def feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """max(0, x W_1 + b_1) W_2 + b_2 (eq. 2; the activation is the config's), with the layer's dropouts."""
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = self.fc2(self._dropout(hidden_states, self.activation_dropout))
        return self._dropout(hidden_states, self.dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        # hidden_states and encoder_hidden_states are positional: activation checkpointing needs that.
        if not use_cache:
            cache = None

        weights = {"self": None, "cross": None}

        def self_attention(states: torch.Tensor) -> torch.Tensor:
            states, weights["self"] = self.self_attn(
                states, attention_mask=attention_mask, cache=cache, output_attentions=output_attentions
            )
            return self._dropout(states, self.dropout)

        def cross_attention(states: torch.Tensor) -> torch.Tensor:
            states, weights["cross"] = self.encoder_attn(
                states,
                key_value_states=encoder_hidden_states,
                attention_mask=encoder_attention_mask,
                cache=cache,
                output_attentions=output_attentions,
            )
            return self._dropout(states, self.dropout)

        norm_first = self.normalize_before
        hidden_states = residual_sublayer(hidden_states, self_attention, self.self_attn_layer_norm, norm_first)
        if self.is_decoder:
            hidden_states = residual_sublayer(hidden_states, cross_attention, self.encoder_attn_layer_norm, norm_first)
        hidden_states = residual_sublayer(hidden_states, self.feed_forward, self.final_layer_norm, norm_first)
        self_attn_weights, cross_attn_weights = weights["self"], weights["cross"]
        return hidden_states, self_attn_weights, cross_attn_weights


def position_table(config: Seq2SeqTransformerConfig) -> torch.Tensor:
    """The (max_position_embeddings, d_model) sinusoidal positions (sec. 3.5) in `config.sinusoid_layout`."""
    table = sinusoidal_position_table(config.max_position_embeddings, config.d_model)
    if config.sinusoid_layout == "halves":
        # Marian: the sines of all frequencies, then their cosines (the paper's values in another order).
        table = torch.cat((table[:, 0::2], table[:, 1::2]), dim=1)  # (T, D)
    return table


class Seq2SeqTransformerStack(nn.Module):
    """The encoder (`is_decoder=False`) or the decoder (`is_decoder=True`): token embeddings times sqrt(d_model)
    plus sinusoidal positions, dropout (sec. 3.4, 3.5, 5.4), then N layers; pre-norm adds a final LayerNorm."""

    def __init__(self, config: Seq2SeqTransformerConfig, is_decoder: bool):
        super().__init__()
        self.config = config
        self.is_decoder = is_decoder
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.max_positions = config.max_position_embeddings
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        # Not a parameter and not saved: rebuilt by `_init_weights`, also after loading on the meta device.
        self.register_buffer("embed_positions", position_table(config), persistent=False)
        num_layers = config.decoder_layers if is_decoder else config.encoder_layers
        self.layers = nn.ModuleList(
            [Seq2SeqTransformerLayer(config, layer_idx=i, is_decoder=is_decoder) for i in range(num_layers)]
        )
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.dropout = nn.Dropout(config.dropout)
        # A sparse encoder's kernels take the source padding as a 2-D key mask, not a 4-D dense mask.
        self.sparse_encoder = not is_decoder and pattern_from_config(config) is not None

    @property
    def input_names(self) -> tuple[str, str, str]:
        """The model-level names of this stack's token ids, embeddings and padding mask (used in error messages)."""
        if self.is_decoder:
            return "decoder_input_ids", "decoder_inputs_embeds", "decoder_attention_mask"
        return "input_ids", "inputs_embeds", "attention_mask"

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def embed(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int | torch.Tensor = 0
    ):
        """Scaled token embeddings + positions past_length .. past_length+T-1, then dropout. Returns (B, T, D).

        `past_length` is a 0-d tensor with a static cache (its token count): the positions are then gathered, and the
        length check, which reads the count, is skipped under torch.compile (a data-dependent branch)."""
        ids_name, embeds_name = self.input_names[:2]
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"Pass exactly one of `{ids_name}` and `{embeds_name}`.")
        if input_ids is not None:
            check_token_ids(ids_name, input_ids, self.embed_tokens.num_embeddings)
            inputs_embeds = self.embed_tokens(input_ids)
        elif inputs_embeds.dim() != 3:
            raise ValueError(
                f"`{embeds_name}` must have shape (batch, seq_len, d_model), got {tuple(inputs_embeds.shape)}."
            )
        else:
            check_not_empty(embeds_name, tuple(inputs_embeds.shape))
        batch_size, seq_len = inputs_embeds.shape[:2]
        what = "target" if self.is_decoder else "source"
        if not (torch.is_tensor(past_length) and tracing()) and past_length + seq_len > self.max_positions:
            raise ValueError(
                f"The {what} sequence has {int(past_length) + seq_len} positions but max_position_embeddings is "
                f"{self.max_positions}; shorten or split the input (no silent truncation)."
            )
        if torch.is_tensor(past_length):
            index = past_length + torch.arange(seq_len, device=past_length.device)
            positions = self.embed_positions.index_select(0, index.to(self.embed_positions.device))  # (T, D)
        else:
            positions = self.embed_positions[past_length : past_length + seq_len]  # (T, D)
        positions = positions.to(inputs_embeds.dtype)
        return self.dropout(inputs_embeds * self.embed_scale + positions)

    def _check_masks(self, attention_mask, encoder_hidden_states, encoder_attention_mask, given, past: int) -> None:
        """Each padding mask must cover the tokens it masks: the source mask the source (2-D, it also masks the
        cross-attention's keys); the target mask the cached plus the new target tokens (2-D, or a 4-D mask).
        `given`: the name of the input passed (ids or embeddings) and its (batch, seq_len)."""
        mask_name = self.input_names[2]
        if attention_mask is not None:
            name, (batch_size, seq_len) = given
            what = f"`{name}` of shape {(batch_size, seq_len)}"
            if self.is_decoder and not (torch.is_tensor(past) and tracing()):  # a static cache's count: a tensor
                past = int(past) if torch.is_tensor(past) else past  # int() would freeze an exported length
                what += f" after {past} cached tokens" if past else ""
                check_mask_shape(mask_name, attention_mask, batch_size, past + seq_len, what, query_length=seq_len)
            elif not self.is_decoder:
                check_mask_shape(mask_name, attention_mask, batch_size, seq_len, what)
        if self.is_decoder and encoder_attention_mask is not None:
            source_shape = tuple(encoder_hidden_states.shape[:2])
            what = f"the encoder output (batch, source length) = {source_shape}"
            check_mask_shape("attention_mask", encoder_attention_mask, *source_shape, what)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions | BaseModelOutput | tuple:
        refuse_position_ids(kwargs)
        cache = resolve_cache(cache, past_key_values)
        output_attentions = config_flag(output_attentions, self.config, "output_attentions")
        output_hidden_states = config_flag(output_hidden_states, self.config, "output_hidden_states")
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)
        use_cache = self.is_decoder and config_flag(use_cache, self.config, "use_cache")
        if self.is_decoder and encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` (the encoder output) to attend to.")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        if cache is not None and not isinstance(cache, EncoderDecoderCache):
            raise TypeError(
                f"The decoder's `cache` must be an EncoderDecoderCache(DynamicCache(), DynamicCache()), got "
                f"{type(cache).__name__}."
            )
        if not use_cache:
            cache = None
        past_length = cache.get_seq_length() if cache is not None else 0
        hidden_states = self.embed(input_ids, inputs_embeds, past_length)  # (B, T, D)
        batch_size, seq_len = hidden_states.shape[:2]
        given = self.input_names[0 if input_ids is not None else 1], (batch_size, seq_len)
        self._check_masks(attention_mask, encoder_hidden_states, encoder_attention_mask, given, past_length)

        # The dense attentions' masks, built for the kernel they run; the eager kernel (attention probabilities)
        # needs every mask materialised.
        skip = not output_attentions
        kernel = select_attention_kernel(self.config._attn_implementation, None, hidden_states.device.type, not skip)
        mask_config = self.config if kernel == self.config._attn_implementation else _MaskConfig(self.config, kernel)
        # What every dense mask is built from: the kernel's config and the queries' hidden states.
        queries = dict(config=mask_config, inputs_embeds=hidden_states)
        if self.is_decoder:
            # No target padding mask (the usual case): the causal mask alone, which sdpa applies without a tensor.
            self_cache = mask_cache_argument(cache.self_attention_cache if cache is not None else None)
            self_mask = create_causal_mask(
                **queries, attention_mask=attention_mask, **self_cache, allow_is_causal_skip=skip
            )
            cross_mask = create_bidirectional_mask(
                **queries, attention_mask=encoder_attention_mask, encoder_hidden_states=encoder_hidden_states,
                allow_is_bidirectional_skip=skip,
            )  # fmt: skip
        elif self.sparse_encoder:
            self_mask = _sparse_key_mask(attention_mask, batch_size, seq_len)  # (B, T) bool or None
            cross_mask = None
        else:
            self_mask = create_bidirectional_mask(
                **queries, attention_mask=attention_mask, allow_is_bidirectional_skip=skip
            )
            cross_mask = None

        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_self_attentions = () if output_attentions else None
        all_cross_attentions = () if output_attentions and self.is_decoder else None
        for layer in self.layers:
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                encoder_hidden_states,
                attention_mask=self_mask,
                encoder_attention_mask=cross_mask,
                cache=cache,
                use_cache=use_cache,
                output_attentions=output_attentions,
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_self_attentions += (self_weights,)
                if self.is_decoder:
                    all_cross_attentions += (cross_weights,)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
            if output_hidden_states:
                all_hidden_states = all_hidden_states[:-1] + (hidden_states,)

        if self.is_decoder:
            output = BaseModelOutputWithPastAndCrossAttentions(
                last_hidden_state=hidden_states,
                **cache_field(cache),
                hidden_states=all_hidden_states,
                attentions=all_self_attentions,
                cross_attentions=all_cross_attentions,
            )
        else:
            output = BaseModelOutput(
                last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_self_attentions
            )
        return output if return_dict else output.to_tuple()


class Seq2SeqTransformerPreTrainedModel(HubMixin, PreTrainedModel):
    """The base of the encoder-decoder models: their config class, weight initialisation and supported kernels.

    Args:
        config: the model's `Seq2SeqTransformerConfig`.
    """

    config_class = Seq2SeqTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["Seq2SeqTransformerLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = True
    # The whole forward traces as one graph (tests/test_common.py), and a decoding step on a static cache compiles
    # with fullgraph=True: transformers' compiled `generate` path and its tests take this flag.
    _can_compile_fullgraph = True

    # Written into every saved config (see HubMixin): each Auto class opens a checkpoint with trust_remote_code.
    remote_code_auto_map = Seq2SeqTransformerConfig.remote_code_classes

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, Seq2SeqTransformerStack):
            init.copy_(module.embed_positions, position_table(self.config).to(module.embed_positions.device))
        elif isinstance(module, Seq2SeqTransformerForConditionalGeneration) and module.final_logits_bias is not None:
            init.zeros_(module.final_logits_bias)

    def mark_tied_weights_as_initialized(self, loading_info) -> None:
        """transformers' marking of the tied targets as loaded, which keeps a missing shared embedding missing.

        The stacks' embeddings are the shared module itself, not copies tied to its weight, so marking the targets
        `encoder.embed_tokens.weight` / `decoder.embed_tokens.weight` marks `shared.weight` too, and transformers then
        drops it from the missing keys of a checkpoint without it: it stayed on the meta device. A source missing from
        the checkpoint stays missing, to be moved off the meta device and initialised.

        Args:
            loading_info: transformers' record of the keys loaded (its `missing_keys` is updated in place).
        """
        missing = set(loading_info.missing_keys)
        super().mark_tied_weights_as_initialized(loading_info)
        for target, source in getattr(self, "all_tied_weights_keys", {}).items():
            if source in missing and self.get_parameter(source) is self.get_parameter(target):
                self.get_parameter(source)._is_hf_initialized = False
                loading_info.missing_keys.add(source)

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """transformers' resizing (the source embedding and the output projection, tied or not), completed.

        One vocabulary serves both stacks, so a decoder embedding of its own (untied, or
        `share_encoder_decoder_embeddings=False`) and `final_logits_bias` get the new size too. The decoder
        embedding's new rows start at the mean of its old rows (`mean_resizing`) or at the init distribution; new
        bias entries at 0.

        Args:
            new_num_tokens: the new vocabulary size; None: only return the embedding.
            pad_to_multiple_of: round the size up to a multiple of this.
            mean_resizing: start new rows at the mean (and covariance) of the old ones, as transformers does.

        Returns:
            The (resized) source embedding.
        """
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        vocab_size = embeddings.num_embeddings
        decoder = self.base_model.decoder
        if decoder.embed_tokens.num_embeddings != vocab_size:
            decoder.embed_tokens = _resized_embedding(
                decoder.embed_tokens, vocab_size, self.config.init_std, mean_resizing
            )
            self.tie_weights()  # the output projection tied to the decoder embedding follows it
        bias = getattr(self, "final_logits_bias", None)
        if bias is not None and bias.shape[-1] != vocab_size:
            keep = min(vocab_size, bias.shape[-1])
            resized = bias.new_zeros(1, vocab_size)  # (1, V)
            resized[:, :keep] = bias[:, :keep]
            self.final_logits_bias = resized
        return embeddings


def _resized_embedding(old: nn.Embedding, num_embeddings: int, std: float, mean_resizing: bool) -> nn.Embedding:
    """`old` with `num_embeddings` rows: its first rows kept, new rows at the mean of its rows or drawn from
    N(0, std)."""
    weight = old.weight
    new = nn.Embedding(
        num_embeddings, old.embedding_dim, padding_idx=old.padding_idx, device=weight.device, dtype=weight.dtype
    )
    keep = min(num_embeddings, old.num_embeddings)
    with torch.no_grad():
        new.weight.normal_(0.0, std)
        if mean_resizing:
            new.weight[keep:] = weight.mean(dim=0)
        new.weight[:keep] = weight[:keep]
    return new


class Seq2SeqTransformerModel(Seq2SeqTransformerPreTrainedModel):
    """The bare encoder-decoder: returns the decoder's last hidden states (before the output projection).

    Args:
        config: the model's `Seq2SeqTransformerConfig`.
    """

    def __init__(self, config: Seq2SeqTransformerConfig):
        super().__init__(config)
        # Sec. 3.4: one matrix for both embeddings (and the output projection, in the LM head model). Untied, or
        # with `share_encoder_decoder_embeddings=False` (Marian), each stack keeps its own embedding and there is no
        # `shared` module left unused.
        self.shared = None
        self._keys_to_ignore_on_save = None
        self._tied_weights_keys = None
        if config.tie_word_embeddings and config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
            # The stacks' names of the shared module: only `shared.weight` is written, as before.
            self._keys_to_ignore_on_save = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
            # {target: source}, as transformers' BART and Marian base models declare them: save, load,
            # `resize_token_embeddings` and `tie_weights` of the base model keep the three names one tensor.
            self._tied_weights_keys = {
                "encoder.embed_tokens.weight": "shared.weight",
                "decoder.embed_tokens.weight": "shared.weight",
            }
        self.encoder = Seq2SeqTransformerStack(config, is_decoder=False)
        self.decoder = Seq2SeqTransformerStack(config, is_decoder=True)
        if self.shared is not None:
            # One module, not three that share a weight: what `get_input_embeddings()` returns is what both stacks
            # run, so a hook on it (NEFTune, `enable_input_require_grads`, attribution tools) sees every forward.
            self.encoder.embed_tokens = self.shared
            self.decoder.embed_tokens = self.shared
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        """The source embedding: the shared matrix when the embeddings are tied.

        Returns:
            The embedding module.
        """
        return self.shared if self.shared is not None else self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Replace the source embedding (and the decoder's, when they share one matrix).

        Args:
            value: the new embedding.
        """
        if self.shared is not None:
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    def get_encoder(self, modality: str | None = None) -> Seq2SeqTransformerStack:
        """The encoder stack.

        Args:
            modality: ignored (transformers' signature; the model reads text only).

        Returns:
            The encoder.
        """
        return self.encoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput | tuple:
        r"""cache: the decoder's keys and values of earlier target tokens and the cross-attention's (an
        `EncoderDecoderCache`; `past_key_values`, its name before transformers 5.24, works too)."""
        refuse_position_ids(kwargs)
        cache = resolve_cache(cache, past_key_values)
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)
        if encoder_outputs is None:
            if input_ids is None and inputs_embeds is None:
                raise ValueError("Pass `input_ids` (the source tokens), `inputs_embeds` or `encoder_outputs`.")
            encoder_outputs = self.encoder(
                input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                return_dict=True,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError(
                "Pass `decoder_input_ids` (the targets shifted right) or, to the ...ForConditionalGeneration model, "
                "`labels` from which they are built."
            )

        decoder_outputs = self.decoder(
            decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        output = Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **cache_field(output_cache(decoder_outputs)),
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


class Seq2SeqTransformerForConditionalGeneration(
    GenerationWithCompiledDecoding, Seq2SeqTransformerPreTrainedModel, GenerationMixin
):
    """The Transformer for translation.

    The decoder output times the shared embedding matrix gives the pre-softmax logits (sec. 3.4); with `labels`, the
    label-smoothed cross-entropy (sec. 5.4).

    `generate(..., cache_implementation="static")` runs each decoding step after the first as one compiled graph,
    on CPU too and for greedy, sampling and beam search, with the tokens of eager decoding; the encoder output and
    the cross-attention keys/values are computed once, by the first (eager) step. The first call per shape pays
    the compilation. A new graph is traced when the batch size x beams, the source length, the static cache's length
    (the largest `max_length` so far, or `max_cache_len`), the dtype, the device or the output flags change;
    `disable_compile=True` decodes the static cache eagerly. See `compiled_decoding.py`.

    Args:
        config: the model's `Seq2SeqTransformerConfig`; the generation config is `paper_generation_config(config)`.
    """

    # The encoder's and decoder's embedding are the shared module itself (`Seq2SeqTransformerModel`); the output
    # projection is a weight tied to it.
    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: Seq2SeqTransformerConfig):
        super().__init__(config)
        self.model = Seq2SeqTransformerModel(config)
        if not config.share_encoder_decoder_embeddings:  # Marian's untied source embedding
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        # Marian's output bias: a buffer, saved with the weights but not trained; None (and not saved) otherwise.
        bias = torch.zeros(1, config.vocab_size) if config.add_final_logits_bias else None  # (1, V)
        self.register_buffer("final_logits_bias", bias)
        self.post_init()
        self.generation_config = self.paper_generation_config(config)

    @staticmethod
    def paper_generation_config(config: Seq2SeqTransformerConfig, **overrides) -> GenerationConfig:
        """Beam search with the paper's beam size 4 and length penalty 0.6 (sec. 6.1).

        The paper's maximum output length is the input length + 50, which one config cannot express: pass
        `max_new_tokens=input_ids.shape[1] + 50` to `generate` (otherwise transformers' default `max_length` of 20
        tokens applies).

        Args:
            config: the model's config (its special token ids).
            **overrides: generation settings that replace the paper's.

        Returns:
            The `GenerationConfig`.
        """
        settings = dict(
            PAPER_GENERATION_SETTINGS,
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
            decoder_start_token_id=config.decoder_start_token_id,
        )
        settings.update(overrides)
        return GenerationConfig(**settings)

    def get_encoder(self, modality: str | None = None) -> Seq2SeqTransformerStack:
        """The encoder stack.

        Args:
            modality: ignored (transformers' signature; the model reads text only).

        Returns:
            The encoder.
        """
        return self.model.encoder

    def get_decoder(self) -> Seq2SeqTransformerStack:
        """The decoder stack.

        Returns:
            The decoder.
        """
        return self.model.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        """The source embedding (`Seq2SeqTransformerModel.get_input_embeddings`).

        Returns:
            The embedding module.
        """
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Replace the source embedding (`Seq2SeqTransformerModel.set_input_embeddings`).

        Args:
            value: the new embedding.
        """
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        """The output projection to the vocabulary (`lm_head`).

        Returns:
            The projection.
        """
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        """Replace the output projection (`lm_head`).

        Args:
            value: the new projection.
        """
        self.lm_head = value

    @staticmethod
    def _reorder_cache(cache, beam_idx: torch.LongTensor):
        """Beam search's per-step cache reordering (called by `GenerationMixin`): only the decoder self-attention
        cache is gathered. `beam_idx` only moves beams within one source sentence, and every beam of a sentence holds
        the same cross-attention keys and values (one encoder output, expanded), so gathering those would copy
        (batch x beams x source length x d_model x 2) values per layer and step for an identical result."""
        if isinstance(cache, EncoderDecoderCache):
            reorder_cache_in_place(cache.self_attention_cache, beam_idx)
        else:
            reorder_cache_in_place(cache, beam_idx)
        return cache

    def create_masks_for_generate(self, attention_mask=None, **kwargs):
        """The decoder's mask that `generate` asks for ahead of each step when the cache is static.

        Without a target padding mask (the usual case) there is none to prepare: the decoder builds its causal mask
        inside the (compiled) step; a given one becomes transformers' 4-D mask.

        Args:
            attention_mask: the target padding mask, or None.
            **kwargs: transformers' `create_masks_for_generate` arguments.

        Returns:
            None without a mask, else transformers' 4-D mask.
        """
        if attention_mask is None:
            return None
        return create_masks_for_generate(attention_mask=attention_mask, **kwargs)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """The decoder's input for `labels`: shifted right by the decoder start token (-100 becomes the pad token).

        Args:
            labels: (B, T) target token ids.

        Returns:
            (B, T) decoder input ids.

        Raises:
            ValueError: the config has no `decoder_start_token_id` or no `pad_token_id`.
        """
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    # The arguments of `Seq2SeqTransformerModel.forward` plus `labels`, spelled out: Trainer and `generate` read the
    # signature (tests/models/test_copies.py keeps the two in sync).
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput | tuple:
        r"""labels: (B, T) target token ids, -100 where no loss is wanted (padding). When given and
        `decoder_input_ids` is not, the decoder inputs are the labels shifted right.
        num_items_in_batch (keyword, passed by Trainer): the number of non-ignored target tokens in the whole
        accumulated batch; the loss is then the sum over this batch divided by it."""
        refuse_position_ids(kwargs)
        cache = resolve_cache(cache, past_key_values)
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)
        if labels is not None:
            # Before the shift: an out-of-range label would otherwise be reported as a bad `decoder_input_ids`.
            check_token_ids("labels", labels, self.config.vocab_size, ignore_index=IGNORE_INDEX)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)

        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, V)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias
        loss = None
        if labels is not None:
            loss = self.compute_loss(logits, labels, num_items_in_batch=kwargs.get("num_items_in_batch"))
        output = Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **cache_field(output_cache(outputs)),
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )
        return output if return_dict else output.to_tuple()

    def compute_loss(
        self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Cross-entropy with label smoothing `config.label_smoothing` (sec. 5.4), ignoring labels equal to -100.

        Args:
            logits: (B, T, V).
            labels: (B, T) target token ids, -100 where no loss is wanted.
            num_items_in_batch: None: the mean over the non-ignored tokens. Given (Trainer under gradient
                accumulation): the sum over this batch divided by it, so that the accumulated gradient is that of the
                mean over all the tokens of the accumulated batch.

        Returns:
            The scalar loss.
        """
        if labels.shape != logits.shape[:2]:
            raise ValueError(f"`labels` has shape {tuple(labels.shape)}, expected {tuple(logits.shape[:2])}.")
        return token_cross_entropy(logits, labels, num_items_in_batch, self.config.label_smoothing)


def _sparse_key_mask(attention_mask: torch.Tensor | None, batch_size: int, seq_len: int) -> torch.Tensor | None:
    """The source padding mask as the sparse kernels take it: (B, T) bool, True = real token; None without padding."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch_size, seq_len):
        raise ValueError(
            f"A sparse encoder takes a 2-D source `attention_mask` of shape (batch, seq_len)=({batch_size}, "
            f"{seq_len}) (1 = real token, 0 = padding), got shape {tuple(attention_mask.shape)}."
        )
    return sparse_padding_mask(batch_size, seq_len, seq_len, attention_mask=attention_mask)


__all__ = [
    "PAPER_GENERATION_SETTINGS",
    "Seq2SeqTransformerForConditionalGeneration",
    "Seq2SeqTransformerModel",
    "Seq2SeqTransformerPreTrainedModel",
    "shift_tokens_right",
]
