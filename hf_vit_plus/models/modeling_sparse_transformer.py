"""The Sparse Transformer (Child, Gray, Radford, Sutskever 2019, "Generating Long Sequences with Sparse
Transformers", arXiv 1904.10509) as a decoder-only causal language model.

Read top to bottom: token + learned (optionally factorised, sec. 5.3) position embeddings -> N pre-norm residual
blocks H_k = H_{k-1} + resblock(H_{k-1}) (sec. 5.2) -> final LayerNorm -> output projection. Each block's attention
follows the factorised pattern of `config.attention_type` (sec. 4.2-4.3) combined over the network as
`config.sparse_pattern_mode` says (sec. 5.1).

Which kernel computes a sparse attention (the pattern itself lives in `sparse_layouts.py`):
- every uncached sequence without left padding (the training case; right padding is passed on as a 2-D mask): the
  kernel of `attention.select_attention_kernel`: the sparse kernel that `config._attn_implementation` names
  ("sparse_dense", "sparse_block", "sparse_flex"), else the fast one for the device ("sparse_block" on CPU,
  "sparse_flex" on CUDA), both with forward and backward;
- always, whatever the setting: a left-padded batch or a forward on top of a cache (prefill after a cache,
  chunked prefill) uses the masked dense reference with a mask built from the positions (left padding shifts the
  positions, and the fixed pattern depends on absolute positions); a single new token on top of a cache (the
  decoding step of `generate()`) gathers only the cached keys the pattern allows for its position and attends
  to those (sec. 4.2: l + i/l keys for strided, the own block plus the summaries for fixed);
- a step on a filled static cache (`generate(cache_implementation="static")`, decoded by one compiled graph, see
  `compiled_decoding.py`): the masked dense reference over every slot of the cache, with a mask built from tensors
  only (the gather above needs the positions as Python numbers, which a compiled graph cannot read).
`output_attentions=True` always uses the masked reference, the one kernel that returns the probabilities.

Padding-free packing, read as transformers' own decoders read it: `position_ids` that restart inside a row, with no
`attention_mask` and no cache (what `DataCollatorWithFlattening` gives), mark several sequences packed one after the
other (a new sequence wherever a position is not the previous one plus one). Each attends only to itself, and a
sparse pattern is laid on its own positions, so every sequence gets the outputs it would get alone. Dense attention
keeps the requested kernel (with that mask); a sparse pattern on packed rows runs the masked dense reference, as for
left padding (the block kernels lay the pattern on the row's absolute positions).

A custom 4-D `attention_mask` (batch or 1, 1, queries, keys; boolean, True = attend, or additive float, 0 = attend,
as transformers' decoders take it, e.g. several continuations sharing a prefix) replaces the causal mask: queries see
the keys it allows (and, with a sparse pattern, those the pattern allows on `position_ids`), through the masked
reference or, for dense attention, the requested kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention import eager_attention_forward, select_attention_kernel
from .compat import cache_field, output_cache, resolve_cache
from .compiled_decoding import GenerationWithCompiledDecoding, is_static_cache, reorder_cache_in_place
from .configuration_sparse_transformer import PIXEL_LEVELS, SparseTransformerConfig
from .hub_mixin import HubMixin
from .input_checks import (
    IGNORE_INDEX,
    check_mask_shape,
    check_not_empty,
    check_position_ids,
    check_token_ids,
    check_token_range,
    tracing,
)
from .layers import FeedForward, config_flag, split_heads, token_cross_entropy
from .sparse_layouts import SparsePattern, pattern_from_config


def packed_sequence_ids(position_ids: torch.Tensor) -> torch.Tensor | None:
    """(B, T) index of the packed sequence each token belongs to, read from `position_ids` (B, T) as transformers'
    decoders read them: a new sequence starts wherever a position is not the previous one plus one (e.g. [0, 1, 2, 0,
    1] -> [0, 0, 0, 1, 1]). None when every row holds one sequence; traced code always gets the tensor (reading it
    would break the graph), which is exact either way."""
    first = position_ids[:, :1] - 1  # so that the first token does not start a new sequence
    sequence_ids = (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
    if tracing() or bool(sequence_ids[:, -1].any()):
        return sequence_ids
    return None


def _heads_differ(pattern: SparsePattern, head_parts: list[int | None]) -> bool:
    """Whether the heads of a layer see different keys (one mask row per head, else one for all)."""
    return len(set(head_parts)) > 1 or pattern.head_dependent


@dataclass
class _AttentionContext:
    """Everything the attention layers need about the positions of one forward pass (built once per forward).

    query_positions: (B, Tq) logical positions of the new tokens; key_positions: (B, Tk) of all keys (cache + new);
    key_valid: (B, Tk) bool, False on padding, or None when there is none; past_length: tokens already cached;
    key_order: (B, Tk) physical index of each logical position (left padding moves them), for the decoding step.
    static: the keys are all the slots of a static cache (Tk = its length), those not written yet invalid, and
    past_length is the cache's 0-d count tensor: no Python branch may read it (torch.compile traces this case).
    """

    query_positions: torch.Tensor
    key_positions: torch.Tensor
    key_valid: torch.Tensor | None
    past_length: int | torch.Tensor
    key_order: torch.Tensor
    masks: dict
    static: bool = False
    # (B, T) index of the packed sequence each token belongs to (padding-free packing, see the module docstring), or
    # None for one sequence per row; positions then restart at each sequence
    sequence_ids: torch.Tensor | None = None
    # (B or 1, 1, Tq, Tk) bool, True = attend: a custom 4-D mask that replaces the causal one, or None
    custom_mask: torch.Tensor | None = None

    @property
    def kv_length(self) -> int:
        return self.key_positions.shape[1]

    @property
    def is_full_sequence(self) -> bool:
        """No cache before, no padding, one sequence per row: kernels may assume positions 0..T-1 in natural
        order."""
        return (
            not self.static and self.past_length == 0 and self.key_valid is None and self.sequence_ids is None
            and self.custom_mask is None
        )  # fmt: skip

    @property
    def in_natural_order(self) -> bool:
        """No cache before and every real token at its own index (no padding, or padding on the right only): the
        sparse kernels, which use absolute positions plus a 2-D padding mask, are exact."""
        if self.static or self.past_length != 0 or self.sequence_ids is not None or self.custom_mask is not None:
            return False
        if self.key_valid is None:
            return True
        if torch.compiler.is_compiling():  # reading the mask's values would break the graph: take the masked path
            return False
        natural = torch.arange(self.kv_length, device=self.key_positions.device)
        return bool(((self.key_positions == natural) | ~self.key_valid).all())

    def dense_mask(self, explicit: bool = False) -> torch.Tensor | None:
        """Causal mask (B, 1, Tq, Tk) with padding, or None when plain causal attention is exact and the kernel
        applies it itself (`explicit` False: sdpa reads the module's `is_causal`; the eager reference does not)."""
        if self.is_full_sequence and not explicit:
            return None
        if self.custom_mask is not None:
            return self.custom_mask
        if "dense" not in self.masks:
            self.masks["dense"] = self._finish(
                self.key_positions[:, None, None, :] <= self.query_positions[:, None, :, None]
            )
        return self.masks["dense"]

    def sparse_mask(self, pattern: SparsePattern, head_parts: list[int | None]) -> torch.Tensor:
        """The pattern as a boolean mask (B, H or 1, Tq, Tk) on logical positions, padding included."""
        heads_differ = _heads_differ(pattern, head_parts)
        key = tuple(head_parts) if heads_differ else head_parts[0]
        if key not in self.masks:
            q = self.query_positions[:, :, None]  # (B, Tq, 1)
            k = self.key_positions[:, None, :]  # (B, 1, Tk)
            self.masks[key] = self._finish(pattern.heads_mask(head_parts, q, k))  # (B, H or 1, Tq, Tk)
        return self.masks[key]

    def _finish(self, mask: torch.Tensor) -> torch.Tensor:
        if self.custom_mask is not None:  # the caller's mask decides, self-attention included
            return mask & self.custom_mask
        if self.key_valid is not None:
            mask = mask & self.key_valid[:, None, None, :]
        if self.sequence_ids is not None:  # packed sequences see only themselves
            mask = mask & (self.sequence_ids[:, None, :, None] == self.sequence_ids[:, None, None, :])
        # Every query sees itself, so that padding queries get a finite (ignored) output instead of NaN.
        q_len = self.query_positions.shape[1]
        diagonal = torch.zeros(q_len, self.kv_length, dtype=torch.bool, device=mask.device)
        rows = torch.arange(q_len, device=mask.device)
        diagonal[rows, self.past_length + rows] = True
        return mask | diagonal


class SparseTransformerEmbeddings(nn.Module):
    """Token embeddings plus learned positions: one table, or one table per axis of `factorized_shape` summed
    (sec. 5.3: row, column and channel embeddings for images)."""

    def __init__(self, config: SparseTransformerConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=None)
        self.position_embedding_type = config.position_embedding_type
        if config.position_embedding_type == "factorized":
            self.factorized_shape = tuple(config.factorized_shape)
            self.position_embeddings = nn.ModuleList(
                nn.Embedding(size, config.hidden_size) for size in self.factorized_shape
            )
        else:
            self.factorized_shape = None
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)

    def embed_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        if self.factorized_shape is None:
            return self.position_embeddings(position_ids)
        # Mixed-radix coordinates of p in the shape (outermost first), e.g. (row, column, channel).
        embeddings = 0
        remainder = position_ids
        for size, table in zip(reversed(self.factorized_shape), reversed(self.position_embeddings)):
            embeddings = embeddings + table(remainder % size)
            remainder = torch.div(remainder, size, rounding_mode="floor")
        return embeddings

    def forward(self, input_ids: torch.Tensor | None, position_ids: torch.Tensor, inputs_embeds=None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        return inputs_embeds + self.embed_positions(position_ids)  # (B, T, D)


class SparseTransformerAttention(nn.Module):
    """Multi-head causal self-attention restricted to the factorised pattern of its layer (sec. 4.2-4.3).

    The pattern travels to the kernels as the attributes `sparse_pattern` (a `SparsePattern`, None for dense
    attention; its `mode` says how the layers use its parts) and `layer_idx`; `head_parts[h]` is the part head h
    uses alone (None = merged).
    """

    def __init__(self, config: SparseTransformerConfig, layer_idx: int = 0):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.is_causal = True
        self.sparse_pattern = pattern = pattern_from_config(config)
        self.head_parts = pattern.head_parts(None, layer_idx, self.num_heads) if pattern is not None else None
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: _AttentionContext,
        cache: Cache | None = None,
        output_attentions: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_len, _ = hidden_states.shape
        query = split_heads(self.q_proj(hidden_states), self.num_heads)  # (B, H, Tq, Dh)
        key = split_heads(self.k_proj(hidden_states), self.num_heads)  # (B, H, Tq, Dh)
        value = split_heads(self.v_proj(hidden_states), self.num_heads)  # (B, H, Tq, Dh)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
            if is_static_cache(cache):
                # A static cache returns its whole buffer; the slots after the current token are empty. (Only there:
                # a dynamic cache's length is already Tk, and a slice by a traced length would make it data-dependent
                # under torch.export.)
                key, value = key[:, :, : context.kv_length], value[:, :, : context.kv_length]  # (B, H, Tk, Dh)
        dropout = self.attention_dropout if self.training else 0.0
        implementation = select_attention_kernel(
            self.config._attn_implementation,
            self.sparse_pattern,
            query.device.type,
            output_attentions,
            seq_len,
            head_dim=query.shape[-1],
        )
        attention_fn = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)

        if self.sparse_pattern is None:
            mask = context.dense_mask(explicit=implementation != "sdpa")
            attn_output, attn_weights = attention_fn(
                self, query, key, value, mask, dropout=dropout, scaling=self.scaling, **kwargs
            )
        elif seq_len == 1 and not context.static and context.past_length > 0:
            attn_output, attn_weights = self._decode_step(query, key, value, context, output_attentions)
        elif context.in_natural_order and not output_attentions:
            attn_output, attn_weights = attention_fn(
                self, query, key, value, context.key_valid, dropout=dropout, scaling=self.scaling, **kwargs
            )
        else:
            mask = context.sparse_mask(self.sparse_pattern, self.head_parts)
            attn_output, attn_weights = eager_attention_forward(
                self, query, key, value, mask, dropout=dropout, scaling=self.scaling
            )
        attn_output = attn_output.reshape(batch_size, seq_len, -1).contiguous()  # (B, Tq, H*Dh)
        return self.o_proj(attn_output), attn_weights

    def _decode_step(self, query, key, value, context: _AttentionContext, output_attentions: bool):
        """One new token per row on top of a cache: attend only to the cached keys the pattern allows.

        query: (B, H, 1, Dh); key/value: (B, H, Tk, Dh). The allowed logical positions come from the pattern's
        cache-index helper, mapped to physical cache slots through `context.key_order` (left padding).
        """
        batch_size, num_heads, _, head_dim = query.shape
        heads_differ = _heads_differ(self.sparse_pattern, self.head_parts)
        index_lists = []  # [B][H] LongTensors of logical key positions
        for position in context.query_positions[:, 0].tolist():
            per_head = [
                self.sparse_pattern.key_indices(position, head=head, part_index=self.head_parts[head])
                for head in range(num_heads if heads_differ else 1)
            ]
            index_lists.append(per_head if heads_differ else per_head * num_heads)
        width = max(len(indices) for row in index_lists for indices in row)
        logical = torch.zeros(batch_size, num_heads, width, dtype=torch.long, device=query.device)
        valid = torch.zeros(batch_size, num_heads, width, dtype=torch.bool, device=query.device)
        for b, row in enumerate(index_lists):
            for h, indices in enumerate(row):
                logical[b, h, : len(indices)] = indices.to(query.device)
                valid[b, h, : len(indices)] = True
        slots = torch.gather(context.key_order[:, None, :].expand(-1, num_heads, -1), 2, logical)  # (B, H, K)
        gather_index = slots[..., None].expand(-1, -1, -1, head_dim)  # (B, H, K, Dh)
        key_sel = torch.gather(key, 2, gather_index)  # (B, H, K, Dh)
        value_sel = torch.gather(value, 2, gather_index)
        attn_output, weights = eager_attention_forward(
            self, query, key_sel, value_sel, valid[:, :, None, :], scaling=self.scaling
        )
        if not output_attentions:
            return attn_output, None
        full = torch.zeros(batch_size, num_heads, 1, key.shape[2], dtype=weights.dtype, device=weights.device)
        full.scatter_add_(3, slots[:, :, None, :], weights * valid[:, :, None, :])
        return attn_output, full


