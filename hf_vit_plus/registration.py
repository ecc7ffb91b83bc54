"""The one place that registers hf_vit_plus's classes with transformers' Auto classes.

Two registrations per class:
- `AutoX.register(Config, Cls)` so that `AutoX.from_pretrained(dir)` works when the package is installed;
- `Cls.register_for_auto_class(...)` so that `save_pretrained` copies the model folder's modules next to the
  weights; each family's models also write their whole `auto_map` (`remote_code_auto_map`, see HubMixin),
  so `trust_remote_code=True` works where the package is not installed.
"""

from __future__ import annotations

import transformers
from transformers import AutoConfig, AutoImageProcessor, AutoModelForCausalLM, AutoVideoProcessor

from .models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig
from .models.configuration_sparse_transformer import SparseTransformerConfig
from .models.configuration_vit_plus import ViTPlusConfig
from .models.image_processing_vit_plus import ViTPlusImageProcessor
from .models.modeling_seq2seq_transformer import (
    Seq2SeqTransformerForConditionalGeneration,
    Seq2SeqTransformerModel,
)
from .models.modeling_sparse_transformer import (
    SparseTransformerForCausalLM,
    SparseTransformerForImageGeneration,
    SparseTransformerModel,
)
from .models.modeling_vit_plus import ViTPlusForImageClassification, ViTPlusModel

_REGISTERED = False


def register_family(config_cls, models: dict[str, type]) -> None:
    """Register a config class and its models, `models` mapping an Auto class name to the model class."""
    AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
    config_cls.register_for_auto_class("AutoConfig")
    for auto_name, model_cls in models.items():
        getattr(transformers, auto_name).register(config_cls, model_cls, exist_ok=True)
        model_cls.register_for_auto_class(auto_name)


def register_auto_classes() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    # --- ViT
    register_family(
        ViTPlusConfig,
        {"AutoModel": ViTPlusModel, "AutoModelForImageClassification": ViTPlusForImageClassification},
    )
    AutoImageProcessor.register(
        ViTPlusConfig, image_processor_classes={"torchvision": ViTPlusImageProcessor}, exist_ok=True
    )
    ViTPlusImageProcessor.register_for_auto_class("AutoImageProcessor")
    # The pipeline also looks for a video processor: `AutoVideoProcessor` derives one from the image processor's
    # auto_map ("...ViTPlusVideoProcessor", which does not exist) and, finding no local one, asks "Do you wish to
    # run the custom code? [y/N]" even though the package is installed. Declaring locally that ViTPlus has no video
    # processor answers the lookup without remote code; the pipeline then simply goes on without one.
    AutoVideoProcessor.register(ViTPlusConfig, video_processor_classes={"torchvision": None}, exist_ok=True)
    # --- Seq2seq Transformer
    register_family(
        Seq2SeqTransformerConfig,
        {
            "AutoModel": Seq2SeqTransformerModel,
            "AutoModelForSeq2SeqLM": Seq2SeqTransformerForConditionalGeneration,
        },
    )
    # --- Sparse Transformer
    register_family(
        SparseTransformerConfig,
        {"AutoModel": SparseTransformerModel, "AutoModelForCausalLM": SparseTransformerForCausalLM},
    )
    # Text and image models share the config class: for `AutoModelForCausalLM` it maps to both heads, and
    # transformers picks the one the saved config's `architectures` names (the text LM by default).
    AutoModelForCausalLM.register(
        SparseTransformerConfig, (SparseTransformerForCausalLM, SparseTransformerForImageGeneration), exist_ok=True
    )
    SparseTransformerForImageGeneration.register_for_auto_class("AutoModelForCausalLM")
    _REGISTERED = True
