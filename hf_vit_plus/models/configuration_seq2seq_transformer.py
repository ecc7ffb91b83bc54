"""Configuration of the encoder-decoder Transformer (Vaswani et al., NeurIPS 2017, "Attention Is All You Need",
arXiv 1706.03762).

Field names follow transformers' BART/Marian configs; the presets are the paper's Table 3 ("base" and "big").
The `encoder_attention_type` / `encoder_sparse_*` fields optionally replace the encoder's self-attention by a
bidirectional Sparse Transformer pattern (Child et al. 2019, sec. 4.2-4.3); the default is the paper's dense model.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from .compat import CACHE_NAMES
from .config_checks import (
    check_activation,
    check_bool,
    check_divisible,
    check_fields,
    check_init_std,
    check_non_negative_int,
    check_positive_int,
    check_positive_number,
    check_probability,
    check_str,
    check_token_id,
    check_transformers_kwargs,
    choice,
)
from .hub_mixin import HubConfigMixin
from .sparse_layouts import SparseFields, pattern_from_config

# Table 3 of the paper: (N layers, d_model, d_ff, h heads, P_drop). Both use label smoothing 0.1.
SEQ2SEQ_TRANSFORMER_PRESETS: dict[str, tuple[int, int, int, int, float]] = {
    "base": (6, 512, 2048, 8, 0.1),
    "big": (6, 1024, 4096, 16, 0.3),
}

# Where sin and cos sit in the sinusoidal position vectors: the paper's interleaving, or Marian's two halves.
SINUSOID_LAYOUTS = ("interleaved", "halves")

# The kind of each field, checked before anything else (config_checks.check_fields); relations come after.
FIELD_CHECKS = {
    **dict.fromkeys(
        (
            "vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
            "encoder_sparse_stride",
            "encoder_sparse_num_summary_blocks",
        ),
        check_positive_int,
    ),  # fmt: skip
    **dict.fromkeys(
        (
            "scale_embedding",
            "normalize_before",
            "tie_word_embeddings",
            "use_cache",
            "is_encoder_decoder",
            "share_encoder_decoder_embeddings",
            "add_final_logits_bias",
        ),
        check_bool,
    ),  # fmt: skip
    **dict.fromkeys(("dropout", "attention_dropout", "activation_dropout", "label_smoothing"), check_probability),
    "activation_function": check_activation,
    "init_std": check_init_std,
    "layer_norm_eps": check_positive_number,
    "encoder_attention_type": check_str,
    "encoder_sparse_summary_size": check_non_negative_int,
    "encoder_sparse_pattern_mode": check_str,
    "sinusoid_layout": choice(SINUSOID_LAYOUTS),
}


class Seq2SeqTransformerConfig(HubConfigMixin, PretrainedConfig):
    r"""Configuration of a [`Seq2SeqTransformerModel`][hf_vit_plus.Seq2SeqTransformerModel] /
    [`Seq2SeqTransformerForConditionalGeneration`][hf_vit_plus.Seq2SeqTransformerForConditionalGeneration].

    The defaults are the paper's base model (sec. 3, Table 3): post-norm sub-layers, ReLU feed-forward network,
    sinusoidal positions, embeddings scaled by sqrt(d_model), one matrix shared by the source embedding, the target
    embedding and the pre-softmax projection (sec. 3.4), dropout 0.1 and label smoothing 0.1 (sec. 5.4).

    Args:
        vocab_size: size of the shared source/target vocabulary (the paper: ~37,000 BPE tokens for EN-DE).
        d_model: model width.
        encoder_layers / decoder_layers: N, the number of layers of each stack.
        encoder_attention_heads / decoder_attention_heads: h, heads per attention sub-layer.
        encoder_ffn_dim / decoder_ffn_dim: d_ff, the inner width of the feed-forward networks.
        activation_function: activation of the feed-forward networks (the paper: ReLU).
        dropout: P_drop, on the sum of embeddings and positions and on each sub-layer output.
        attention_dropout: dropout on the attention probabilities (0 in the paper).
        activation_dropout: dropout after the activation of the feed-forward network (0 in the paper).
        max_position_embeddings: longest source or target sequence; longer inputs raise a `ValueError`.
        scale_embedding: multiply token embeddings by sqrt(d_model) (sec. 3.4).
        normalize_before: pre-norm sub-layers plus a final LayerNorm on each stack (a later, more stable variant);
            the paper's model is post-norm (`False`).
        tie_word_embeddings: share one matrix between both embeddings and the output projection (sec. 3.4).
        label_smoothing: epsilon_ls of the training loss computed by the model (sec. 5.4).
        init_std: std of the normal initialisation of linear layers and embeddings.
        layer_norm_eps: LayerNorm epsilon.
        pad_token_id / bos_token_id / eos_token_id / decoder_start_token_id: special token ids.
        use_cache: whether the decoder returns a key/value cache by default.
        is_encoder_decoder: always `True` (transformers reads it); any other value raises a `ValueError`.
        encoder_attention_type: the encoder's self-attention: "dense" (the paper) or the bidirectional form of a
            sparse pattern registered in `sparse_layouts.py` (`ATTENTION_TYPES`, e.g. the Sparse Transformer's
            "strided": |i-j| <= l or (i-j) mod l = 0). The decoder's self-attention and the cross-attention stay
            dense.
        encoder_sparse_stride: l, the pattern's length (stride, block length or window); at most
            `max_position_embeddings`.
        encoder_sparse_summary_size: the pattern's second setting where it reads one (the fixed pattern's c).
        encoder_sparse_num_summary_blocks: how many different summary sub-blocks the heads use (patterns that
            read it: head h takes sub-block h mod this count).
        encoder_sparse_pattern_mode: how the parts of the pattern combine: "merged" (each head attends to the
            union), "interleaved" (encoder layer i uses part i mod the number of parts) or "heads" (head h uses part
            h mod the number of parts; `encoder_attention_heads` must be divisible by it).
        sinusoid_layout: where the sin and cos of each frequency sit in the position vector: "interleaved" (the
            paper, sec. 3.5: sin at 2i, cos at 2i+1) or "halves" (Marian / opus-mt: sin at i, cos at d_model/2 + i).
        share_encoder_decoder_embeddings: with `tie_word_embeddings`, whether the source embedding is the shared
            matrix too (the paper) or only the target embedding and the output projection share one (as in Marian
            checkpoints saved with `share_encoder_decoder_embeddings=False`). Without `tie_word_embeddings` all three
            are separate matrices.
        add_final_logits_bias: add the vector `final_logits_bias` (vocab_size,) to the logits: Marian's output bias,
            a buffer (saved with the weights, not trained); the paper's model has none.

    Generation settings (beam size 4, length penalty 0.6 in the paper) belong in a `GenerationConfig`: see
    `Seq2SeqTransformerForConditionalGeneration.paper_generation_config()`.
    """

    model_type = "seq2seq_transformer"
    # Every Auto class of the family (HubConfigMixin: written into a saved config, with the code they need)
    remote_code_classes = {
        "AutoConfig": "configuration_seq2seq_transformer.Seq2SeqTransformerConfig",
        "AutoModel": "modeling_seq2seq_transformer.Seq2SeqTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_seq2seq_transformer.Seq2SeqTransformerForConditionalGeneration",
    }
    keys_to_ignore_at_inference = list(CACHE_NAMES)  # Trainer drops the cache from the predictions
    # BART's generic names, and the names other transformers configs give these fields where the meaning is the same
    # (GPT-2's, T5's, BERT's, ...)
    attribute_map = {
        **dict.fromkeys(("hidden_size", "n_embd"), "d_model"),
        "num_attention_heads": "encoder_attention_heads",
        **dict.fromkeys(("num_hidden_layers", "num_encoder_layers"), "encoder_layers"),
        "num_decoder_layers": "decoder_layers",
        **dict.fromkeys(("hidden_act", "hidden_activation"), "activation_function"),
        **dict.fromkeys(("dropout_rate", "hidden_dropout_prob", "hidden_dropout"), "dropout"),
        **dict.fromkeys(("attention_probs_dropout_prob", "attn_pdrop"), "attention_dropout"),
        "initializer_range": "init_std",
        "layer_norm_epsilon": "layer_norm_eps",
        "n_positions": "max_position_embeddings",
    }
    # Names of other configs that stand for a field of each stack here: the keyword is kept unused, and the warning
    # names both fields (config_checks.check_transformers_kwargs).
    ambiguous_names = {
        **dict.fromkeys(("num_layers", "n_layer", "n_layers"), ("encoder_layers", "decoder_layers")),
        **dict.fromkeys(("num_heads", "n_head"), ("encoder_attention_heads", "decoder_attention_heads")),
        **dict.fromkeys(("d_ff", "ffn_dim", "n_inner", "intermediate_size"), ("encoder_ffn_dim", "decoder_ffn_dim")),
    }
    # The encoder's sparse-attention fields (`encoder_attention_type`, `encoder_sparse_*`) as
    # `sparse_layouts.pattern_from_config` reads them: bidirectional, the stride at most `max_position_embeddings`.
    sparse_fields = SparseFields(prefix="encoder_", causal=False, heads_field="encoder_attention_heads")

    def __init__(
        self,
        vocab_size: int = 37000,
        d_model: int = 512,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        encoder_attention_heads: int = 8,
        decoder_attention_heads: int = 8,
        encoder_ffn_dim: int = 2048,
        decoder_ffn_dim: int = 2048,
        activation_function: str = "relu",
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        max_position_embeddings: int = 1024,
        scale_embedding: bool = True,
        normalize_before: bool = False,
        tie_word_embeddings: bool = True,
        label_smoothing: float = 0.1,
        init_std: float = 0.02,
        layer_norm_eps: float = 1e-5,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | None = 2,
        decoder_start_token_id: int | None = 1,
        use_cache: bool = True,
        is_encoder_decoder: bool = True,
        encoder_attention_type: str = "dense",
        encoder_sparse_stride: int = 32,
        encoder_sparse_summary_size: int = 8,
        encoder_sparse_num_summary_blocks: int = 1,
        encoder_sparse_pattern_mode: str = "merged",
        sinusoid_layout: str = "interleaved",
        share_encoder_decoder_embeddings: bool = True,
        add_final_logits_bias: bool = False,
        **kwargs,
    ):
        check_fields(locals(), FIELD_CHECKS)
        check_transformers_kwargs(type(self), kwargs, locals(), FIELD_CHECKS)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.encoder_attention_heads = encoder_attention_heads
        self.decoder_attention_heads = decoder_attention_heads
        self.encoder_ffn_dim = encoder_ffn_dim
        self.decoder_ffn_dim = decoder_ffn_dim
        self.activation_function = activation_function
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.max_position_embeddings = max_position_embeddings
        self.scale_embedding = scale_embedding
        self.normalize_before = normalize_before
        self.tie_word_embeddings = tie_word_embeddings
        self.label_smoothing = label_smoothing
        self.init_std = init_std
        self.layer_norm_eps = layer_norm_eps
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.decoder_start_token_id = decoder_start_token_id
        self.use_cache = use_cache
        self.encoder_attention_type = encoder_attention_type
        self.encoder_sparse_stride = encoder_sparse_stride
        self.encoder_sparse_summary_size = encoder_sparse_summary_size
        self.encoder_sparse_num_summary_blocks = encoder_sparse_num_summary_blocks
        self.encoder_sparse_pattern_mode = encoder_sparse_pattern_mode
        self.sinusoid_layout = sinusoid_layout
        self.share_encoder_decoder_embeddings = share_encoder_decoder_embeddings
        self.add_final_logits_bias = add_final_logits_bias
        super().__init__(is_encoder_decoder=is_encoder_decoder, **kwargs)
        self.validate_seq2seq_transformer()

    def validate_seq2seq_transformer(self) -> None:
        """Raise a `ValueError` naming the offending values if the fields do not describe a valid model."""
        check_fields(vars(self), FIELD_CHECKS)
        if self.is_encoder_decoder is not True:
            # forward would still run an encoder and a decoder, but `generate` would decode as a decoder-only model
            raise ValueError(
                f"`is_encoder_decoder` must be True for the encoder-decoder Transformer, got "
                f"{self.is_encoder_decoder!r}: for a decoder-only model use SparseTransformerConfig "
                "(attention_type='dense')."
            )
        for heads_name in ("encoder_attention_heads", "decoder_attention_heads"):
            check_divisible("d_model", self.d_model, heads_name, getattr(self, heads_name))
        if self.d_model % 2 != 0:
            raise ValueError(f"`d_model` ({self.d_model}) must be even: the sinusoidal table pairs sin and cos.")
        for name in ("pad_token_id", "bos_token_id", "decoder_start_token_id"):
            check_token_id(name, getattr(self, name), self.vocab_size)
        eos = self.eos_token_id
        for token in eos if isinstance(eos, (list, tuple)) else [eos]:
            check_token_id("eos_token_id", token, self.vocab_size)
        pattern_from_config(self)  # the encoder's sparse-attention fields

    @classmethod
    def preset_names(cls) -> list[str]:
        """The names `from_preset` accepts.

        Returns:
            The presets of the paper's Table 3 ("base", "big").
        """
        return list(SEQ2SEQ_TRANSFORMER_PRESETS)

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> Seq2SeqTransformerConfig:
        """A config from the paper's Table 3, e.g. `from_preset("base", vocab_size=37000)`.

        Args:
            name: "base" or "big".
            **kwargs: fields that override the preset's.

        Returns:
            The config.

        Raises:
            ValueError: an unknown preset name.
        """
        if name not in SEQ2SEQ_TRANSFORMER_PRESETS:
            raise ValueError(
                f"Unknown Transformer preset {name!r}: expected one of {list(SEQ2SEQ_TRANSFORMER_PRESETS)}."
            )
        layers, d_model, d_ff, heads, dropout = SEQ2SEQ_TRANSFORMER_PRESETS[name]
        fields = dict(d_model=d_model, dropout=dropout, label_smoothing=0.1)
        for both_stacks, value in (("num_layers", layers), ("ffn_dim", d_ff), ("num_heads", heads)):
            fields.update(dict.fromkeys(cls.ambiguous_names[both_stacks], value))  # the encoder's and the decoder's
        fields.update(kwargs)
        return cls(**fields)


__all__ = ["SEQ2SEQ_TRANSFORMER_PRESETS", "SINUSOID_LAYOUTS", "Seq2SeqTransformerConfig"]