class SparseTransformerLayer(GradientCheckpointingLayer):
    """One residual block (sec. 5.2): a = X + dropout(attend(norm(X))), H = a + dropout(ff(norm(a))).

    Dropout sits only at the end of each residual branch. Under activation checkpointing the attention and
    feed-forward activations are recomputed in the backward pass (sec. 5.4).
    """

    def __init__(self, config: SparseTransformerConfig, layer_idx: int = 0):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = SparseTransformerAttention(config, layer_idx=layer_idx)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = FeedForward(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # Sec. 5.2: the branches' output projections start with std / sqrt(2N) (see `_init_weights`).
        self.self_attn.o_proj.residual_branch_output = True
        self.mlp.fc2.residual_branch_output = True

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: _AttentionContext,
        cache: Cache | None = None,
        output_attentions: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        residual = hidden_states
        hidden_states, attn_weights = self.self_attn(
            self.layernorm_before(hidden_states),
            context,
            cache=cache,
            output_attentions=output_attentions,
            **kwargs,
        )
        hidden_states = residual + self.dropout(hidden_states)

        residual = hidden_states
        hidden_states = residual + self.dropout(self.mlp(self.layernorm_after(hidden_states)))
        return hidden_states, attn_weights


class SparseTransformerPreTrainedModel(HubMixin, PreTrainedModel):
    """The base of the Sparse Transformer models: their config class, weight initialisation and supported kernels.

    Args:
        config: the model's `SparseTransformerConfig`.
    """

    config_class = SparseTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["SparseTransformerEmbeddings", "SparseTransformerLayer"]
    _supports_sdpa = True
    _supports_flex_attn = False
    _supports_flash_attn = False
    _supports_attention_backend = True
    # The whole forward traces as one graph (tests/test_common.py), and a decoding step on a static cache compiles
    # with fullgraph=True: transformers' compiled `generate` path and its tests take this flag.
    _can_compile_fullgraph = True

    # Written into every saved config (see HubMixin): each Auto class opens a checkpoint with trust_remote_code.
    remote_code_auto_map = SparseTransformerConfig.remote_code_classes

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            # Sec. 5.2: the output projections of the residual branches (marked `residual_branch_output`) start
            # with std / sqrt(2N), so that the residual stream's variance does not grow with depth.
            if getattr(module, "residual_branch_output", False):
                std = std / (2 * self.config.num_hidden_layers) ** 0.5
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    def create_masks_for_generate(self, attention_mask=None, cache=None, past_key_values=None, **kwargs):
        """The mask `generate` asks for in advance with a static cache: the 2-D padding mask, kept.

        transformers would prepare a 4-D mask (a plain causal one by default, which would drop the sparse pattern); the
        model builds its own masks instead. The mask grows by one column per step; padded with zeros to the cache's
        length it keeps one shape, which the compiled decoding step needs (a new shape would be a new graph).

        Args:
            attention_mask: the 2-D padding mask, or None.
            cache: the decoding cache.
            past_key_values: the cache under transformers' name (either may be given).
            **kwargs: transformers' other arguments, unused.

        Returns:
            The 2-D mask, padded to the static cache's length; other masks and caches pass through unchanged.
        """
        cache = resolve_cache(cache, past_key_values)
        if attention_mask is None or attention_mask.dim() != 2 or not is_static_cache(cache):
            return attention_mask
        missing = cache.get_max_length() - attention_mask.shape[1]
        return nn.functional.pad(attention_mask, (0, missing)) if missing > 0 else attention_mask


class SparseTransformerModel(SparseTransformerPreTrainedModel):
    """The bare decoder: embeddings, N residual blocks and the final LayerNorm; returns the normalised states.

    Args:
        config: the model's `SparseTransformerConfig`.
    """

    def __init__(self, config: SparseTransformerConfig):
        super().__init__(config)
        self.embeddings = SparseTransformerEmbeddings(config)
        self.layers = nn.ModuleList(
            [SparseTransformerLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)]
        )
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding.

        Returns:
            The embedding module.
        """
        return self.embeddings.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        """Replace the token embedding.

        Args:
            value: the new embedding.
        """
        self.embeddings.embed_tokens = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        r"""cache: the keys and values of earlier tokens (a `Cache`; `past_key_values`, its name before transformers
        5.24, works too). Returned, updated, in the output field the installed transformers reads."""
        cache = resolve_cache(cache, past_key_values)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` (batch, seq) and `inputs_embeds` (batch, seq, hidden).")
        if input_ids is not None:
            alongside = {"position_ids": position_ids, "attention_mask": attention_mask}
            check_token_ids("input_ids", input_ids, self.embeddings.embed_tokens.num_embeddings, alongside=alongside)
        elif inputs_embeds.dim() != 3:
            raise ValueError(
                f"`inputs_embeds` must have shape (batch, seq_len, hidden_size), got {tuple(inputs_embeds.shape)}."
            )
        else:
            check_not_empty("inputs_embeds", tuple(inputs_embeds.shape), {"position_ids": position_ids})
        output_attentions = config_flag(output_attentions, self.config, "output_attentions")
        output_hidden_states = config_flag(output_hidden_states, self.config, "output_hidden_states")
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)
        use_cache = config_flag(use_cache, self.config, "use_cache")
        if self.gradient_checkpointing and self.training and use_cache:
            use_cache = False
        kwargs.pop("num_items_in_batch", None)

        batch_size, seq_len = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if not use_cache:
            cache = None
        past_length = cache.get_seq_length() if cache is not None else 0
        # A static cache (compiled decoding) has buffers of a fixed length, which a 2-D mask may span (`generate`
        # pads it so, see `create_masks_for_generate`); once filled it counts its tokens in a 0-d tensor that each
        # layer's update advances in place, and the attention then runs over all its slots (`_static_context`).
        static_length = cache.get_max_length() if is_static_cache(cache) else None
        custom_mask = None
        if torch.is_tensor(attention_mask) and attention_mask.dim() == 4 and static_length is None:
            custom_mask = self._custom_mask(attention_mask, batch_size, seq_len, past_length)
            attention_mask = None
        if attention_mask is not None and not (torch.is_tensor(past_length) and tracing()):
            # During generation the mask covers the cached tokens and the new ones.
            past = int(past_length) if torch.is_tensor(past_length) else past_length  # int() would freeze an export
            known_length = past + seq_len
            if static_length is not None and attention_mask.dim() == 2 and attention_mask.shape[1] == static_length:
                known_length = static_length
            given = "input_ids" if input_ids is not None else "inputs_embeds"
            what = f"`{given}` of shape {(batch_size, seq_len)}"
            what += f" after {past} cached tokens" if past else ""
            check_mask_shape("attention_mask", attention_mask, batch_size, known_length, what)
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if torch.is_tensor(past_length):
            # A copy: the first layer's cache update advances the cache's own count before the masks are built.
            past_length = past_length.clone()
            context = self._static_context(batch_size, seq_len, past_length, attention_mask, static_length, device)
        else:
            if attention_mask is not None and attention_mask.shape[1] > past_length + seq_len:
                attention_mask = attention_mask[:, : past_length + seq_len]  # the first step on a static cache
            context = self._attention_context(
                batch_size, seq_len, past_length, attention_mask, device, positions_given=position_ids is not None
            )
        positions_given = position_ids is not None
        if positions_given:
            check_position_ids(position_ids, batch_size, seq_len)
        if custom_mask is not None:
            positions = context.query_positions
            if positions_given:
                positions = position_ids.to(device).expand(batch_size, -1)
            keys = positions if past_length == 0 else context.key_positions  # dense attention after a cache
            context = replace(context, query_positions=positions, key_positions=keys, custom_mask=custom_mask)
        elif positions_given:
            if attention_mask is None and not torch.is_tensor(past_length) and past_length == 0:
                positions = position_ids.to(device).expand(batch_size, -1)
                sequence_ids = packed_sequence_ids(positions)
                if sequence_ids is not None:  # padding-free packing: each sequence on its own positions, alone
                    context = replace(
                        context, query_positions=positions, key_positions=positions, sequence_ids=sequence_ids
                    )
        else:
            position_ids = context.query_positions
        if not positions_given and context.key_valid is None:
            longest = past_length + seq_len  # positions past_length .. past_length + seq_len - 1, no need to read them
        elif tracing():
            # Reading the largest position is a graph break under torch.compile (an error with fullgraph=True):
            # compiled code goes without this check.
            longest = 0
        else:
            longest = int(position_ids.max()) + 1 if position_ids.numel() else 0
        if longest > self.config.max_position_embeddings:
            raise ValueError(
                f"The sequence has {longest} positions (input of length {seq_len} after {past_length} cached "
                f"tokens), longer than `max_position_embeddings` ({self.config.max_position_embeddings})."
            )

        hidden_states = self.embeddings(input_ids, position_ids, inputs_embeds=inputs_embeds)
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            hidden_states, attn_weights = layer(
                hidden_states,
                context,
                cache=cache,
                output_attentions=output_attentions,
                **kwargs,
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (attn_weights,)
        hidden_states = self.norm(hidden_states)
        if output_hidden_states:
            all_hidden_states = all_hidden_states[:-1] + (hidden_states,)
        if output_attentions and static_length is not None:
            # The first step on a static cache attends to the tokens written so far, the later steps to every slot;
            # transformers' models give every step's probabilities over the whole cache, the empty slots (masked)
            # weighing 0: the same numbers, padded to the cache's length.
            all_attentions = tuple(
                nn.functional.pad(weights, (0, static_length - weights.shape[-1])) for weights in all_attentions
            )

        output = BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            **cache_field(cache if use_cache else None),
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )
        return output if return_dict else output.to_tuple()

    def _custom_mask(self, attention_mask: torch.Tensor, batch_size: int, seq_len: int, past_length) -> torch.Tensor:
        """A custom 4-D mask (B or 1, 1, Tq, Tk) as a boolean mask, True = attend; Tk = cached + new tokens."""
        kv_length = int(past_length) + seq_len
        shape = tuple(attention_mask.shape)
        if shape[0] not in (1, batch_size) or shape[1] != 1 or shape[2] != seq_len or shape[3] < kv_length:
            raise ValueError(
                f"A 4-D `attention_mask` must have shape ({batch_size} or 1, 1, {seq_len}, {kv_length}): one row per "
                f"new token, one column per cached and new token; got {shape}."
            )
        if int(past_length) and self.config.attention_type != "dense":
            raise ValueError(
                "A 4-D `attention_mask` on top of a cache needs dense attention: a sparse pattern reads the positions "
                "of the cached keys, which a custom mask does not give. Pass the whole sequence without a cache."
            )
        mask = attention_mask[..., :kv_length]
        if mask.dtype == torch.bool:
            return mask
        if not mask.is_floating_point():
            raise TypeError(
                "A 4-D `attention_mask` is boolean (True = attend) or additive float (0 = attend, the dtype's minimum "
                f"= masked), as transformers' decoders take it; got dtype {mask.dtype}."
            )
        return mask == 0

    @staticmethod
    def _static_context(
        batch_size: int, seq_len: int, past_length: torch.Tensor, attention_mask: torch.Tensor | None,
        cache_length: int, device,
    ) -> _AttentionContext:  # fmt: skip
        """The keys of a filled static cache: all its `cache_length` slots, valid up to the new tokens and where the
        mask is 1; positions count the valid slots (left padding). No Python branch reads a value (torch.compile
        traces this), so the attention layers take the masked path, which is exact for any padding."""
        slots = torch.arange(cache_length, device=device)
        key_valid = (slots < past_length + seq_len).expand(batch_size, -1)  # (B, L)
        if attention_mask is not None:
            mask = attention_mask.to(device=device, dtype=torch.long)[:, :cache_length]
            if mask.shape[1] < cache_length:  # a mask of the tokens so far (not from `generate`)
                mask = nn.functional.pad(mask, (0, cache_length - mask.shape[1]))
            key_valid = key_valid & mask.bool()
        key_positions = (key_valid.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)
        query_slots = past_length + torch.arange(seq_len, device=device)  # (Tq,)
        return _AttentionContext(
            query_positions=key_positions.index_select(1, query_slots),
            key_positions=key_positions,
            key_valid=key_valid,
            past_length=past_length,
            key_order=slots.expand(batch_size, -1),
            masks={},
            static=True,
        )

    def _attention_context(
        self, batch_size: int, seq_len: int, past_length: int, attention_mask: torch.Tensor | None, device,
        positions_given: bool = False,
    ) -> _AttentionContext:  # fmt: skip
        kv_length = past_length + seq_len
        # Given positions are checked against the table by `forward` (a row of packed sequences may be longer).
        if not positions_given and seq_len > self.config.max_position_embeddings:
            raise ValueError(
                f"The input has {seq_len} tokens, longer than `max_position_embeddings` "
                f"({self.config.max_position_embeddings})."
            )
        key_valid = None
        if attention_mask is not None:  # (batch, past + seq), checked by `forward`
            key_valid = attention_mask.to(device=device, dtype=torch.bool)
        # Without padding the cheaper no-mask path runs; under torch.compile/export the data-dependent test would
        # break the graph, so traced code keeps the (exact) masked path.
        if key_valid is None or (not torch.compiler.is_compiling() and bool(key_valid.all())):
            key_positions = torch.arange(kv_length, device=device).expand(batch_size, -1)  # (B, Tk)
            key_order = key_positions
            key_valid = None
        else:
            # Positions count real tokens only, so a left-padded row has the same positions (and, for the fixed
            # pattern, the same blocks) as the unpadded one. A padding slot after a real token counts on from it, as
            # on the natural-order path: the (ignored) outputs at right padding do not depend on left padding.
            slots = torch.arange(kv_length, device=device).expand(batch_size, -1)
            real_so_far = key_valid.long().cumsum(-1)  # (B, Tk)
            # The last real slot at or before each slot, i.e. the real_so_far-th real slot, without cummax or a
            # stable sort (the ONNX exporter has neither): each real slot is written at its rank (1, 2, ...), padding
            # at the unused index 0, then read back by rank.
            by_rank = torch.zeros(batch_size, kv_length + 1, dtype=torch.long, device=device)
            by_rank = by_rank.scatter(1, torch.where(key_valid, real_so_far, 0), slots)
            last_real = torch.gather(by_rank, 1, real_so_far)
            key_positions = torch.where(real_so_far > 0, real_so_far - 1 + (slots - last_real), 0)
            # Physical slot of each logical position: the valid slots first, in order.
            key_order = torch.argsort((~key_valid).to(torch.int8), dim=-1, stable=True)
        return _AttentionContext(
            query_positions=key_positions[:, past_length:],
            key_positions=key_positions,
            key_valid=key_valid,
            past_length=past_length,
            key_order=key_order,
            masks={},
        )


class SparseTransformerForCausalLM(GenerationWithCompiledDecoding, SparseTransformerPreTrainedModel, GenerationMixin):
    """The Sparse Transformer with a linear output layer over the vocabulary.

    `labels` give the next-token cross-entropy (sec. 5: the model maximises the log-likelihood of each token given the
    previous ones).

    `generate(..., cache_implementation="static")` runs each decoding step after the prompt as one compiled graph,
    on CPU too and for greedy, sampling and beam search, with the tokens of eager decoding. That step attends through
    the pattern's mask over every slot of the static cache (the eager step on a dynamic cache gathers only the keys
    the pattern allows: O(sqrt(n)) keys instead of n), which is exact and cheap next to the projections at the
    lengths a static cache is sized for. A new graph is traced when the batch size x beams, the cache's length (the
    largest `max_length` so far, or `max_cache_len`), the dtype, the device or the output flags change;
    `disable_compile=True` decodes the static cache eagerly. See `compiled_decoding.py`.

    Args:
        config: the model's `SparseTransformerConfig`.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.embed_tokens.weight"}

    def __init__(self, config: SparseTransformerConfig):
        super().__init__(config)
        self.model = SparseTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding.

        Returns:
            The embedding module.
        """
        return self.model.embeddings.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        """Replace the token embedding.

        Args:
            value: the new embedding.
        """
        self.model.embeddings.embed_tokens = value

    @staticmethod
    def _reorder_cache(cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search's per-step cache reordering (called by `GenerationMixin`); a static cache's buffers are
        rewritten in place, where the compiled decoding step reads them."""
        reorder_cache_in_place(cache, beam_idx)
        return cache

    def get_output_embeddings(self) -> nn.Module:
        """The output projection to the vocabulary (`lm_head`).

        Returns:
            The projection.
        """
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        """Replace the output projection (`lm_head`).

        Args:
            value: the new projection.
        """
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """Next-token logits at every position; with `labels` (the input ids, -100 where no loss), the next-token loss.

        Raises a `ValueError` naming token ids outside the vocabulary.
        """
        cache = resolve_cache(cache, past_key_values)
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None:
            check_token_ids("labels", labels, self.config.vocab_size, ignore_index=IGNORE_INDEX)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        if logits_to_keep:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.lm_head(hidden_states)  # (B, T, V)
        loss = self.next_token_loss(logits, labels, num_items_in_batch) if labels is not None else None
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()

    @staticmethod
    def next_token_loss(
        logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Cross-entropy of token t+1 given tokens <= t, in nats per predicted token; -100 labels are ignored.

        Args:
            logits: (B, T, V), the logits at every position.
            labels: (B, T), the tokens (position t's logits are scored against label t+1).
            num_items_in_batch: Trainer's count of labelled tokens over the accumulated batches; given, the sum is
                divided by it, so gradient accumulation gives the same loss as one big batch.

        Returns:
            The scalar loss.

        Raises:
            ValueError: `labels` whose shape is not the logits' (B, T).
        """
        if labels.shape != logits.shape[:2]:
            raise ValueError(f"`labels` must have shape {tuple(logits.shape[:2])}, got {tuple(labels.shape)}.")
        return token_cross_entropy(logits[:, :-1], labels[:, 1:], num_items_in_batch)  # (B, T-1) predictions


class SparseTransformerForImageGeneration(SparseTransformerForCausalLM):
    """The Sparse Transformer as an image model (sec. 7.1 of the paper).

    An image is the sequence of its 8-bit intensities in raster order, channels interleaved (red, green, blue of a
    pixel, then the next pixel), and the model predicts each from all earlier ones. Built from
    `SparseTransformerConfig.for_images(height, width, ...)`: row / column (/ channel) position embeddings, a strided
    stride of one image row.

    `forward(pixel_values=...)` takes integer images, (batch, channels, height, width) or (batch, height, width) for
    grey ones, values 0..255; the input is the sequence shifted right by the start token (`bos_token_id`), so
    position t predicts pixel t, and the loss is the mean negative log-likelihood per dimension (sub-pixel) in nats:
    divided by ln 2 it is the paper's bits per dim. Everything else is the causal LM's: `generate` from the start
    token draws images (`max_new_tokens = pixels_per_image`; tokens back to images with `tokens_to_pixels`), with
    the pattern-aware cache, static-cache compilation and the Auto classes (the checkpoint names this class for
    `AutoModelForCausalLM`). Tokens that are not intensities (the start token) get a logit of -inf, so no decoding
    strategy ever draws them.

    Args:
        config: an image `SparseTransformerConfig` (`SparseTransformerConfig.for_images`).

    Raises:
        ValueError: a config that is not an image model's (`image_size` unset).
    """

    remote_code_auto_map = {
        **SparseTransformerPreTrainedModel.remote_code_auto_map,
        "AutoModelForCausalLM": "modeling_sparse_transformer.SparseTransformerForImageGeneration",
    }
    # The inputs the loss is computed from when a batch has no `labels`: transformers' Trainer evaluates a batch of
    # them as labelled (with `import hf_vit_plus`; see `hf_vit_plus.training.trainer_hooks`).
    loss_inputs = ("pixel_values",)

    def __init__(self, config: SparseTransformerConfig):
        if not config.is_image_model:
            raise ValueError(
                "SparseTransformerForImageGeneration needs an image config (`image_size` and `num_channels` set, "
                "see `SparseTransformerConfig.for_images`); got image_size=None. For text use "
                "SparseTransformerForCausalLM."
            )
        super().__init__(config)

    def pixels_to_tokens(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Images of integer intensities as the token sequence, in raster order with the channels interleaved.

        Args:
            pixel_values: (B, C, H, W), or (B, H, W) for one channel, intensities 0..255 (uint8 or int64).

        Returns:
            (B, H*W*C) tokens.

        Raises:
            TypeError: not a tensor, or not of an integer dtype.
            ValueError: a shape other than the model's images, or an intensity outside 0..255.
        """
        height, width = self.config.image_size
        channels = self.config.num_channels
        if not torch.is_tensor(pixel_values):
            raise TypeError(f"`pixel_values` must be a torch.Tensor, got {type(pixel_values).__name__}.")
        if pixel_values.is_floating_point() or pixel_values.dtype == torch.bool or pixel_values.is_complex():
            raise TypeError(
                f"`pixel_values` of an image model must hold integer intensities 0..255 (uint8 or int64), got dtype "
                f"{pixel_values.dtype}; images scaled to [0, 1] need `(x * 255).round().long()`."
            )
        if pixel_values.dim() == 3 and channels == 1:
            pixel_values = pixel_values[:, None]
        expected = (channels, height, width)
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != expected:
            grey = " or (batch, height, width)" if channels == 1 else ""
            raise ValueError(
                f"`pixel_values` must have shape (batch, {channels}, {height}, {width}){grey} for this model "
                f"(num_channels={channels}, image_size={[height, width]}), got {tuple(pixel_values.shape)}."
            )
        check_not_empty("pixel_values", tuple(pixel_values.shape))
        tokens = pixel_values.permute(0, 2, 3, 1).reshape(pixel_values.shape[0], -1).long()  # (B, H*W*C)
        check_token_range("pixel_values", tokens, PIXEL_LEVELS)
        return tokens

    def tokens_to_pixels(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens in raster order (e.g. `generate`'s output without the start token) as images.

        Args:
            tokens: (B, H*W*C).

        Returns:
            (B, C, H, W) uint8 images.

        Raises:
            ValueError: tokens of another shape.
        """
        height, width = self.config.image_size
        channels = self.config.num_channels
        if tokens.dim() != 2 or tokens.shape[1] != self.config.pixels_per_image:
            raise ValueError(
                f"Expected tokens of shape (batch, {self.config.pixels_per_image}), one per pixel and channel, got "
                f"{tuple(tokens.shape)}."
            )
        return tokens.reshape(-1, height, width, channels).permute(0, 3, 1, 2).clamp(0, PIXEL_LEVELS - 1).byte()

    def shifted_input_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """The model's input for the pixels `tokens`: the start token, then every pixel but the last.

        Args:
            tokens: (B, n) pixel tokens.

        Returns:
            (B, n) input ids.
        """
        start = torch.full_like(tokens[:, :1], self.config.bos_token_id)
        return torch.cat([start, tokens[:, :-1]], dim=1)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        pixel_values: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        r"""pixel_values: integer images (B, C, H, W) or (B, H, W), 0..255: the model reads them shifted by the start
        token and returns the loss of predicting every pixel (nats per dimension); `input_ids` must not be given too.
        labels: with `pixel_values`, targets aligned with the pixels (B, H*W*C), intensities 0..255 or -100 where
        there is no loss (default: the pixels themselves); with `input_ids`, next-token labels as for the causal LM.
        With transformers' `Trainer`, batches of `pixel_values` alone train on this loss (gradient accumulation
        included, as with `labels`), and `evaluate` reports it as `eval_loss` once `hf_vit_plus` is imported (in
        remote code without the package, set `TrainingArguments(label_names=["pixel_values"])`)."""
        cache = resolve_cache(cache, past_key_values)
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)
        if pixel_values is None:
            output = super().forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                cache=cache, inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache,
                output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
                logits_to_keep=logits_to_keep, **kwargs,
            )  # fmt: skip
            output.logits = self._pixels_only(output.logits)
            return output if return_dict else output.to_tuple()
        if input_ids is not None or inputs_embeds is not None:
            raise ValueError("Pass either `pixel_values` or `input_ids` / `inputs_embeds`, not both.")
        tokens = self.pixels_to_tokens(pixel_values)
        if labels is None:
            labels = tokens
        else:  # intensities 0..255 or -100: the start token is never predicted (its logit is -inf)
            check_token_ids("labels", labels, PIXEL_LEVELS, ignore_index=IGNORE_INDEX)
            if labels.shape != tokens.shape:
                raise ValueError(
                    f"With `pixel_values`, `labels` must be aligned with the pixels: shape {tuple(tokens.shape)}, got "
                    f"{tuple(labels.shape)}."
                )
        # Trainer's count of labelled pixels over the accumulated micro-batches (given when the batch has `labels`)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(
            input_ids=self.shifted_input_ids(tokens),
            use_cache=False if use_cache is None else use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self._pixels_only(self.lm_head(outputs.last_hidden_state))  # (B, n, V)
        loss = token_cross_entropy(logits, labels, num_items_in_batch)
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()

    @staticmethod
    def _pixels_only(logits: torch.Tensor) -> torch.Tensor:
        """-inf for every token that is not an intensity (the start token): never drawn, never predicted."""
        if logits.shape[-1] <= PIXEL_LEVELS:
            return logits
        not_pixel = torch.arange(logits.shape[-1], device=logits.device) >= PIXEL_LEVELS
        return logits.masked_fill(not_pixel, float("-inf"))


__all__ = [
    "SparseTransformerForCausalLM",
    "SparseTransformerForImageGeneration",
    "SparseTransformerModel",
    "SparseTransformerPreTrainedModel",
]
