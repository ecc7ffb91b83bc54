"""The Vision Transformer (Dosovitskiy et al., ICLR 2021, "An Image is Worth 16x16 Words", arXiv 2010.11929).

Read top to bottom: patch embedding (sec. 3.1, eq. 1) -> [class] token and learned 1-D positions -> L pre-norm
encoder blocks (eq. 2-3) -> final LayerNorm -> head on the class token (eq. 4). Parameter names follow
transformers' ViT so that checkpoints convert with a rename (see `hf_vit_plus.conversion`).

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
from .configuration_vit_plus import ViTPlusConfig
from .hub_mixin import HubMixin
from .input_checks import IGNORE_INDEX, tracing
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


class ViTPlusPatchEmbeddings(nn.Module):
    """Split the image into P x P patches and project each to D dims: a conv with kernel = stride = P."""

    def __init__(self, config: ViTPlusConfig):
        super().__init__()
        self.image_size = config.image_size
        self.patch_size = config.patch_size
        self.num_channels = config.num_channels
        self.num_patches = config.num_patches
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )

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
                f"`pixel_values` has {channels} channels but the model expects num_channels={self.num_channels}"
                f"{grey}."
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
        return self.projection(pixel_values).flatten(2).transpose(1, 2)  # (B, N, D)


class ViTPlusEmbeddings(nn.Module):
    """z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos (eq. 1)."""

    def __init__(self, config: ViTPlusConfig):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.patch_embeddings = ViTPlusPatchEmbeddings(config)
        self.position_embeddings = nn.Parameter(torch.zeros(1, config.num_patches + 1, config.hidden_size))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.patch_size = config.patch_size
        self.grid_size = config.image_size // config.patch_size
        self.antialias = config.position_interpolation == "bicubic_antialias"

    def interpolate_pos_encoding(self, height: int, width: int) -> torch.Tensor:
        """Position embeddings for a (height x width) image: the patch grid resampled in 2-D (sec. 3.2), with
        the config's `position_interpolation`."""
        new_grid = (height // self.patch_size, width // self.patch_size)
        return resample_patch_position_embeddings(
            self.position_embeddings,
            old_grid=(self.grid_size, self.grid_size),
            new_grid=new_grid,
            antialias=self.antialias,
        )

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        batch_size, _, height, width = pixel_values.shape
        patches = self.patch_embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)
        cls_tokens = self.cls_token.expand(batch_size, -1, -1)  # (B, 1, D)
        embeddings = torch.cat((cls_tokens, patches), dim=1)  # (B, N+1, D)
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
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_len, _ = hidden_states.shape
        query = split_heads(self.q_proj(hidden_states), self.num_heads)  # (B, H, T, Dh)
        key = split_heads(self.k_proj(hidden_states), self.num_heads)  # (B, H, T, Dh)
        value = split_heads(self.v_proj(hidden_states), self.num_heads)  # (B, H, T, Dh)

        implementation = select_attention_kernel(
            self.config._attn_implementation, self.sparse_pattern, query.device.type, output_attentions
        )
        attention_fn = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        dropout = self.attention_dropout if self.training else 0.0
        attn_output, attn_weights = attention_fn(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs
        )
        attn_output = attn_output.reshape(batch_size, seq_len, -1).contiguous()  # (B, T, H*Dh)
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

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        residual = hidden_states
        hidden_states, attn_weights = self.attention(
            self.layernorm_before(hidden_states), attention_mask, output_attentions=output_attentions, **kwargs
        )
        hidden_states = residual + self.dropout(hidden_states)

        residual = hidden_states
        hidden_states = residual + self.dropout(self.mlp(self.layernorm_after(hidden_states)))
        return hidden_states, attn_weights


class ViTPlusPreTrainedModel(HubMixin, PreTrainedModel):
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
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ViTPlusEmbeddings):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
        elif isinstance(module, ViTPlusForImageClassification) and isinstance(module.classifier, nn.Linear):
            # Sec. 3.2: fine-tuning attaches a zero-initialised D x K layer.
            init.zeros_(module.classifier.weight)
            init.zeros_(module.classifier.bias)


class ViTPlusModel(ViTPlusPreTrainedModel):
    """The bare encoder. `pooler_output` is the final-LayerNorm class token y = LN(z_L^0) (eq. 4)."""

    def __init__(self, config: ViTPlusConfig):
        super().__init__(config)
        self.embeddings = ViTPlusEmbeddings(config)
        self.layers = nn.ModuleList([ViTPlusLayer(config, layer_idx=i) for i in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ViTPlusModelOutput | tuple:
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
        output_attentions = config_flag(output_attentions, self.config, "output_attentions")
        output_hidden_states = config_flag(output_hidden_states, self.config, "output_hidden_states")
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)

        expected_dtype = self.embeddings.patch_embeddings.projection.weight.dtype
        hidden_states = self.embeddings(pixel_values.to(expected_dtype), bool(interpolate_pos_encoding))
        kwargs.pop("num_items_in_batch", None)
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            hidden_states, attn_weights = layer(hidden_states, None, output_attentions=output_attentions, **kwargs)
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
    """ViT with a head on the class token: a linear layer (fine-tuning, default) or the paper's pre-training
    head, an MLP with one tanh hidden layer (`classifier_head="mlp_tanh"`)."""

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
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ImageClassifierOutput | tuple:
        return_dict = config_flag(return_dict, self.config, "return_dict", default=True)
        outputs = self.vit(
            pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.pre_logits(outputs.pooler_output))  # (B, num_labels)
        loss = self.compute_loss(logits, labels) if labels is not None else None
        output = ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy for single-label, BCE for multi-label, MSE for regression (transformers' convention)."""
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


__all__ = [
    "ViTPlusForImageClassification",
    "ViTPlusModel",
    "ViTPlusModelOutput",
    "ViTPlusPreTrainedModel",
]
