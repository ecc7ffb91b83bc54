"""Configuration of the Vision Transformer (Dosovitskiy et al., ICLR 2021, arXiv 2010.11929).

Field names follow transformers' `ViTConfig`; the presets are the paper's Table 1.
"""

from __future__ import annotations

import re

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from .config_checks import check_positive_int, check_probability
from .sparse_layouts import build_pattern, check_mode

# Table 1 of the paper: (layers, hidden size D, MLP size, heads). Patch size and resolution come from the name.
VIT_PLUS_SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (12, 192, 768, 3),  # DeiT-Ti, not in the paper; handy for experiments
    "small": (12, 384, 1536, 6),  # DeiT-S, not in the paper
    "base": (12, 768, 3072, 12),
    "large": (24, 1024, 4096, 16),
    "huge": (32, 1280, 5120, 16),
}
VIT_PLUS_PATCH_SIZES = (14, 16, 32)
_PRESET_RE = re.compile(r"^(?P<size>[a-z]+)-patch(?P<patch>\d+)-(?P<res>\d+)$")
CLASSIFIER_HEADS = ("linear", "mlp_tanh")
ATTENTION_TYPES = ("dense", "strided", "fixed")
# How `interpolate_pos_encoding=True` resamples the position embeddings: timm's antialiased bicubic (the default, as
# in 0.1) or transformers' plain bicubic. Each converter sets the one of its source, so converted models match it.
POSITION_INTERPOLATIONS = ("bicubic_antialias", "bicubic")


