"""Configuration of the Vision Transformer (Dosovitskiy et al., ICLR 2021, arXiv 2010.11929).

Field names follow transformers' `ViTConfig`; the presets are the paper's Table 1.
"""

from __future__ import annotations

import math
import re
from typing import Any

from transformers import PretrainedConfig

from .config_checks import (
    HIDDEN_SIZE_STYLE_ALIASES,
    FieldTypeError,
    FromDictChecksMixin,
    check_activation,
    check_bool,
    check_divisible,
    check_fields,
    check_init_std,
    check_int,
    check_non_negative_int,
    check_optional_positive_int,
    check_positive_int,
    check_positive_number,
    check_probability,
    check_str,
    check_transformers_kwargs,
    choice,
)
from .hub_mixin import HubConfigMixin
from .sparse_layouts import SparseFields, default_summary_size, pattern_from_config

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
# Masked patch prediction (sec. 4.6, appendix B.1.2): the mean colour of a patch, `mpp_num_bits` bits per channel.
MPP_MAX_BITS = 8


def _check_mpp_mask_ratio(name: str, value) -> None:
    check_probability(name, value)
    if value == 0:
        raise ValueError(f"`{name}` must be in (0, 1): the share of patches corrupted, got {value!r}.")


def _check_value_range(name: str, value) -> None:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        or not value[0] < value[1]
    ):
        raise FieldTypeError(f"`{name}` must be two finite numbers [low, high] with low < high, got {value!r}.")


# How `interpolate_pos_encoding=True` resamples the position embeddings: timm's antialiased bicubic (the default, as
# in 0.1) or transformers' plain bicubic. Each converter sets the one of its source, so converted models match it.
POSITION_INTERPOLATIONS = ("bicubic_antialias", "bicubic")

# The kind of each field, checked before anything else (config_checks.check_fields); relations come after.
FIELD_CHECKS = {
    **dict.fromkeys(
        (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "image_size",
            "patch_size",
            "num_channels",
            "sparse_num_summary_blocks",
        ),
        check_positive_int,
    ),  # fmt: skip
    "hidden_act": check_activation,
    "hidden_dropout_prob": check_probability,
    "attention_probs_dropout_prob": check_probability,
    "initializer_range": check_init_std,
    "layer_norm_eps": check_positive_number,
    "qkv_bias": check_bool,
    "classifier_head": choice(CLASSIFIER_HEADS),
    "classifier_hidden_size": check_optional_positive_int,
    "encoder_stride": check_optional_positive_int,
    "attention_type": check_str,
    "sparse_stride": check_optional_positive_int,
    "sparse_summary_size": lambda name, value: value is None or check_non_negative_int(name, value),
    "sparse_pattern_mode": check_str,
    "position_interpolation": choice(POSITION_INTERPOLATIONS),
    "drop_path_rate": check_probability,
    "use_distillation_token": check_bool,
    "mpp_mask_ratio": _check_mpp_mask_ratio,
    "mpp_num_bits": lambda name, value: check_int(name, value, minimum=1, maximum=MPP_MAX_BITS),
    "mpp_value_range": _check_value_range,
    "conv_stem_layers": check_non_negative_int,
    "conv_stem_channels": check_positive_int,
}


def check_encoder_stride(config) -> None:
    """A `ValueError` where `encoder_stride` is not `patch_size`: the patch embedding (linear or a convolutional stem)
    shrinks the image by the patch size, and masked image modeling masks whole patches (transformers' `run_mim.py`
    sets both fields, with `config.update`, after the config is made: `ViTPlusForMaskedImageModeling` checks)."""
    if config.encoder_stride != config.patch_size:
        raise ValueError(
            f"`encoder_stride`={config.encoder_stride} must equal `patch_size`={config.patch_size}: the encoder "
            f"shrinks the image by the patch size (pass encoder_stride={config.patch_size}, or leave it unset)."
        )


def conv_stem_grid(size: int, layers: int) -> int:
    """The side of the feature map after `layers` 3 x 3 convolutions of stride 2 and padding 1: ceil(size / 2) each."""
    for _ in range(layers):
        size = (size - 1) // 2 + 1
    return size


