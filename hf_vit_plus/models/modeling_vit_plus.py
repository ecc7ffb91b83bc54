"""The Vision Transformer (Dosovitskiy et al., ICLR 2021, "An Image is Worth 16x16 Words", arXiv 2010.11929).

Read top to bottom: patch embedding (sec. 3.1, eq. 1) -> [class] token and learned 1-D positions -> L pre-norm
encoder blocks (eq. 2-3) -> final LayerNorm -> head on the class token (eq. 4). Parameter names follow
transformers' ViT so that checkpoints convert with a rename (see `hf_vit_plus.conversion`).

Additions from later work, all off by default (a default config computes exactly the paper's model): stochastic depth
(`drop_path_rate`), DeiT's distillation token and head (Touvron et al. 2021, `use_distillation_token`), and the
paper's own self-supervised objective, masked patch prediction (sec. 4.6: `ViTPlusForMaskedImageModeling`).

Optionally (`config.attention_type` "strided" or "fixed") the self-attention follows a bidirectional Sparse
Transformer pattern (Child et al. 2019; `sparse_layouts.py`); its kernels (`sparse_attention.py`) are loaded only
then. `attention.select_attention_kernel` says which kernel a layer runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import ImageClassifierOutput, ModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention import eager_attention_forward, select_attention_kernel
from .configuration_vit_plus import ViTPlusConfig, check_encoder_stride, conv_stem_grid
from .hub_mixin import HubMixin
from .input_checks import IGNORE_INDEX, label_tensor, tracing
from .layers import FeedForward, config_flag, rgb_to_grey, split_heads
from .positional import resample_patch_position_embeddings
from .sparse_layouts import pattern_from_config


@dataclass
class ViTPlusModelOutput(ModelOutput):
    """last_hidden_state: (B, N+1, D) after the final LayerNorm; pooler_output: (B, D), y = LN(z_L^0) (eq. 4)."""

    last_hidden_state: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class ViTPlusImageClassifierOutput(ImageClassifierOutput):
    """transformers' `ImageClassifierOutput` (loss, logits, hidden_states, attentions) and, for a model with DeiT's
    distillation token, the two heads' logits: `logits` is their mean (DeiT's inference), `cls_logits` the class
    token's head, `distillation_logits` the distillation token's. Both are None without a distillation token."""

    cls_logits: torch.FloatTensor | None = None
    distillation_logits: torch.FloatTensor | None = None


@dataclass
class ViTPlusMaskedPatchPredictionOutput(ModelOutput):
    """loss: cross-entropy of the corrupted patches' colour classes (None when no patch is corrupted and no labels are
    given); logits: (B, N, mpp_num_classes), one prediction per patch."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