class ViTPlusConfig(PretrainedConfig):
    r"""Configuration of a [`ViTPlusModel`].

    Args:
        hidden_size: width D of the encoder.
        num_hidden_layers: number of encoder blocks L.
        num_attention_heads: attention heads per block.
        intermediate_size: hidden size of the MLP.
        hidden_act: activation of the MLP (the paper: GELU).
        hidden_dropout_prob: dropout on the embeddings and on each residual branch.
        attention_probs_dropout_prob: dropout on the attention probabilities.
        initializer_range: std of the truncated-normal initialisation.
        layer_norm_eps: LayerNorm epsilon. 1e-6 as in the paper's JAX code and timm (transformers' ViT: 1e-12).
        image_size: input resolution (square).
        patch_size: patch size P; the sequence has (image_size / P)^2 + 1 tokens.
        num_channels: input channels.
        qkv_bias: bias in the query/key/value projections.
        classifier_head: "linear" (fine-tuning head of the paper) or "mlp_tanh" (the pre-training head: one hidden
            layer of `classifier_hidden_size` units with tanh).
        classifier_hidden_size: width of the tanh layer of the "mlp_tanh" head (defaults to `hidden_size`).
        attention_type: "dense" (the paper), or a bidirectional Sparse Transformer pattern (Child et al. 2019):
            "strided" (with `sparse_stride` = patches per row: the previous/next row-length of tokens plus the
            token's column) or "fixed" (blocks of `sparse_stride` tokens plus `sparse_summary_size` summary
            columns per block). For long patch sequences at high resolution.
        sparse_stride: l; defaults to the number of patches per row (image_size // patch_size).
        sparse_summary_size: c for "fixed"; defaults to max(1, l // 4).
        sparse_num_summary_blocks: distinct c-wide summary sub-blocks across heads ("fixed").
        sparse_pattern_mode: "merged" (one head sees the union), "interleaved" (layer i uses part i % 2) or
            "heads" (head h uses part h % 2).
        position_interpolation: how `interpolate_pos_encoding=True` resamples the 2-D grid of position embeddings
            (sec. 3.2): "bicubic_antialias" (timm's `resample_abs_pos_embed`, the default) or "bicubic" (plain
            bicubic, as transformers' ViT). The converters set the one of their source.
    """

    model_type = "vit_plus"

    def __init__(
        self,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.0,
        attention_probs_dropout_prob: float = 0.0,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-6,
        image_size: int = 224,
        patch_size: int = 16,
        num_channels: int = 3,
        qkv_bias: bool = True,
        classifier_head: str = "linear",
        classifier_hidden_size: int | None = None,
        attention_type: str = "dense",
        sparse_stride: int | None = None,
        sparse_summary_size: int | None = None,
        sparse_num_summary_blocks: int = 1,
        sparse_pattern_mode: str = "merged",
        position_interpolation: str = "bicubic_antialias",
        **kwargs,
    ):
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.qkv_bias = qkv_bias
        self.classifier_head = classifier_head
        self.classifier_hidden_size = classifier_hidden_size
        self.attention_type = attention_type
        self.sparse_stride = sparse_stride
        self.sparse_summary_size = sparse_summary_size
        self.sparse_num_summary_blocks = sparse_num_summary_blocks
        self.sparse_pattern_mode = sparse_pattern_mode
        self.position_interpolation = position_interpolation
        super().__init__(**kwargs)
        self.validate_vit_plus()

    def validate_vit_plus(self) -> None:
        """Raise a `ValueError` naming the offending values if the fields do not describe a valid ViT."""
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            check_positive_int(name, getattr(self, name))
        for name in ("image_size", "patch_size", "num_channels"):
            check_positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads})."
            )
        if self.image_size % self.patch_size != 0:
            raise ValueError(
                f"`image_size` ({self.image_size}) must be divisible by `patch_size` ({self.patch_size}): "
                "the paper splits the image into non-overlapping patches."
            )
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"`hidden_act` {self.hidden_act!r} is not a known activation ({sorted(ACT2FN)}).")
        check_probability("hidden_dropout_prob", self.hidden_dropout_prob)
        check_probability("attention_probs_dropout_prob", self.attention_probs_dropout_prob)
        if self.classifier_head not in CLASSIFIER_HEADS:
            raise ValueError(f"`classifier_head` must be one of {CLASSIFIER_HEADS}, got {self.classifier_head!r}.")
        if self.classifier_hidden_size is not None:
            check_positive_int("classifier_hidden_size", self.classifier_hidden_size)
        if not isinstance(self.layer_norm_eps, (int, float)) or self.layer_norm_eps <= 0:
            raise ValueError(f"`layer_norm_eps` must be a positive number, got {self.layer_norm_eps!r}.")
        if self.attention_type not in ATTENTION_TYPES:
            raise ValueError(f"Unknown `attention_type` {self.attention_type!r}: expected one of {ATTENTION_TYPES}.")
        if self.position_interpolation not in POSITION_INTERPOLATIONS:
            raise ValueError(
                f"Unknown `position_interpolation` {self.position_interpolation!r}: expected one of "
                f"{POSITION_INTERPOLATIONS}."
            )
        check_mode(self.sparse_pattern_mode)
        pattern = self.sparse_pattern()  # validates stride and summary sizes (ValueErrors name them)
        if pattern is not None:
            if pattern.stride > self.num_patches + 1:
                raise ValueError(
                    f"`sparse_stride` ({pattern.stride}) is longer than the sequence of {self.num_patches + 1} tokens "
                    f"(image_size {self.image_size}, patch_size {self.patch_size})."
                )
            if self.sparse_pattern_mode == "heads" and self.num_attention_heads % pattern.num_parts:
                raise ValueError(
                    f"`sparse_pattern_mode`='heads' splits the heads between the {pattern.num_parts} parts of the "
                    f"pattern: `num_attention_heads` ({self.num_attention_heads}) must be divisible by it."
                )

    def sparse_pattern(self):
        """The bidirectional `SparsePattern` of `attention_type` (None for dense attention)."""
        if self.attention_type == "dense":
            return None
        stride = self.sparse_stride if self.sparse_stride is not None else self.image_size // self.patch_size
        summary = 0
        if self.attention_type == "fixed":
            summary = self.sparse_summary_size if self.sparse_summary_size is not None else max(1, stride // 4)
        return build_pattern(
            self.attention_type,
            stride,
            summary_size=summary,
            num_summary_blocks=self.sparse_num_summary_blocks,
            causal=False,
        )

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def preset_names(cls) -> list[str]:
        return [
            f"{size}-patch{patch}-{res}"
            for size in VIT_PLUS_SIZES
            for patch in VIT_PLUS_PATCH_SIZES
            for res in (224, 384)
        ]

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> ViTPlusConfig:
        """A config from the paper's table, e.g. `from_preset("base-patch16-224", num_labels=10)`.

        Names are `{tiny,small,base,large,huge}-patch{P}-{resolution}`; keyword arguments override fields.
        """
        match = _PRESET_RE.match(name)
        if match is None or match["size"] not in VIT_PLUS_SIZES:
            raise ValueError(
                f"Unknown ViT preset {name!r}: expected '<size>-patch<P>-<resolution>' with size in "
                f"{list(VIT_PLUS_SIZES)}, e.g. 'base-patch16-224'."
            )
        layers, hidden, mlp, heads = VIT_PLUS_SIZES[match["size"]]
        fields = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            intermediate_size=mlp,
            num_attention_heads=heads,
            patch_size=int(match["patch"]),
            image_size=int(match["res"]),
        )
        fields.update(kwargs)
        return cls(**fields)


__all__ = ["POSITION_INTERPOLATIONS", "ViTPlusConfig", "VIT_PLUS_SIZES"]
