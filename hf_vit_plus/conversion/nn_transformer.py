"""Pure converter from `torch.nn.Transformer` to the Seq2seq Transformer family.

`torch.nn.Transformer` holds the layers only (no embeddings, positions or output projection), so the converted
state dict covers the encoder and decoder layers; the embedding keys are left to the caller. Every structural
difference is checked and named in a `ValueError`: a silently wrong conversion is worse than none.

One difference needs a decision. `nn.Transformer` always ends each stack with a LayerNorm (`encoder.norm`,
`decoder.norm`). With pre-norm layers (`norm_first=True`) that is exactly our `normalize_before=True` model's final
LayerNorm. With post-norm layers (the paper's model, `norm_first=False`) it is an extra LayerNorm after a layer that
already ends with one; the paper's model has none, so the converter refuses it unless the stack's `norm` is None
(e.g. `nn.TransformerEncoder(layer, N, norm=None)` passed as `custom_encoder`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"Cannot convert this torch.nn.Transformer: {message}")


def _activation_name(layer: nn.Module) -> str:
    activation = layer.activation
    if activation is nn.functional.relu or isinstance(activation, nn.ReLU):
        return "relu"
    if activation is nn.functional.gelu or (isinstance(activation, nn.GELU) and activation.approximate == "none"):
        return "gelu"
    raise ValueError(f"Cannot convert this torch.nn.Transformer: unsupported activation {activation!r}.")


def config_from_torch_transformer(nn_transformer: nn.Transformer, vocab_size: int, **overrides):
    """The `Seq2SeqTransformerConfig` whose layers match `nn_transformer` (dropouts copied from it)."""
    enc_layer = nn_transformer.encoder.layers[0]
    dec_layer = nn_transformer.decoder.layers[0]
    fields = dict(
        vocab_size=vocab_size,
        d_model=enc_layer.self_attn.embed_dim,
        encoder_layers=len(nn_transformer.encoder.layers),
        decoder_layers=len(nn_transformer.decoder.layers),
        encoder_attention_heads=enc_layer.self_attn.num_heads,
        decoder_attention_heads=dec_layer.self_attn.num_heads,
        encoder_ffn_dim=enc_layer.linear1.out_features,
        decoder_ffn_dim=dec_layer.linear1.out_features,
        activation_function=_activation_name(enc_layer),
        dropout=enc_layer.dropout1.p,
        attention_dropout=enc_layer.self_attn.dropout,
        activation_dropout=enc_layer.dropout.p,
        normalize_before=enc_layer.norm_first,
        layer_norm_eps=enc_layer.norm1.eps,
    )
    fields.update(overrides)
    return Seq2SeqTransformerConfig(**fields)


def _attention(prefix: str, mha: nn.MultiheadAttention, d_model: int, heads: int) -> dict[str, torch.Tensor]:
    _require(mha.in_proj_weight is not None, f"{prefix}: separate q/k/v input dims (kdim/vdim) are not supported")
    _require(mha.in_proj_bias is not None, f"{prefix}: attention without bias is not supported")
    _require(mha.bias_k is None and not mha.add_zero_attn, f"{prefix}: add_bias_kv / add_zero_attn are not supported")
    _require(
        (mha.embed_dim, mha.num_heads) == (d_model, heads),
        f"{prefix}: embed_dim={mha.embed_dim}, num_heads={mha.num_heads}, config has d_model={d_model}, heads={heads}",
    )
    q, k, v = mha.in_proj_weight.detach().chunk(3, dim=0)  # (3D, D) -> 3 x (D, D)
    qb, kb, vb = mha.in_proj_bias.detach().chunk(3, dim=0)
    return {
        f"{prefix}.q_proj.weight": q,
        f"{prefix}.k_proj.weight": k,
        f"{prefix}.v_proj.weight": v,
        f"{prefix}.q_proj.bias": qb,
        f"{prefix}.k_proj.bias": kb,
        f"{prefix}.v_proj.bias": vb,
        f"{prefix}.o_proj.weight": mha.out_proj.weight.detach(),
        f"{prefix}.o_proj.bias": mha.out_proj.bias.detach(),
    }


def _linear_and_norm(prefix: str, renames: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    out = {}
    for ours, module in renames.items():
        _require(module.bias is not None, f"{prefix}.{ours} has no bias (bias=False is not supported)")
        out[f"{prefix}.{ours}.weight"] = module.weight.detach()
        out[f"{prefix}.{ours}.bias"] = module.bias.detach()
    return out


def seq2seq_from_torch_transformer(
    nn_transformer: nn.Transformer, config: Seq2SeqTransformerConfig, prefix: str = ""
) -> dict[str, torch.Tensor]:
    """Our state dict for the layers of `nn_transformer`, keyed for `Seq2SeqTransformerModel` (`prefix=""`) or
    `Seq2SeqTransformerForConditionalGeneration` (`prefix="model."`).

    Load it with `model.load_state_dict(state, strict=False)`: the embeddings (not part of `nn.Transformer`) are
    the only missing keys. Tensors are shared with `nn_transformer` (detached), not copied.
    """
    _require(isinstance(nn_transformer, nn.Transformer), f"expected nn.Transformer, got {type(nn_transformer)}")
    encoder, decoder = nn_transformer.encoder, nn_transformer.decoder
    _require(
        (len(encoder.layers), len(decoder.layers)) == (config.encoder_layers, config.decoder_layers),
        f"{len(encoder.layers)} encoder / {len(decoder.layers)} decoder layers, config has "
        f"{config.encoder_layers} / {config.decoder_layers}",
    )
    state: dict[str, torch.Tensor] = {}
    for stack_name, stack, is_decoder in (("encoder", encoder, False), ("decoder", decoder, True)):
        heads = config.decoder_attention_heads if is_decoder else config.encoder_attention_heads
        ffn_dim = config.decoder_ffn_dim if is_decoder else config.encoder_ffn_dim
        for i, layer in enumerate(stack.layers):
            name = f"{prefix}{stack_name}.layers.{i}"
            _require(
                layer.norm_first == config.normalize_before,
                f"{name}: norm_first={layer.norm_first} but config.normalize_before={config.normalize_before}",
            )
            _require(
                _activation_name(layer) == config.activation_function,
                f"{name}: activation {_activation_name(layer)!r}, config has {config.activation_function!r}",
            )
            _require(
                layer.linear1.out_features == ffn_dim, f"{name}: d_ff={layer.linear1.out_features}, config {ffn_dim}"
            )
            _require(
                layer.norm1.eps == config.layer_norm_eps,
                f"{name}: LayerNorm eps={layer.norm1.eps}, config has layer_norm_eps={config.layer_norm_eps}",
            )
            state.update(_attention(f"{name}.self_attn", layer.self_attn, config.d_model, heads))
            renames = {"fc1": layer.linear1, "fc2": layer.linear2, "self_attn_layer_norm": layer.norm1}
            if is_decoder:
                state.update(_attention(f"{name}.encoder_attn", layer.multihead_attn, config.d_model, heads))
                renames.update({"encoder_attn_layer_norm": layer.norm2, "final_layer_norm": layer.norm3})
            else:
                renames["final_layer_norm"] = layer.norm2
            state.update(_linear_and_norm(name, renames))
        if config.normalize_before:
            _require(stack.norm is not None, f"{stack_name}.norm is None but pre-norm needs the final LayerNorm")
            state.update(_linear_and_norm(f"{prefix}{stack_name}", {"layer_norm": stack.norm}))
        else:
            _require(
                stack.norm is None,
                f"{stack_name}.norm is a final LayerNorm after post-norm layers; the paper's post-norm model has "
                "none. Build the reference with custom_encoder/custom_decoder whose norm=None to convert.",
            )
    return state


__all__ = ["config_from_torch_transformer", "seq2seq_from_torch_transformer"]
