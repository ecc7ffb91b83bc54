"""Pure converters from timm's and transformers' ViTs to `ViTPlusForImageClassification`.

Each converter checks that the source is a plain ViT (class token, token pooling, no register tokens, no layer
scale, no qk-norm, ...) and raises a `ValueError` naming the unsupported feature otherwise: a silently wrong
conversion is worse than none.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.configuration_vit_plus import ViTPlusConfig
from ..models.modeling_vit_plus import ViTPlusForImageClassification


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"Cannot convert this timm model: {message}")


def config_from_timm(timm_model: nn.Module, **overrides) -> ViTPlusConfig:
    """The `ViTPlusConfig` that describes a timm `VisionTransformer`.

    Args:
        timm_model: a timm `VisionTransformer` with a class token, pooled on it.
        **overrides: fields of the new config that replace the converted ones.

    Returns:
        The config of the same architecture.

    Raises:
        ValueError: the model uses a feature the config cannot express (register tokens, layer scale, qk-norm,
            pre-norm, another pooling or activation); the message names it.
    """
    m = timm_model
    _require(type(m).__name__ == "VisionTransformer", f"expected a timm VisionTransformer, got {type(m).__name__}")
    _require(getattr(m, "cls_token", None) is not None, "it has no class token")
    _require(m.global_pool == "token", f"global_pool={m.global_pool!r}; only 'token' (the class token) is supported")
    _require(getattr(m, "reg_token", None) is None, "register tokens are not supported")
    _require(not getattr(m, "no_embed_class", False), "no_embed_class=True is not supported")
    _require(isinstance(m.norm_pre, nn.Identity), "pre-norm (norm_pre, CLIP-style) is not supported")
    _require(isinstance(m.fc_norm, nn.Identity), "fc_norm is not supported")
    _require(not isinstance(m.norm, nn.Identity), "the model has no final norm")
    block = m.blocks[0]
    _require(isinstance(block.ls1, nn.Identity), "layer scale (init_values) is not supported")
    _require(isinstance(block.attn.q_norm, nn.Identity), "qk-norm is not supported")
    _require(isinstance(block.mlp.act, nn.GELU), f"MLP activation {type(block.mlp.act).__name__} is not GELU")
    approximate = getattr(block.mlp.act, "approximate", "none")
    patch = m.patch_embed.patch_size
    image = m.patch_embed.img_size
    _require(patch[0] == patch[1] and image[0] == image[1], f"non-square patches {patch} or images {image}")
    fields = dict(
        hidden_size=m.embed_dim,
        num_hidden_layers=len(m.blocks),
        num_attention_heads=block.attn.num_heads,
        intermediate_size=block.mlp.fc1.out_features,
        hidden_act="gelu" if approximate == "none" else "gelu_pytorch_tanh",
        layer_norm_eps=m.norm.eps,
        image_size=image[0],
        patch_size=patch[0],
        num_channels=m.patch_embed.proj.in_channels,
        qkv_bias=block.attn.qkv.bias is not None,
        num_labels=m.num_classes,
        # timm resamples with `resample_abs_pos_embed` (antialiased bicubic) when dynamic_img_size=True
        position_interpolation="bicubic_antialias",
    )
    fields.update(overrides)
    return ViTPlusConfig(**fields)


def state_dict_from_timm(timm_state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Rename timm keys to ours and split the fused (3D, D) qkv projection into q/k/v.

    Args:
        timm_state: the state dict of a timm `VisionTransformer`.
        num_layers: how many blocks the model has.

    Returns:
        The state dict of a `ViTPlusForImageClassification` (with `classifier.*` when the timm model has a head).
    """
    out = {
        "vit.embeddings.cls_token": timm_state["cls_token"],
        "vit.embeddings.position_embeddings": timm_state["pos_embed"],
        "vit.embeddings.patch_embeddings.projection.weight": timm_state["patch_embed.proj.weight"],
        "vit.embeddings.patch_embeddings.projection.bias": timm_state["patch_embed.proj.bias"],
        "vit.layernorm.weight": timm_state["norm.weight"],
        "vit.layernorm.bias": timm_state["norm.bias"],
    }
    if "head.weight" in timm_state:
        out["classifier.weight"] = timm_state["head.weight"]
        out["classifier.bias"] = timm_state["head.bias"]
    for i in range(num_layers):
        src, dst = f"blocks.{i}.", f"vit.layers.{i}."
        q, k, v = timm_state[src + "attn.qkv.weight"].chunk(3, dim=0)  # (3D, D) -> 3 x (D, D)
        out.update({dst + "attention.q_proj.weight": q, dst + "attention.k_proj.weight": k})
        out[dst + "attention.v_proj.weight"] = v
        if src + "attn.qkv.bias" in timm_state:
            qb, kb, vb = timm_state[src + "attn.qkv.bias"].chunk(3, dim=0)
            out.update({dst + "attention.q_proj.bias": qb, dst + "attention.k_proj.bias": kb})
            out[dst + "attention.v_proj.bias"] = vb
        renames = {
            "attn.proj": "attention.o_proj",
            "norm1": "layernorm_before",
            "norm2": "layernorm_after",
            "mlp.fc1": "mlp.fc1",
            "mlp.fc2": "mlp.fc2",
        }
        for old, new in renames.items():
            for param in ("weight", "bias"):
                out[f"{dst}{new}.{param}"] = timm_state[f"{src}{old}.{param}"]
    return out