class ViTPlusConfig(HubConfigMixin, FromDictChecksMixin, PretrainedConfig):
    r"""Configuration of a [`ViTPlusModel`][hf_vit_plus.ViTPlusModel].

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
        encoder_stride: the factor by which the encoder shrinks the image, as transformers' masked image modeling reads
            it (`config.encoder_stride` of `ViTConfig`, used by its example scripts `run_mim.py`): the patch size for
            a plain ViT, here always `patch_size` (None, the default, resolves to it; masked image modeling refuses
            another value).
        classifier_head: "linear" (fine-tuning head of the paper) or "mlp_tanh" (the pre-training head: one hidden
            layer of `classifier_hidden_size` units with tanh).
        classifier_hidden_size: width of the tanh layer of the "mlp_tanh" head (defaults to `hidden_size`).
        attention_type: "dense" (the paper), or a sparse pattern registered in `sparse_layouts.py`
            (`ATTENTION_TYPES`; each class there says what it reads the fields below as), in its bidirectional form:
            for long patch sequences at high resolution. E.g. "strided" with `sparse_stride` = patches per row sees
            the previous/next row-length of tokens plus the token's column.
        sparse_stride: l, the pattern's length (stride, block length or window); None (the default) resolves to the
            number of patches per row (image_size // patch_size).
        sparse_summary_size: the pattern's second setting where it reads one; None (the default) resolves to the
            pattern's default (`sparse_layouts.default_summary_size`). Both are saved resolved, as numbers, and a value
            equal to its default is derived again when image_size, patch_size, attention_type (or, for the summary
            size, sparse_stride) change after the config is built; a value set apart from the default is kept, and
            refused by name where it cannot work with the new sizes.
        sparse_num_summary_blocks: distinct summary sub-blocks across heads (patterns that read it).
        sparse_pattern_mode: "merged" (one head sees the union of the parts), "interleaved" (layer i uses part
            i mod the number of parts) or "heads" (head h uses part h mod the number of parts).
        position_interpolation: how `interpolate_pos_encoding=True` resamples the 2-D grid of position embeddings
            (sec. 3.2): "bicubic_antialias" (timm's `resample_abs_pos_embed`, the default) or "bicubic" (plain
            bicubic, as transformers' ViT). The converters set the one of their source.
        drop_path_rate: stochastic depth (Huang et al. 2016, as DeiT and timm train ViTs): each residual branch of
            block i is dropped per example with probability `drop_path_rate * i / (L - 1)` (linear over depth, 0 for
            the first block) during training, and the kept ones are scaled by 1 / (1 - p). 0 (the default) adds
            nothing.
        use_distillation_token: DeiT's distillation token (Touvron et al. 2021): a second learnable token after the
            class token with its own linear head, trained on a teacher's predictions; inference averages the two
            heads' logits. False (the default) is the paper's ViT.
        mpp_mask_ratio: masked patch prediction (ViT paper, sec. 4.6 and appendix B.1.2): the share of patches
            corrupted per image (the paper: 50%).
        mpp_num_bits: the bits per channel of a patch's mean colour that masked patch prediction predicts: the paper's
            3 bits give 512 classes for RGB; a grey image has 2**3 = 8 intensity bins at the same depth.
        mpp_value_range: [low, high] of the pixel values the model receives, split into the colour bins (the image
            processor's default normalisation, mean 0.5 and std 0.5, maps 0..255 to [-1, 1]).
        conv_stem_layers: the paper's hybrid architecture (sec. 3.1: the patch embedding applied to a CNN's feature
            map, with patches of 1 x 1 on it), with the convolutional stem of Xiao et al. 2021 ("Early Convolutions
            Help Transformers See Better"): this many 3 x 3 convolutions of stride 2 (each with BatchNorm and ReLU,
            the channels doubling from `conv_stem_channels`), then a 1 x 1 projection to `hidden_size`. The stem must
            bring the image to the patch grid (image_size / patch_size per side: e.g. 3 layers for 28 x 28 images in
            7 x 7 patches, 4 for 224 in 16 x 16), so each token still stands for a P x P patch, now seen through
            overlapping receptive fields. 0 (the default) is the paper's linear embedding of raw patches.
        conv_stem_channels: the channels of the stem's first convolution (doubled by each next one).
    """

    model_type = "vit_plus"
    # Every Auto class of the family (HubConfigMixin: written into a saved config, with the code they need)
    remote_code_classes = {
        "AutoConfig": "configuration_vit_plus.ViTPlusConfig",
        "AutoModel": "modeling_vit_plus.ViTPlusModel",
        "AutoModelForImageClassification": "modeling_vit_plus.ViTPlusForImageClassification",
        "AutoModelForMaskedImageModeling": "modeling_vit_plus.ViTPlusForMaskedImageModeling",
    }
    # The sparse-attention fields as `sparse_layouts.pattern_from_config` reads them: bidirectional, and the stride
    # must fit the [CLS] token plus the patches.
    sparse_fields = SparseFields(causal=False, length_field="sequence_length")
    # The names other transformers configs give these fields (`n_embd`, `num_layers`, `layer_norm_epsilon`, ...)
    attribute_map = HIDDEN_SIZE_STYLE_ALIASES

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
        encoder_stride: int | None = None,
        classifier_head: str = "linear",
        classifier_hidden_size: int | None = None,
        attention_type: str = "dense",
        sparse_stride: int | None = None,
        sparse_summary_size: int | None = None,
        sparse_num_summary_blocks: int = 1,
        sparse_pattern_mode: str = "merged",
        position_interpolation: str = "bicubic_antialias",
        drop_path_rate: float = 0.0,
        use_distillation_token: bool = False,
        mpp_mask_ratio: float = 0.5,
        mpp_num_bits: int = 3,
        mpp_value_range: tuple[float, float] | list[float] = (-1.0, 1.0),
        conv_stem_layers: int = 0,
        conv_stem_channels: int = 32,
        **kwargs,
    ):
        check_fields(locals(), FIELD_CHECKS)
        check_transformers_kwargs(type(self), kwargs, locals(), FIELD_CHECKS)
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
        self.encoder_stride = patch_size if encoder_stride is None else encoder_stride
        self.classifier_head = classifier_head
        self.classifier_hidden_size = classifier_hidden_size
        self.attention_type = attention_type
        # Defaults that depend on the image geometry are resolved here (a config file of 0.1 holds null), and again
        # when the geometry changes (`__setattr__`).
        if sparse_stride is None:
            sparse_stride = _derived_stride(image_size, patch_size)
        if sparse_summary_size is None:
            sparse_summary_size = _derived_summary_size(attention_type, sparse_stride)
        self.sparse_stride = sparse_stride
        self.sparse_summary_size = sparse_summary_size
        self.sparse_num_summary_blocks = sparse_num_summary_blocks
        self.sparse_pattern_mode = sparse_pattern_mode
        self.position_interpolation = position_interpolation
        self.drop_path_rate = drop_path_rate
        self.use_distillation_token = use_distillation_token
        self.mpp_mask_ratio = mpp_mask_ratio
        self.mpp_num_bits = mpp_num_bits
        self.mpp_value_range = [float(v) for v in mpp_value_range]  # a list, as config.json gives it back
        self.conv_stem_layers = conv_stem_layers
        self.conv_stem_channels = conv_stem_channels
        super().__init__(**kwargs)
        self.validate_fields()

    def __setattr__(self, name: str, value: Any) -> None:
        # `encoder_stride` follows `patch_size` when that is set after the config is made (`config.update`, as
        # transformers' run_mim.py and --config_overrides do), unless it was set to another value
        fields = self.__dict__
        if name == "patch_size" and "encoder_stride" in fields and fields["encoder_stride"] == fields.get(name):
            super().__setattr__("encoder_stride", value)
        # A sparse field that holds the value its inputs derive (the default: a saved config holds it as a number)
        # is derived again when an input changes (`from_pretrained(..., image_size=...)`, `update`, --config_overrides
        # on a saved config); a value set apart from them is kept, and checked with the rest (`from_dict`).
        if name not in _SPARSE_INPUTS or "sparse_summary_size" not in self.__dict__:
            super().__setattr__(name, value)
            return
        stride_derived = name != "sparse_stride" and self.sparse_stride == _derived_stride(
            self.image_size, self.patch_size
        )
        summary_derived = self.sparse_summary_size == _derived_summary_size(self.attention_type, self.sparse_stride)
        super().__setattr__(name, value)
        if stride_derived:
            super().__setattr__("sparse_stride", _derived_stride(self.image_size, self.patch_size))
        if summary_derived:
            super().__setattr__("sparse_summary_size", _derived_summary_size(self.attention_type, self.sparse_stride))

    def validate_fields(self) -> None:
        """Raise a `ValueError` (`TypeError`) naming the offending values if the fields do not describe a valid
        ViT: each field's kind, then the relations between them."""
        check_fields(vars(self), FIELD_CHECKS)
        check_divisible("hidden_size", self.hidden_size, "num_attention_heads", self.num_attention_heads)
        check_divisible(
            "image_size", self.image_size, "patch_size", self.patch_size,
            why=": the paper splits the image into non-overlapping patches",
        )  # fmt: skip
        if self.conv_stem_layers:
            grid = self.image_size // self.patch_size
            reached = conv_stem_grid(self.image_size, self.conv_stem_layers)
            if reached != grid:
                fits = [n for n in range(1, 9) if conv_stem_grid(self.image_size, n) == grid]
                hint = f"conv_stem_layers={fits[0]} does" if fits else "no number of layers does: change patch_size"
                raise ValueError(
                    f"`conv_stem_layers`={self.conv_stem_layers} brings the {self.image_size} x {self.image_size} "
                    f"image to a {reached} x {reached} feature map, but image_size={self.image_size} in "
                    f"patch_size={self.patch_size} patches is a {grid} x {grid} grid ({hint})."
                )
        pattern_from_config(self)  # the sparse-attention fields
        if self.mpp_num_bits * self.num_channels > 24:
            raise ValueError(
                f"`mpp_num_bits` ({self.mpp_num_bits}) x `num_channels` ({self.num_channels}) must be at most 24: "
                f"masked patch prediction has 2**(bits x channels) colour classes."
            )

    @property
    def num_patches(self) -> int:
        """Patches per image at `image_size`: (image_size / patch_size)^2."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the [CLS] token, and DeiT's distillation token when there is one."""
        return 2 if self.use_distillation_token else 1

    @property
    def sequence_length(self) -> int:
        """Tokens per image at `image_size`: the [CLS] token (and the distillation token) and the patches."""
        return self.num_patches + self.num_prefix_tokens

    @property
    def mpp_num_classes(self) -> int:
        """The colour classes of masked patch prediction: 2**(mpp_num_bits x num_channels) (512 for 3-bit RGB)."""
        return 2 ** (self.mpp_num_bits * self.num_channels)

    @classmethod
    def preset_names(cls) -> list[str]:
        """The names `from_preset` accepts.

        Returns:
            `{size}-patch{P}-{resolution}` for every size, patch size and resolution (224, 384) of the table.
        """
        return [
            f"{size}-patch{patch}-{res}"
            for size in VIT_PLUS_SIZES
            for patch in VIT_PLUS_PATCH_SIZES
            for res in (224, 384)
        ]

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> ViTPlusConfig:
        """A config from the paper's table, e.g. `from_preset("base-patch16-224", num_labels=10)`.

        Args:
            name: `{tiny,small,base,large,huge}-patch{P}-{resolution}`.
            **kwargs: fields that override the preset's.

        Returns:
            The config.

        Raises:
            ValueError: an unknown preset name.
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


def _is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# The fields the sparse defaults are derived from (`ViTPlusConfig.__setattr__`).
_SPARSE_INPUTS = frozenset({"image_size", "patch_size", "attention_type", "sparse_stride"})


def _derived_stride(image_size, patch_size) -> int | None:
    """`sparse_stride`'s default: the patches per row; None for an image smaller than a patch (the check of
    image_size names the problem) or sizes that are not positive ints (their checks name them)."""
    if _is_positive_int(image_size) and _is_positive_int(patch_size):
        return image_size // patch_size or None
    return None


def _derived_summary_size(attention_type, sparse_stride) -> int | None:
    """`sparse_summary_size`'s default: the pattern's for the stride (`sparse_layouts.default_summary_size`)."""
    return default_summary_size(attention_type, sparse_stride) if _is_positive_int(sparse_stride) else None


__all__ = ["POSITION_INTERPOLATIONS", "conv_stem_grid", "ViTPlusConfig", "VIT_PLUS_SIZES"]
