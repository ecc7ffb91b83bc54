"""Pure converter from transformers' `MarianMTModel` (the opus-mt translation checkpoints) to the Seq2seq Transformer.

Marian is the paper's post-norm encoder-decoder (no embedding LayerNorm, no final LayerNorm) with a few choices of
its own, each a field of `Seq2SeqTransformerConfig`:

- the feed-forward activation is `swish` (SiLU) in the opus-mt checkpoints (`activation_function`, copied);
- the sinusoidal positions hold all the sines first, then all the cosines (`sinusoid_layout="halves"`);
- a bias vector is added to the logits, a buffer (`add_final_logits_bias=True`);
- the embeddings may be shared by both stacks and the output projection, or the source embedding kept apart
  (`tie_word_embeddings`, `share_encoder_decoder_embeddings`, copied);
- there is no bos token: the decoder starts from the pad token (`decoder_start_token_id == pad_token_id`), and the
  generation config forbids `<pad>` (`bad_words_ids=[[pad]]`), forces `</s>` at the maximum length
  (`forced_eos_token_id`) and allows 512 tokens; the Marian model's `generation_config` is copied as it is.

Parameter names are those of transformers' BART/Marian except the attention output projection (Marian's `out_proj`
is our `o_proj`). The only behaviour not reproduced: Marian's encoder does not scale `inputs_embeds` passed by the
caller by sqrt(d_model) (only embeddings it looks up itself), ours always does; token ids behave identically.
"""

from __future__ import annotations

import copy
import logging

import torch

from ..models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig
from ..models.modeling_seq2seq_transformer import Seq2SeqTransformerForConditionalGeneration, position_table

logger = logging.getLogger(__name__)

# Marian's shared embedding module exists even when it is not used (tie_word_embeddings=False): nothing to copy then.
_UNUSED_MARIAN_KEYS = ("model.shared.weight",)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"Cannot convert this MarianMTModel: {message}")


def config_from_marian(marian_config, **overrides) -> Seq2SeqTransformerConfig:
    """The `Seq2SeqTransformerConfig` of a transformers `MarianConfig`.

    Args:
        marian_config: a transformers `MarianConfig` (`model_type` "marian").
        **overrides: fields of the new config that replace the converted ones.

    Returns:
        The `Seq2SeqTransformerConfig` that describes the same model.

    Raises:
        ValueError: `marian_config` is not a Marian config, or describes a structure the config cannot express
            (source and target vocabularies of different sizes, layer drop).
    """
    _require(
        getattr(marian_config, "model_type", None) == "marian",
        f"expected a MarianConfig (model_type 'marian'), got {type(marian_config).__name__} with model_type "
        f"{getattr(marian_config, 'model_type', None)!r}",
    )
    decoder_vocab_size = marian_config.decoder_vocab_size or marian_config.vocab_size
    _require(
        decoder_vocab_size == marian_config.vocab_size,
        f"separate source and target vocabularies of different sizes (vocab_size={marian_config.vocab_size}, "
        f"decoder_vocab_size={decoder_vocab_size}) are not supported: Seq2SeqTransformerConfig has one vocab_size",
    )
    for name in ("encoder_layerdrop", "decoder_layerdrop"):
        if value := getattr(marian_config, name, 0.0):
            logger.warning("%s=%s is not converted: the converted model has no LayerDrop.", name, value)
    fields = dict(
        vocab_size=marian_config.vocab_size,
        d_model=marian_config.d_model,
        encoder_layers=marian_config.encoder_layers,
        decoder_layers=marian_config.decoder_layers,
        encoder_attention_heads=marian_config.encoder_attention_heads,
        decoder_attention_heads=marian_config.decoder_attention_heads,
        encoder_ffn_dim=marian_config.encoder_ffn_dim,
        decoder_ffn_dim=marian_config.decoder_ffn_dim,
        activation_function=marian_config.activation_function,
        dropout=marian_config.dropout,
        attention_dropout=marian_config.attention_dropout,
        activation_dropout=marian_config.activation_dropout,
        max_position_embeddings=marian_config.max_position_embeddings,
        scale_embedding=marian_config.scale_embedding,
        normalize_before=False,
        tie_word_embeddings=marian_config.tie_word_embeddings,
        share_encoder_decoder_embeddings=marian_config.share_encoder_decoder_embeddings,
        sinusoid_layout="halves",
        add_final_logits_bias=True,
        label_smoothing=0.0,  # MarianMTModel's loss is the plain cross-entropy
        init_std=marian_config.init_std,
        layer_norm_eps=1e-5,  # Marian's nn.LayerNorm default; `seq2seq_from_marian` reads the modules' own eps
        pad_token_id=marian_config.pad_token_id,
        bos_token_id=marian_config.bos_token_id,
        eos_token_id=marian_config.eos_token_id,
        decoder_start_token_id=marian_config.decoder_start_token_id,
        use_cache=marian_config.use_cache,
    )
    fields.update(overrides)
    return Seq2SeqTransformerConfig(**fields)


