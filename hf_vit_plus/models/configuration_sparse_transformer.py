"""Configuration of the Sparse Transformer (Child, Gray, Radford, Sutskever 2019, "Generating Long Sequences with
Sparse Transformers", arXiv 1904.10509).

Field names follow transformers' ViT/GPT configs; `attention_type` and the `sparse_*` fields describe the
factorised attention pattern (sec. 4.2-4.3 of the paper).
"""

from __future__ import annotations

import math

from transformers import PretrainedConfig

from .compat import CACHE_NAMES
from .config_checks import (
    HIDDEN_SIZE_STYLE_ALIASES,
    FromDictChecksMixin,
    check_activation,
    check_bool,
    check_divisible,
    check_fields,
    check_init_std,
    check_non_negative_int,
    check_optional_positive_int,
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

POSITION_EMBEDDING_TYPES = ("learned", "factorized")
PIXEL_LEVELS = 256  # an image model's tokens 0..255 are 8-bit intensities; its start token comes after them

# The kind of each field, checked before anything else (config_checks.check_fields); relations come after.
FIELD_CHECKS = {
    **dict.fromkeys(
        (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "sparse_stride",
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
    "use_cache": check_bool,
    "tie_word_embeddings": check_bool,
    "attention_type": check_str,
    "sparse_summary_size": check_non_negative_int,
    "sparse_pattern_mode": check_str,
    "position_embedding_type": choice(POSITION_EMBEDDING_TYPES),
    "num_channels": check_optional_positive_int,
}


class SparseTransformerConfig(HubConfigMixin, FromDictChecksMixin, PretrainedConfig):
    r"""Configuration of a [`SparseTransformerModel`][hf_vit_plus.SparseTransformerModel] /
    [`SparseTransformerForCausalLM`][hf_vit_plus.SparseTransformerForCausalLM].

    The defaults are the paper's enwik8 model (Table 2): 30 layers, 8 heads, width 512, the fixed pattern with
    stride 128 and c = 32 summary positions, a context of 12,288 bytes. The vocabulary is bytes as
    transformers' `ByT5Tokenizer(extra_ids=0)` numbers them (ids 0/1/2 = pad/eos/unk, byte b = b + 3), so any
    stock byte tokenizer can drive `generate()`; `</s>` doubles as the document separator and `bos_token_id`.

    Args:
        vocab_size: number of token ids (259 = 256 bytes + pad/eos/unk).
        hidden_size: width d of the residual stream.
        num_hidden_layers: N, the number of residual blocks (each attention + feed-forward).
        num_attention_heads: attention heads per block.
        intermediate_size: hidden width of the GELU feed-forward network.
        hidden_act: activation of the feed-forward network (the paper: GELU).
        hidden_dropout_prob: dropout at the end of each residual branch (sec. 5.4: dropout only at the end of each
            residual addition); nowhere else.
        attention_probs_dropout_prob: dropout on the attention probabilities (0 in the paper).
        initializer_range: std of the normal initialisation; the residual branches' output projections (`o_proj`,
            `fc2`) use `initializer_range / sqrt(2 * num_hidden_layers)` (sec. 5.2).
        layer_norm_eps: LayerNorm epsilon.
        max_position_embeddings: the longest sequence; longer inputs raise a `ValueError`.
        qkv_bias: bias in the query/key/value projections.
        attention_type: "dense" (full causal attention) or a sparse pattern registered in `sparse_layouts.py`
            (`ATTENTION_TYPES`; each class there says what it reads the fields below as): the paper's "strided"
            (sec. 4.3, fig. 3b: suits periodic data such as images and audio) and "fixed" (fig. 3c: suits text).
        sparse_stride: l, the pattern's length (stride, block length or window); the paper takes l close to sqrt(n).
        sparse_summary_size: the pattern's second setting where it reads one (the fixed pattern's c summary
            positions at the end of each block).
        sparse_num_summary_blocks: how many different summary sub-blocks the heads use (the fixed pattern: head h
            takes sub-block h mod this count, counted from the end of each block); 1 = one shared set of summary
            positions. The paper found several different ones better than one.
        sparse_pattern_mode: how the parts of the pattern combine across the network (sec. 5.1): "interleaved" (one
            part per residual block, alternating over depth), "merged" (one head attends to the union) or "heads"
            (each head attends to one part; `num_attention_heads` must be divisible by the number of parts).
        position_embedding_type: "learned" (one table of `max_position_embeddings` rows) or "factorized" (sec. 5.3:
            one learned table per axis of `factorized_shape`, summed, e.g. rows, columns, channels of an image).
        factorized_shape: the axes of a "factorized" position, outermost first; their product must equal
            `max_position_embeddings`. Position p has mixed-radix coordinates in this shape.
        image_size: [height, width] of the images of an image model (sec. 5.3 and 7.1 of the paper: pixels as tokens
            in raster order, channels interleaved), or None for a model of token sequences. An image model's tokens
            0..255 are the 8-bit intensities, `bos_token_id` (256 by default, see `for_images`) is the start token
            the sequence is shifted by, and `max_position_embeddings` is height x width x num_channels.
        num_channels: channels of an image model's images (1 grey, 3 RGB); None for a model of token sequences.
        pad_token_id / bos_token_id / eos_token_id: special token ids.
        use_cache: whether the model returns a key/value cache by default.
        tie_word_embeddings: share the token embedding with the output projection.
    """

    model_type = "sparse_transformer"
    # Every Auto class of the family (HubConfigMixin: written into a saved config, with the code they need); an image
    # config's causal-LM head is `SparseTransformerForImageGeneration` (`family_auto_map`).
    remote_code_classes = {
        "AutoConfig": "configuration_sparse_transformer.SparseTransformerConfig",
        "AutoModel": "modeling_sparse_transformer.SparseTransformerModel",
        "AutoModelForCausalLM": "modeling_sparse_transformer.SparseTransformerForCausalLM",
    }
    image_model_class = "SparseTransformerForImageGeneration"
    keys_to_ignore_at_inference = list(CACHE_NAMES)  # Trainer drops the cache from the predictions
    # The sparse-attention fields as `sparse_layouts.pattern_from_config` reads them: causal, the stride at most
    # `max_position_embeddings`.
    sparse_fields = SparseFields(causal=True)
    # The names other transformers configs give these fields (`n_embd`, `num_layers`, `layer_norm_epsilon`, GPT-2's
    # `n_positions`, ...)
    attribute_map = {**HIDDEN_SIZE_STYLE_ALIASES, "n_positions": "max_position_embeddings"}

    # The fields it shares with `ViTPlusConfig` carry the same (transformers' ViT) names in the same order
    # (tests/models/test_copies.py checks them).
    def __init__(
        self,
        vocab_size: int = 259,
        hidden_size: int = 512,
        num_hidden_layers: int = 30,
        num_attention_heads: int = 8,
        intermediate_size: int = 2048,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.0,
        attention_probs_dropout_prob: float = 0.0,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        max_position_embeddings: int = 12288,
        qkv_bias: bool = True,
        attention_type: str = "fixed",
        sparse_stride: int = 128,
        sparse_summary_size: int = 32,
        sparse_num_summary_blocks: int = 1,
        sparse_pattern_mode: str = "merged",
        position_embedding_type: str = "learned",
        factorized_shape: tuple[int, ...] | list[int] | None = None,
        image_size: tuple[int, int] | list[int] | None = None,
        num_channels: int | None = None,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | None = 1,
        use_cache: bool = True,
        tie_word_embeddings: bool = True,
        **kwargs,
    ):
        check_fields(locals(), FIELD_CHECKS)
        check_transformers_kwargs(type(self), kwargs, locals(), FIELD_CHECKS)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.qkv_bias = qkv_bias
        self.attention_type = attention_type
        self.sparse_stride = sparse_stride
        self.sparse_summary_size = sparse_summary_size
        self.sparse_num_summary_blocks = sparse_num_summary_blocks
        self.sparse_pattern_mode = sparse_pattern_mode
        self.position_embedding_type = position_embedding_type
        self.factorized_shape = list(factorized_shape) if factorized_shape is not None else None
        self.image_size = list(image_size) if isinstance(image_size, (list, tuple)) else image_size
        self.num_channels = num_channels
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.use_cache = use_cache
        self.tie_word_embeddings = tie_word_embeddings
        super().__init__(**kwargs)
        if not self.architectures:
            # Two heads share this config under AutoModelForCausalLM (the text and the image model): transformers
            # builds the one `architectures` names, and a fresh config named none (`from_config` raised TypeError).
            self.architectures = [self.causal_lm_class_name]
        self.validate_fields()

    def __setattr__(self, name: str, value) -> None:
        # An image model's fields that `for_images` derives from its size (the positions, the factorized shape, the
        # row stride and its summary) are derived again when image_size or num_channels change after the config is
        # built (`from_pretrained(..., image_size=[16, 16])`, `update`, --config_overrides on a saved config), each
        # where it holds its derived value; a value set apart is kept, and checked with the rest (`from_dict`).
        if name not in ("image_size", "num_channels") or "num_channels" not in self.__dict__:
            super().__setattr__(name, value)
            return
        before = _image_derived(self.image_size, self.num_channels)
        derived = [key for key, derived_value in before.items() if getattr(self, key) == derived_value]
        super().__setattr__(name, list(value) if name == "image_size" and isinstance(value, tuple) else value)
        after = _image_derived(self.image_size, self.num_channels)
        for key in derived:
            if key in after and (key != "factorized_shape" or self.position_embedding_type == "factorized"):
                super().__setattr__(key, after[key])

    def validate_fields(self) -> None:
        """Raise a `ValueError` naming the offending values if the fields do not describe a valid model."""
        check_fields(vars(self), FIELD_CHECKS)
        check_divisible("hidden_size", self.hidden_size, "num_attention_heads", self.num_attention_heads)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            check_token_id(name, getattr(self, name), self.vocab_size)
        pattern_from_config(self)  # the sparse-attention fields
        if self.position_embedding_type == "factorized":
            shape = self.factorized_shape
            if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in shape):
                raise ValueError(
                    "`position_embedding_type`='factorized' needs `factorized_shape`, a list of positive integers "
                    f"(e.g. [rows, cols, channels]), got {shape!r}."
                )
            if math.prod(shape) != self.max_position_embeddings:
                raise ValueError(
                    f"The product of `factorized_shape` {list(shape)} is {math.prod(shape)}, but "
                    f"`max_position_embeddings` is {self.max_position_embeddings}: they must be equal."
                )
        elif self.factorized_shape is not None:
            raise ValueError(
                f"`factorized_shape` {self.factorized_shape!r} is only used with `position_embedding_type`="
                f"'factorized', got {self.position_embedding_type!r}."
            )
        self._validate_image_fields()

    @property
    def causal_lm_class_name(self) -> str:
        """The class `AutoModelForCausalLM` builds from this config: the image model's for an image config."""
        if self.image_size is not None:
            return self.image_model_class
        return self.remote_code_classes["AutoModelForCausalLM"].split(".")[1]

    def family_auto_map(self) -> dict[str, str]:
        """The Auto classes of this config's model: `AutoModelForCausalLM` names the image model for an image config.

        Returns:
            {Auto class: "module.Class"}.
        """
        module = self.remote_code_classes["AutoModelForCausalLM"].split(".")[0]
        return {**self.remote_code_classes, "AutoModelForCausalLM": f"{module}.{self.causal_lm_class_name}"}

    @property
    def is_image_model(self) -> bool:
        """Whether the model generates images (its `image_size` is set)."""
        return self.image_size is not None

    @property
    def pixels_per_image(self) -> int:
        """Tokens per image: height x width x channels (the sequence length of an image model)."""
        height, width = self.image_size
        return height * width * self.num_channels

    def _validate_image_fields(self) -> None:
        if self.image_size is None:
            if self.num_channels is not None:
                raise ValueError(f"`num_channels` ({self.num_channels!r}) is set but `image_size` is None.")
            return
        size = self.image_size
        if (
            not isinstance(size, list)
            or len(size) != 2
            or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in size)
        ):
            raise ValueError(f"`image_size` must be [height, width], two positive integers, got {size!r}.")
        check_positive_int("num_channels", self.num_channels)
        if self.max_position_embeddings != self.pixels_per_image:
            raise ValueError(
                f"An image model's `max_position_embeddings` must be height x width x num_channels = "
                f"{size[0]} x {size[1]} x {self.num_channels} = {self.pixels_per_image}, got "
                f"{self.max_position_embeddings}."
            )
        if self.bos_token_id is None or self.bos_token_id < PIXEL_LEVELS:
            raise ValueError(
                f"An image model's `bos_token_id` is its start token and must not be a pixel value (0..255): expected "
                f"an id >= {PIXEL_LEVELS} below vocab_size={self.vocab_size}, got {self.bos_token_id!r}."
            )

    @classmethod
    def for_images(cls, height: int, width: int, num_channels: int = 1, **kwargs) -> SparseTransformerConfig:
        """The config of an image model (sec. 7.1 of the paper).

        256 intensity tokens plus a start token (id 256), one position per pixel and channel with row / column
        (/ channel) embeddings (sec. 5.3), and, for the sparse patterns, a stride of one image row (width x channels
        tokens: the strided pattern's band is the row so far, its other part the same column in every earlier row) with
        summaries of a quarter row (fixed).

        Args:
            height: image rows.
            width: image columns.
            num_channels: 1 (grey) or 3 (RGB).
            **kwargs: fields that override any of the above (e.g. hidden_size, num_hidden_layers, attention_type).

        Returns:
            The config.

        Raises:
            ValueError: a size that is not a positive integer.
        """
        for name, value in (("height", height), ("width", width), ("num_channels", num_channels)):
            check_positive_int(name, value)
        values = dict(
            vocab_size=PIXEL_LEVELS + 1,
            bos_token_id=PIXEL_LEVELS,
            pad_token_id=None,
            eos_token_id=None,
            position_embedding_type="factorized",
            attention_type="strided",
            **_image_derived([height, width], num_channels),
            tie_word_embeddings=False,
            image_size=[height, width],
            num_channels=num_channels,
        )
        values.update(kwargs)
        return cls(**values)


def _image_derived(image_size, num_channels) -> dict:
    """The fields an image model's size gives (`for_images`): one position per pixel and channel, the factorized
    shape of those positions, a stride of one image row and summaries of a quarter row; {} for a size that is not
    positive integers (its check names it)."""
    sizes = [*image_size, num_channels] if isinstance(image_size, (list, tuple)) else []
    if len(sizes) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes):
        return {}
    height, width, channels = sizes
    row = width * channels
    return dict(
        max_position_embeddings=height * row,
        factorized_shape=[height, width, channels] if channels > 1 else [height, width],
        sparse_stride=row,
        sparse_summary_size=max(1, row // 4),
    )


__all__ = ["PIXEL_LEVELS", "POSITION_EMBEDDING_TYPES", "SparseTransformerConfig"]