def drop_path(hidden_states: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Stochastic depth on a residual branch (B, T, D): zero whole examples with probability `rate` during training,
    scale the rest by 1 / (1 - rate) (timm's `drop_path`)."""
    if rate == 0.0 or not training:
        return hidden_states
    keep = 1.0 - rate
    mask = hidden_states.new_empty((hidden_states.shape[0],) + (1,) * (hidden_states.dim() - 1)).bernoulli_(keep)
    return hidden_states * mask / keep


class DropPath(nn.Module):
    """`drop_path` as a module (nothing to learn); an `nn.Identity` stands in for rate 0."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return drop_path(hidden_states, self.rate, self.training)

    def extra_repr(self) -> str:
        return f"rate={self.rate:g}"


class ViTPlusPatchEmbeddings(nn.Module):
    """Split the image into P x P patches and project each to D dims: a conv with kernel = stride = P (eq. 1).

    With `config.conv_stem_layers` (the paper's hybrid, sec. 3.1, with Xiao et al. 2021's convolutional stem): 3 x 3
    convolutions of stride 2 with BatchNorm and ReLU bring the image to the patch grid, and `projection` is a 1 x 1
    conv on that feature map ("patches of spatial size 1 x 1")."""

    def __init__(self, config: ViTPlusConfig):
        super().__init__()
        self.image_size = config.image_size
        self.patch_size = config.patch_size
        self.num_channels = config.num_channels
        self.num_patches = config.num_patches
        self.stem_layers = getattr(config, "conv_stem_layers", 0)
        if self.stem_layers:
            layers: list[nn.Module] = []
            channels_in = config.num_channels
            for i in range(self.stem_layers):
                channels = config.conv_stem_channels * 2**i
                layers += [
                    nn.Conv2d(channels_in, channels, kernel_size=3, stride=2, padding=1, bias=False),
                    nn.BatchNorm2d(channels),
                    nn.ReLU(inplace=True),
                ]
                channels_in = channels
            self.stem = nn.Sequential(*layers)
            self.projection = nn.Conv2d(channels_in, config.hidden_size, kernel_size=1)
        else:
            self.stem = None
            self.projection = nn.Conv2d(
                config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
            )

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The (rows, columns) of tokens an image of height x width gives."""
        if self.stem is None:
            return height // self.patch_size, width // self.patch_size
        return conv_stem_grid(height, self.stem_layers), conv_stem_grid(width, self.stem_layers)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        _, channels, height, width = pixel_values.shape
        if channels == 3 and self.num_channels == 1:
            # RGB input to a grey model, e.g. from scripts that convert every image to RGB before normalising it
            # (transformers' image-classification examples): its luma, as the image processor's grey conversion.
            # Exact when the three channels were normalised alike (the 1-channel processor's single mean and std).
            pixel_values = rgb_to_grey(pixel_values)
        elif channels != self.num_channels:
            grey = " (or 3, converted to grey)" if self.num_channels == 1 else ""
            raise ValueError(
                f"`pixel_values` has {channels} channels but the model expects num_channels={self.num_channels}{grey}."
            )
        if interpolate_pos_encoding:
            if height % self.patch_size or width % self.patch_size:
                raise ValueError(
                    f"With interpolate_pos_encoding=True the image size ({height}x{width}) must be a multiple of "
                    f"patch_size={self.patch_size}."
                )
        elif (height, width) != (self.image_size, self.image_size):
            raise ValueError(
                f"Input image size ({height}x{width}) does not match the model ({self.image_size}x{self.image_size})."
                " Resize the image (the image processor does), or pass interpolate_pos_encoding=True to resample "
                "the position embeddings."
            )
        if self.stem is not None:
            pixel_values = self.stem(pixel_values)
        return self.projection(pixel_values).flatten(2).transpose(1, 2)  # (B, N, D)


class ViTPlusEmbeddings(nn.Module):
    """z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos (eq. 1); with DeiT's distillation token,
    [x_class; x_distil; x_p^1 E; ...] + E_pos. `use_mask_token` adds the [mask] embedding of masked patch prediction,
    which replaces the patches `bool_masked_pos` marks (before the positions are added)."""

    def __init__(self, config: ViTPlusConfig, use_mask_token: bool = False):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        # DeiT (Touvron et al. 2021, sec. 4): a second learnable token, read by its own head
        self.distillation_token = (
            nn.Parameter(torch.zeros(1, 1, config.hidden_size)) if config.use_distillation_token else None
        )
        self.mask_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size)) if use_mask_token else None
        self.num_prefix_tokens = config.num_prefix_tokens
        self.patch_embeddings = ViTPlusPatchEmbeddings(config)
        self.position_embeddings = nn.Parameter(
            torch.zeros(1, config.num_patches + self.num_prefix_tokens, config.hidden_size)
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.patch_size = config.patch_size
        self.grid_size = config.image_size // config.patch_size
        self.antialias = config.position_interpolation == "bicubic_antialias"

    def interpolate_pos_encoding(self, height: int, width: int) -> torch.Tensor:
        """Position embeddings for a (height x width) image: the patch grid resampled in 2-D (sec. 3.2), with
        the config's `position_interpolation`."""
        new_grid = self.patch_embeddings.grid(height, width)
        return resample_patch_position_embeddings(
            self.position_embeddings,
            old_grid=(self.grid_size, self.grid_size),
            new_grid=new_grid,
            num_prefix_tokens=self.num_prefix_tokens,
            antialias=self.antialias,
        )

    def forward(
        self,
        pixel_values: torch.Tensor,
        interpolate_pos_encoding: bool = False,
        bool_masked_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch_size, _, height, width = pixel_values.shape
        patches = self.patch_embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)  # (B, N, D)
        if bool_masked_pos is not None:
            if self.mask_token is None:
                raise ValueError(
                    "`bool_masked_pos` needs the [mask] embedding of masked patch prediction: use "
                    "ViTPlusForMaskedImageModeling (or ViTPlusModel(config, use_mask_token=True))."
                )
            if tuple(bool_masked_pos.shape) != tuple(patches.shape[:2]):
                raise ValueError(
                    f"`bool_masked_pos` must have shape (batch, patches) = {tuple(patches.shape[:2])}, got "
                    f"{tuple(bool_masked_pos.shape)}."
                )
            masked = bool_masked_pos.to(patches.dtype).unsqueeze(-1)  # (B, N, 1)
            patches = patches * (1.0 - masked) + self.mask_token.to(patches.dtype) * masked
        prefix = [self.cls_token.expand(batch_size, -1, -1)]  # (B, 1, D)
        if self.distillation_token is not None:
            prefix.append(self.distillation_token.expand(batch_size, -1, -1))
        embeddings = torch.cat((*prefix, patches), dim=1)  # (B, prefix + N, D)
        if interpolate_pos_encoding:
            embeddings = embeddings + self.interpolate_pos_encoding(height, width)
        else:
            embeddings = embeddings + self.position_embeddings
        return self.dropout(embeddings)


class ViTPlusAttention(nn.Module):
    """Multi-head self-attention (MSA); the kernel is chosen by `config._attn_implementation`."""

    def __init__(self, config: ViTPlusConfig, layer_idx: int = 0):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.is_causal = False  # an encoder: sdpa must not assume a causal mask
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)
        # The bidirectional Sparse Transformer pattern (None: dense); the sparse kernels read it from here.
        self.sparse_pattern = pattern_from_config(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        query_tokens: int | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention of `hidden_states` (B, T, D) -> (B, Tq, D) and the probabilities (or None); `query_tokens`:
        only the first Tq tokens ask (each over all T), None: all of them."""
        batch_size, seq_len, _ = hidden_states.shape
        queries = hidden_states if query_tokens is None else hidden_states[:, :query_tokens]
        query_length = queries.shape[1]
        query = split_heads(self.q_proj(queries), self.num_heads)  # (B, H, Tq, Dh)
        key = split_heads(self.k_proj(hidden_states), self.num_heads)  # (B, H, T, Dh)
        value = split_heads(self.v_proj(hidden_states), self.num_heads)  # (B, H, T, Dh)

        implementation = select_attention_kernel(
            self.config._attn_implementation,
            self.sparse_pattern,
            query.device.type,
            output_attentions,
            # chosen by the block's sequence (SHORT_CPU_SEQUENCE is measured per length), also where only the first
            # tokens ask: one query here is not a decoding step
            query_length=seq_len,
            key_length=seq_len,
            head_dim=query.shape[-1],
        )
        attention_fn = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        dropout = self.attention_dropout if self.training else 0.0
        attn_output, attn_weights = attention_fn(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs
        )
        attn_output = attn_output.reshape(batch_size, query_length, -1).contiguous()  # (B, Tq, H*Dh)
        return self.o_proj(attn_output), attn_weights


class ViTPlusLayer(GradientCheckpointingLayer):
    """One pre-norm encoder block: z' = MSA(LN(z)) + z (eq. 2), z = MLP(LN(z')) + z' (eq. 3)."""

    def __init__(self, config: ViTPlusConfig, layer_idx: int = 0):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = ViTPlusAttention(config, layer_idx=layer_idx)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = FeedForward(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        rate = drop_path_rate(config, layer_idx)
        self.drop_path = DropPath(rate) if rate > 0 else nn.Identity()

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        query_tokens: int | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T, D) -> (B, Tq, D): the block's output for the first `query_tokens` tokens (None: all T), which
        depends on every token's keys and values but on no other token's output."""
        residual = hidden_states if query_tokens is None else hidden_states[:, :query_tokens]
        hidden_states, attn_weights = self.attention(
            self.layernorm_before(hidden_states),
            attention_mask,
            output_attentions=output_attentions,
            query_tokens=query_tokens,
            **kwargs,
        )
        hidden_states = residual + self.drop_path(self.dropout(hidden_states))

        residual = hidden_states
        hidden_states = residual + self.drop_path(self.dropout(self.mlp(self.layernorm_after(hidden_states))))
        return hidden_states, attn_weights


def drop_path_rate(config: ViTPlusConfig, layer_idx: int) -> float:
    """Block `layer_idx`'s stochastic-depth rate: linear over depth from 0 (first block) to `drop_path_rate` (last), as
    timm's `torch.linspace(0, drop_path_rate, depth)`."""
    if config.num_hidden_layers == 1:
        return config.drop_path_rate
    return config.drop_path_rate * layer_idx / (config.num_hidden_layers - 1)