def state_dict_from_marian(marian_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our `Seq2SeqTransformerForConditionalGeneration` keys for a `MarianMTModel` state dict.

    `out_proj` becomes `o_proj`; the sinusoidal tables (rebuilt from the config, not weights) are left out. Tensors are
    not copied.

    Args:
        marian_state: the state dict of a transformers `MarianMTModel`.

    Returns:
        The same tensors under our parameter names.
    """
    state = {}
    for key, tensor in marian_state.items():
        if ".embed_positions." in key:
            continue
        state[key.replace(".out_proj.", ".o_proj.")] = tensor
    return state


# Marian tensors our model does not load but recomputes from its config (`position_table`)
RECOMPUTED_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def check_recomputed_tensors(stored: dict[str, torch.Tensor], config: Seq2SeqTransformerConfig) -> None:
    """Each tensor of a Marian state dict that the converted model recomputes instead of loading (the sinusoidal
    position tables, `RECOMPUTED_KEYS`) must be what it recomputes: up to one unit in the last place of the stored
    dtype (a table saved in bf16 is the sinusoid rounded), never more. Otherwise the converted model would compute
    something else than the stored one, silently: a ValueError names the tensor and the largest difference."""
    expected = position_table(config)
    for key in RECOMPUTED_KEYS:
        if key not in stored:
            continue
        theirs = stored[key].detach()
        if tuple(theirs.shape) != tuple(expected.shape):
            _require(False, f"{key} has shape {tuple(theirs.shape)}, expected {tuple(expected.shape)}")
        difference = (theirs.float().cpu() - expected).abs()
        ulp = torch.finfo(theirs.dtype).eps * expected.abs()  # one unit in the last place of each entry
        worst = float(difference.max())
        _require(
            bool((difference <= ulp + 1e-6).all()),
            f"{key} is not the sinusoidal table the converted model computes (Marian's: sines in the first half, "
            f"cosines in the second), max |difference| {worst:.3g}; the converted model would compute something "
            "else than the stored one",
        )


def seq2seq_from_marian(marian_model) -> Seq2SeqTransformerForConditionalGeneration:
    """A `Seq2SeqTransformerForConditionalGeneration` with the weights, logits and `generate` output of a Marian model.

    The model is in the Marian model's dtype, on its device, in eval mode; its generation config is a copy of the
    Marian model's. A structure the config cannot express (target vocabulary of another size, LayerNorm epsilons that
    differ between layers, a position table other than Marian's) raises a `ValueError` naming it: a silently wrong
    conversion is worse than none.

    Args:
        marian_model: a transformers `MarianMTModel`.

    Returns:
        The converted model.

    Raises:
        TypeError: `marian_model` is not a `MarianMTModel`.
        ValueError: its structure cannot be expressed by `Seq2SeqTransformerConfig`.
    """
    from transformers import MarianMTModel

    if not isinstance(marian_model, MarianMTModel):
        raise TypeError(f"Expected a transformers MarianMTModel, got {type(marian_model).__name__}.")
    epsilons = {m.eps for m in marian_model.modules() if isinstance(m, torch.nn.LayerNorm)}
    _require(len(epsilons) == 1, f"its LayerNorms use different epsilons {sorted(epsilons)}")
    config = config_from_marian(marian_model.config, layer_norm_eps=epsilons.pop())
    config._attn_implementation = marian_model.config._attn_implementation
    if config.tie_word_embeddings:
        # One tensor in our model: the Marian matrices it stands for must hold the same values.
        decoder_embedding = marian_model.get_decoder().embed_tokens.weight
        tied = [("lm_head", marian_model.lm_head.weight)]
        if config.share_encoder_decoder_embeddings:
            tied.append(("encoder.embed_tokens", marian_model.get_encoder().embed_tokens.weight))
        for name, weight in tied:
            _require(
                torch.equal(weight, decoder_embedding),
                f"tie_word_embeddings=True but its {name} differs from the decoder embedding",
            )

    model = Seq2SeqTransformerForConditionalGeneration(config)
    check_recomputed_tensors(marian_model.state_dict(), config)
    state = state_dict_from_marian(marian_model.state_dict())
    if not (config.tie_word_embeddings and config.share_encoder_decoder_embeddings):
        state = {key: value for key, value in state.items() if key not in _UNUSED_MARIAN_KEYS}
    missing, unexpected = model.load_state_dict(state, strict=False)
    _require(not missing and not unexpected, f"missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    parameter = next(marian_model.parameters())
    model = model.to(device=parameter.device, dtype=parameter.dtype).eval()
    model.generation_config = copy.deepcopy(marian_model.generation_config)
    return model


__all__ = [
    "RECOMPUTED_KEYS",
    "check_recomputed_tensors",
    "config_from_marian",
    "seq2seq_from_marian",
    "state_dict_from_marian",
]
