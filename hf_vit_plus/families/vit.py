"""The Vision Transformer (Dosovitskiy et al. 2021): an image classifier."""

from __future__ import annotations

from ..models.configuration_vit_plus import ViTPlusConfig
from ..models.image_processing_vit_plus import ViTPlusImageProcessor, ViTPlusVideoProcessor
from ..models.modeling_vit_plus import ViTPlusForImageClassification, ViTPlusModel
from .record import CardSpec, Family

VIT = Family(
    id="vit",
    help="the Vision Transformer, an image classifier (default data: 8x8 digits)",
    config_class=ViTPlusConfig,
    model_classes={"AutoModel": ViTPlusModel, "AutoModelForImageClassification": ViTPlusForImageClassification},
    head="AutoModelForImageClassification",
    image_processor_class=ViTPlusImageProcessor,
    video_processor_class=ViTPlusVideoProcessor,
    card=CardSpec(
        template="vit.md",
        pipeline_tag="image-classification",
        task_name="Image Classification",
        tags=("vision", "image-classification", "vit", "hf_vit_plus", "custom_code"),
        architecture=(
            "image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "hidden_act", "layer_norm_eps", "qkv_bias", "classifier_head", "attention_type",
            "num_labels",
        ),  # fmt: skip
    ),
    trainer="hf_vit_plus.training.families.vit:ViTFamily",
    data="images",
    builtin_data="8x8 digits",
    flags=("ignore_mismatched_sizes", "image_column_name", "label_column_name"),
    flag_help={
        "config_name": "preset ({tiny,small,base,large,huge}-patch{14,16,32}-{224,384}, e.g. 'tiny-patch16-224') or "
        "config folder of a fresh model; default: a small config for the data",
    },
    # the demo's small digits model
    training_defaults=dict(
        output_dir="outputs/vit",
        learning_rate=2e-3,
        weight_decay=0.05,
        num_train_epochs=30.0,
        per_device_train_batch_size=64,
        warmup_ratio=0.1,
    ),
    export="image-classifier",
)