class ViTPlusPreTrainedModel(HubMixin, PreTrainedModel):
    """The base of the ViTPlus models: their config class, weight initialisation and supported attention kernels.

    Args:
        config: the model's `ViTPlusConfig`.
    """

    config_class = ViTPlusConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["ViTPlusEmbeddings", "ViTPlusLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # Trainer: the classification loss is a per-example mean and ignores num_items_in_batch.
    accepts_loss_kwargs = False

    # Written into every saved config (see HubMixin): each Auto class opens a checkpoint with trust_remote_code.
    remote_code_auto_map = ViTPlusConfig.remote_code_classes

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        # Every linear layer, the heads included, starts from the truncated normal (transformers' ViT, timm from
        # scratch). The paper's zero-initialised fine-tuning head (sec. 3.2) is not applied: a zero head passes no
        # gradient to the encoder until it grows, which slows training from scratch (the code before 0.3 never applied
        # it either: its zeros_ branch was never reached).
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):  # the hybrid's convolutional stem
            init.ones_(module.weight)
            init.zeros_(module.bias)
            init.zeros_(module.running_mean)
            init.ones_(module.running_var)
            init.zeros_(module.num_batches_tracked)
        elif isinstance(module, ViTPlusEmbeddings):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
            for token in (module.distillation_token, module.mask_token):
                if token is not None:
                    init.trunc_normal_(token, mean=0.0, std=std)