def _load_exact(model: ViTPlusForImageClassification, state: dict[str, torch.Tensor]) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"Converted weights do not fit the model: missing {missing}, unexpected {unexpected}.")


def vit_plus_from_timm(timm_model: nn.Module, **config_overrides) -> ViTPlusForImageClassification:
    """A `ViTPlusForImageClassification` with the weights of a timm ViT (`vit_*` models).

    Args:
        timm_model: a timm `VisionTransformer`.
        **config_overrides: fields of the config that replace the converted ones.

    Returns:
        The converted model, in the timm model's dtype, in eval mode.

    Raises:
        ValueError: the timm model uses a feature `ViTPlusConfig` cannot express.
    """
    config = config_from_timm(timm_model, **config_overrides)
    model = ViTPlusForImageClassification(config)
    state = {k: v.detach().clone() for k, v in timm_model.state_dict().items()}
    _load_exact(model, state_dict_from_timm(state, config.num_hidden_layers))
    return model.to(next(timm_model.parameters()).dtype).eval()


def config_from_transformers(hf_config, **overrides) -> ViTPlusConfig:
    """The `ViTPlusConfig` for a transformers `ViTConfig`; the field names are the same.

    Args:
        hf_config: a transformers `ViTConfig`.
        **overrides: fields of the new config that replace the converted ones.

    Returns:
        The config of the same architecture.

    Raises:
        ValueError: `hf_config` is not a `ViTConfig`, or its images or patches are not square.
    """
    if getattr(hf_config, "model_type", None) != "vit":
        raise ValueError(f"Expected a transformers ViTConfig (model_type 'vit'), got {hf_config.model_type!r}.")
    image_size, patch_size = hf_config.image_size, hf_config.patch_size
    if isinstance(image_size, (list, tuple)) or isinstance(patch_size, (list, tuple)):
        raise ValueError(f"Only square images/patches are supported, got {image_size} / {patch_size}.")
    fields = {
        name: getattr(hf_config, name)
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "hidden_act",
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
            "initializer_range",
            "layer_norm_eps",
            "image_size",
            "patch_size",
            "num_channels",
            "qkv_bias",
        )
    }
    fields.update(id2label=dict(hf_config.id2label), label2id=dict(hf_config.label2id))
    # transformers' `ViTEmbeddings.interpolate_pos_encoding` is plain bicubic (no antialiasing)
    fields["position_interpolation"] = "bicubic"
    fields.update(overrides)
    return ViTPlusConfig(**fields)


def vit_plus_from_transformers(hf_model: nn.Module, **config_overrides) -> ViTPlusForImageClassification:
    """A `ViTPlusForImageClassification` with the weights of a transformers `ViTForImageClassification`.

    Parameter names are the same (both follow transformers v5); the pooler of a `ViTModel` is dropped.

    Args:
        hf_model: a transformers `ViTForImageClassification`.
        **config_overrides: fields of the config that replace the converted ones.

    Returns:
        The converted model, in the transformers model's dtype, in eval mode.

    Raises:
        ValueError: `hf_model` is not a `ViTForImageClassification`, or its config cannot be converted.
    """
    if type(hf_model).__name__ != "ViTForImageClassification":
        raise ValueError(f"Expected a transformers ViTForImageClassification, got {type(hf_model).__name__}.")
    config = config_from_transformers(hf_model.config, **config_overrides)
    model = ViTPlusForImageClassification(config)
    state = {k: v.detach().clone() for k, v in hf_model.state_dict().items() if not k.startswith("vit.pooler.")}
    if "classifier.weight" not in state:  # num_labels == 0: Identity head on both sides
        state.pop("classifier.bias", None)
    _load_exact(model, state)
    return model.to(next(hf_model.parameters()).dtype).eval()