class ViTPlusModel(ViTPlusPreTrainedModel):
    """The bare encoder. `pooler_output` is the final-LayerNorm class token y = LN(z_L^0) (eq. 4).

    Args:
        config: the model's `ViTPlusConfig`.
        use_mask_token: add the learned [mask] embedding that `bool_masked_pos` puts in place of patches (masked
            patch prediction).
    """

    def __init__(self, config: ViTPlusConfig, use_mask_token: bool = False):
        super().__init__(config)
        self.embeddings = ViTPlusEmbeddings(config, use_mask_token=use_mask_token)
        self.layers = nn.ModuleList([ViTPlusLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The patch embedding (the projection E of eq. 1).

        Returns:
            The patch-embedding module.
        """
        return self.embeddings.patch_embeddings

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        bool_masked_pos: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        output_tokens: int | None = None,
        **kwargs,
    ) -> ViTPlusModelOutput | tuple:
        """Encode a batch of images (B, C, H, W): every token's last hidden state and the pooled class token.

        `output_tokens`: where only the first tokens' outputs are read (a head on the class and distillation tokens),
        how many; the last block then computes its queries, attention output and MLP for those tokens alone (its keys
        and values still for all), the same numbers for them at 1 / L of the encoder's work less, and
        `last_hidden_state` holds those tokens (B, output_tokens, D). Ignored (every token computed) where hidden
        states or attention probabilities are asked for, or the last block's attention is sparse.

        Raises a `ValueError` (or a `TypeError` for a wrong dtype) naming missing, misshapen or non-finite
        `pixel_values`.
        """
        if pixel_values is None:
            raise ValueError("`pixel_values` is required: a float tensor of shape (batch, channels, height, width).")
        if torch.is_tensor(pixel_values) and pixel_values.dim() != 4:
            raise ValueError(
                f"`pixel_values` must have shape (batch, channels, height, width), got {tuple(pixel_values.shape)}."
            )
        if not torch.is_tensor(pixel_values) or not pixel_values.is_floating_point():
            raise TypeError(
                f"`pixel_values` must be a floating-point tensor, got "
                f"{getattr(pixel_values, 'dtype', type(pixel_values).__name__)}; use the image processor."
            )
        if not tracing() and not bool(torch.isfinite(pixel_values).all()):
            raise ValueError("`pixel_values` holds NaN or infinite values: the image processor gives finite pixels.")
        if pixel_values.shape[0] == 0:
            raise ValueError(
                f"`pixel_values` is an empty batch: shape {tuple(pixel_values.shape)}; pass at least one image."
            )
        if 0 in pixel_values.shape[1:]:
            raise ValueError(
                f"`pixel_values` has an empty dimension: shape {tuple(pixel_values.shape)}; an image has at least one "
                "channel and one pixel in height and width."
            )
        if output_tokens is not None and (type(output_tokens) is not int or output_tokens < 1):
            raise ValueError(f"`output_tokens` must be a positive int or None, got {output_tokens!r}.")
        output_attentions = config_flag(output_attentions, self.config, "output_attentions")
        output_hidden_states = config_flag(output_hidden_states, self.config, "output_hidden_states")
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)

        expected_dtype = self.embeddings.patch_embeddings.projection.weight.dtype
        hidden_states = self.embeddings(
            pixel_values.to(expected_dtype), bool(interpolate_pos_encoding), bool_masked_pos
        )
        kwargs.pop("num_items_in_batch", None)
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        # the last block computes the first `output_tokens` tokens alone where nothing reads the others
        shortcut = (
            output_tokens is not None
            and output_tokens < hidden_states.shape[1]
            and not (output_attentions or output_hidden_states)
            and len(self.layers) > 0
            and self.layers[-1].attention.sparse_pattern is None
        )
        for i, layer in enumerate(self.layers):
            queries = output_tokens if shortcut and i == len(self.layers) - 1 else None
            hidden_states, attn_weights = layer(
                hidden_states, None, output_attentions=output_attentions, query_tokens=queries, **kwargs
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (attn_weights,)

        sequence_output = self.layernorm(hidden_states)
        output = ViTPlusModelOutput(
            last_hidden_state=sequence_output,
            pooler_output=sequence_output[:, 0],
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )
        return output if return_dict else output.to_tuple()


class ViTPlusForImageClassification(ViTPlusPreTrainedModel):
    """ViT with a head on the class token.

    The head is a linear layer (fine-tuning, default) or the paper's pre-training head, an MLP with one tanh hidden
    layer (`classifier_head="mlp_tanh"`).

    With DeiT's distillation token (`use_distillation_token=True`) a second linear head reads that token: `logits` is
    the mean of the two heads (DeiT's inference), and the loss is DeiT's hard-label distillation,
    (CE(class head, labels) + CE(distillation head, teacher_classes)) / 2, where `teacher_classes` are a
    teacher's predicted classes (the labels themselves when none are given). Without the token,
    `teacher_classes` train the class head alike (DeiT's "hard distillation" without a distillation token).

    Args:
        config: the model's `ViTPlusConfig` (`num_labels`, `classifier_head`, `use_distillation_token`).
    """

    def __init__(self, config: ViTPlusConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.vit = ViTPlusModel(config)
        if config.classifier_head == "mlp_tanh":
            hidden = config.classifier_hidden_size or config.hidden_size
            self.pre_logits = nn.Sequential(nn.Linear(config.hidden_size, hidden), nn.Tanh())
        else:
            hidden = config.hidden_size
            self.pre_logits = nn.Identity()
        self.classifier = nn.Linear(hidden, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.distillation_classifier = None
        if config.use_distillation_token:
            self.distillation_classifier = (
                nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
            )
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        teacher_classes: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ViTPlusImageClassifierOutput | tuple:
        """Class logits of a batch of images (B, C, H, W); with `labels`, the loss (see the class docstring).

        `teacher_classes` come with `labels`; alone they raise a `ValueError`.
        """
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)
        labels, teacher_classes = label_tensor("labels", labels), label_tensor("teacher_classes", teacher_classes)
        outputs = self.vit(
            pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            # the heads read the class (and distillation) token alone: the last block computes only those
            output_tokens=1 if self.distillation_classifier is None else 2,
            **kwargs,
        )
        logits = self.classifier(self.pre_logits(outputs.pooler_output))  # (B, num_labels)
        cls_logits = distillation_logits = None
        if self.distillation_classifier is not None:
            cls_logits = logits
            distillation_logits = self.distillation_classifier(outputs.last_hidden_state[:, 1])  # (B, num_labels)
            logits = (cls_logits + distillation_logits) / 2  # DeiT's inference: the mean of the two heads
        loss = None
        if labels is not None or teacher_classes is not None:
            if labels is None:
                raise ValueError("`teacher_classes` (a teacher's classes) come with `labels`: pass both.")
            teacher = labels if teacher_classes is None else teacher_classes
            if cls_logits is not None:
                loss = (self.compute_loss(cls_logits, labels) + self.compute_loss(distillation_logits, teacher)) / 2
            elif teacher_classes is not None:
                loss = (self.compute_loss(logits, labels) + self.compute_loss(logits, teacher)) / 2
            else:
                loss = self.compute_loss(logits, labels)
        output = ViTPlusImageClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cls_logits=cls_logits,
            distillation_logits=distillation_logits,
        )
        return output if return_dict else output.to_tuple()

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy for single-label, BCE for multi-label, MSE for regression (transformers' convention).

        `config.problem_type` chooses; when it is unset, one label means regression and integer labels single-label
        classification.

        Args:
            logits: (B, num_labels).
            labels: (B,) class indices (-100: ignored), (B, num_labels) multi-label targets, or (B,) regression
                targets.

        Returns:
            The scalar loss.

        Raises:
            ValueError: labels of the wrong shape, or a class index outside [0, num_labels).
        """
        labels = labels.to(logits.device)
        problem_type = self.config.problem_type
        if problem_type is None:
            if self.num_labels == 1:
                problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
                problem_type = "single_label_classification"
            else:
                problem_type = "multi_label_classification"
        if problem_type == "regression":
            return nn.functional.mse_loss(logits.squeeze(-1), labels.to(logits.dtype).view(-1))
        if problem_type == "multi_label_classification":
            if labels.shape != logits.shape:
                raise ValueError(
                    f"Multi-label `labels` must have shape {tuple(logits.shape)}, got {tuple(labels.shape)}."
                )
            return nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
        labels = labels.view(-1).long()  # (B,); int32 / uint8 class indices are valid too
        if labels.shape[0] != logits.shape[0]:
            raise ValueError(f"Got {labels.shape[0]} labels for a batch of {logits.shape[0]} images.")
        bad = labels[((labels < 0) | (labels >= self.num_labels)) & (labels != IGNORE_INDEX)]
        if bad.numel():
            raise ValueError(
                f"Label {bad[0].item()} is outside [0, num_labels={self.num_labels}) (or {IGNORE_INDEX}, ignored): "
                "check the data set's labels against the model's id2label."
            )
        return nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)


# ------------------------------------------------------------------------------------ masked patch prediction
def patch_colour_classes(
    pixel_values: torch.Tensor, patch_size: int, num_bits: int, value_range, num_channels: int | None = None
) -> torch.Tensor:
    """The target of masked patch prediction (sec. 4.6, appendix B.1.2): each patch's mean colour, `num_bits` bits
    per channel, as one class id in [0, 2**(num_bits x channels)) (the first channel the most significant; 512
    classes for 3-bit RGB, 8 intensity bins for grey). `value_range` = [low, high] of the pixel values, split into
    2**num_bits equal bins. RGB input to a grey model (`num_channels=1`) is read as its luma, as the model reads it.

    (B, C, H, W) -> (B, N), N = (H / P) * (W / P) in raster order, the order of the patch tokens."""
    if num_channels == 1 and pixel_values.shape[1] == 3:
        pixel_values = rgb_to_grey(pixel_values)
    low, high = value_range
    levels = 2**num_bits
    means = nn.functional.avg_pool2d(pixel_values.float(), patch_size)  # (B, C, H/P, W/P)
    bins = ((means - low) / (high - low) * levels).floor().clamp(0, levels - 1).long()  # (B, C, h, w)
    weights = levels ** torch.arange(bins.shape[1] - 1, -1, -1, device=bins.device)  # (C,)
    return (bins * weights[:, None, None]).sum(1).flatten(1)  # (B, N)


def corrupt_patches(
    pixel_values: torch.Tensor, config: ViTPlusConfig, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """The inputs of one masked-patch-prediction step, as a data collator would make them.

    BERT's recipe on patches (sec. 4.6): `mpp_mask_ratio` of each image's patches are corrupted, and of those 80% are
    replaced by the [mask] embedding (`bool_masked_pos`), 10% by a random other patch (any patch of the batch; done
    here on the pixels, which the linear patch embedding maps to that patch's embedding) and 10% kept as they are.

    Args:
        pixel_values: (B, C, H, W) clean images, as the image processor gives them.
        config: the model's `ViTPlusConfig` (patch size and the `mpp_*` fields).
        generator: the source of the random draws (on the CPU); None: torch's global generator.

    Returns:
        `pixel_values` (corrupted), `bool_masked_pos` (B, N) and `labels` (B, N): the mean-colour class of each
        corrupted patch of the clean image (`patch_colour_classes`), -100 elsewhere. Use them as
        `ViTPlusForMaskedImageModeling(**inputs)`.
    """
    batch, channels, height, width = pixel_values.shape
    size = config.patch_size
    rows, cols = height // size, width // size
    num_patches = rows * cols
    labels = patch_colour_classes(
        pixel_values, size, config.mpp_num_bits, config.mpp_value_range, config.num_channels
    )  # (B, N)
    count = min(num_patches, max(1, round(config.mpp_mask_ratio * num_patches)))
    noise = torch.rand(batch, num_patches, generator=generator).to(pixel_values.device)
    chosen = noise.argsort(dim=1)[:, :count]  # (B, count): the corrupted patches of each image
    corrupted = torch.zeros(batch, num_patches, dtype=torch.bool, device=pixel_values.device)
    corrupted.scatter_(1, chosen, True)
    how = torch.rand(batch, num_patches, generator=generator).to(pixel_values.device)
    bool_masked_pos = corrupted & (how < 0.8)
    random_patch = corrupted & (how >= 0.8) & (how < 0.9)
    # patches as rows: (B, C, h, P, w, P) -> (B * N, C, P, P)
    patches = pixel_values[..., : rows * size, : cols * size].reshape(batch, channels, rows, size, cols, size)
    patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(batch * num_patches, channels, size, size)
    targets = random_patch.flatten().nonzero().squeeze(1)  # (M,)
    if targets.numel():
        sources = torch.randint(0, batch * num_patches - 1, (targets.numel(),), generator=generator)
        sources = sources.to(targets.device)
        sources = sources + (sources >= targets).long()  # another patch than itself
        patches = patches.clone()
        patches[targets] = patches[sources]
        corrupted_pixels = pixel_values.clone()
        corrupted_pixels[..., : rows * size, : cols * size] = (
            patches.reshape(batch, rows, cols, channels, size, size)
            .permute(0, 3, 1, 4, 2, 5)
            .reshape(batch, channels, rows * size, cols * size)
        )
        pixel_values = corrupted_pixels
    return {
        "pixel_values": pixel_values,
        "bool_masked_pos": bool_masked_pos,
        "labels": labels.masked_fill(~corrupted, IGNORE_INDEX),
    }


class ViTPlusForMaskedImageModeling(ViTPlusPreTrainedModel):
    """Masked patch prediction, the paper's self-supervised pre-training (sec. 4.6 and appendix B.1.2): the encoder
    reads images whose corrupted patches carry the [mask] embedding, a random other patch or themselves
    (`corrupt_patches` makes such inputs), and a linear head on every patch token predicts that patch's mean colour,
    3 bits per channel (512 classes for RGB; `mpp_num_bits`, `mpp_value_range`).

    The backbone is `self.vit`, as in `ViTPlusForImageClassification`: a saved checkpoint fine-tunes with
    `ViTPlusForImageClassification.from_pretrained(path, num_labels=...)`, which keeps the encoder and starts a new
    classifier (the [mask] embedding and `mpp_head` are left out), as transformers' `ViTForMaskedImageModeling`
    checkpoints load into `ViTForImageClassification`.

    The forward pass is deterministic: `bool_masked_pos` (B, N) marks the patches that get the [mask] embedding;
    `labels` (B, N) are the colour classes to predict, -100 for patches without a loss. Without `labels` the targets
    are the mean colours of `pixel_values` at the `bool_masked_pos` patches; with neither there is no loss.

    Args:
        config: the model's `ViTPlusConfig` (`mpp_num_bits`, `mpp_value_range`; no convolutional stem).

    Raises:
        ValueError: a config with a convolutional stem (`conv_stem_layers` > 0), whose overlapping receptive
            fields would let the tokens around a masked patch see its pixels, or an `encoder_stride` other than
            `patch_size`.
    """

    # The inputs the loss is computed from when a batch has no `labels` (see `SparseTransformerForImageGeneration`).
    loss_inputs = ("pixel_values", "bool_masked_pos")

    def __init__(self, config: ViTPlusConfig):
        if getattr(config, "conv_stem_layers", 0):
            raise ValueError(
                f"Masked patch prediction needs the linear patch embedding (conv_stem_layers=0), got "
                f"conv_stem_layers={config.conv_stem_layers}: the stem's overlapping receptive fields let the tokens "
                "around a masked patch see its pixels, so its colour would be copied, not predicted."
            )
        # masks are per patch: transformers' run_mim.py sets `encoder_stride` and `patch_size` after the config is made
        check_encoder_stride(config)
        super().__init__(config)
        self.vit = ViTPlusModel(config, use_mask_token=True)
        self.mpp_head = nn.Linear(config.hidden_size, config.mpp_num_classes)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        bool_masked_pos: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ViTPlusMaskedPatchPredictionOutput | tuple:
        """Colour-class logits of every patch (B, N, mpp_num_classes); with `labels` or `bool_masked_pos`, the loss."""
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)
        outputs = self.vit(
            pixel_values,
            bool_masked_pos=bool_masked_pos,
            interpolate_pos_encoding=interpolate_pos_encoding,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        patch_states = outputs.last_hidden_state[:, self.config.num_prefix_tokens :]  # (B, N, D)
        logits = self.mpp_head(patch_states)  # (B, N, classes)
        loss = None
        if labels is None and bool_masked_pos is not None:
            labels = patch_colour_classes(
                pixel_values, self.config.patch_size, self.config.mpp_num_bits, self.config.mpp_value_range,
                self.config.num_channels,
            ).masked_fill(~bool_masked_pos.bool(), IGNORE_INDEX)  # fmt: skip
        if labels is not None:
            loss = self.compute_loss(logits, labels)
        output = ViTPlusMaskedPatchPredictionOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy over the patches with a label (-100: none); NaN-free when no patch has one (0).

        Args:
            logits: (B, N, mpp_num_classes).
            labels: (B, N) integer colour classes, -100 for patches without a loss.

        Returns:
            The mean loss over the labelled patches.

        Raises:
            ValueError: labels of the wrong shape or dtype, or a class outside [0, mpp_num_classes).
        """
        if labels.shape != logits.shape[:2]:
            raise ValueError(
                f"Masked patch prediction `labels` must have shape (batch, patches) = {tuple(logits.shape[:2])}, got "
                f"{tuple(labels.shape)}."
            )
        if labels.is_floating_point() or labels.dtype == torch.bool:
            raise ValueError(f"Masked patch prediction `labels` must be integer colour classes, got {labels.dtype}.")
        labels = labels.to(logits.device).long()
        classes = logits.shape[-1]
        if not tracing():
            bad = labels[((labels < 0) | (labels >= classes)) & (labels != IGNORE_INDEX)]
            if bad.numel():
                raise ValueError(
                    f"Masked patch prediction label {bad[0].item()} is outside [0, mpp_num_classes={classes}) "
                    f"(or {IGNORE_INDEX}, no loss)."
                )
        losses = nn.functional.cross_entropy(
            logits.float().reshape(-1, classes), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return losses / (labels != IGNORE_INDEX).sum().clamp(min=1)


__all__ = [
    "ViTPlusForImageClassification",
    "ViTPlusForMaskedImageModeling",
    "ViTPlusImageClassifierOutput",
    "ViTPlusMaskedPatchPredictionOutput",
    "ViTPlusModel",
    "ViTPlusModelOutput",
    "ViTPlusPreTrainedModel",
]
