"""The Vision Transformer (Dosovitskiy et al. 2021): an image classifier ("vit"), and the same encoder pre-trained by
the paper's masked patch prediction (sec. 4.6; "vit-mpp"), which "vit" then fine-tunes (--model_name_or_path)."""

from __future__ import annotations

from .record import CardSpec, Family

# The classes the two records share ("module:Class" in hf_vit_plus.models).
CONFIG = "configuration_vit_plus:ViTPlusConfig"
MODEL = "modeling_vit_plus:ViTPlusModel"
IMAGE_PROCESSOR = "image_processing_vit_plus:ViTPlusImageProcessor"
VIDEO_PROCESSOR = "image_processing_vit_plus:ViTPlusVideoProcessor"

# The flags of the data-efficient recipe (DeiT, Touvron et al. 2021): `--recipe deit` sets them from the data
RECIPE_FLAGS = (
    "recipe", "auto_augment", "auto_augment_magnitude", "auto_augment_prob", "random_resized_crop_scale",
    "horizontal_flip", "random_erasing_prob", "mixup_alpha", "cutmix_alpha", "mixup_prob", "ema_decay",
)  # fmt: skip
# Masked patch prediction learns no classes: no Mixup/CutMix, random erasing, label smoothing or teacher
MPP_RECIPE_FLAGS = (
    "recipe", "auto_augment", "auto_augment_magnitude", "auto_augment_prob", "random_resized_crop_scale",
    "horizontal_flip", "ema_decay",
)  # fmt: skip

# The encoder's fields, in both ViT cards' architecture tables (the classifier's and masked patch prediction's).
ENCODER_CARD_FIELDS = (
    "image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "hidden_act", "layer_norm_eps", "qkv_bias", "attention_type", "drop_path_rate",
)  # fmt: skip

VIT = Family(
    id="vit",
    help="the Vision Transformer, an image classifier (default data: 8x8 digits)",
    model_type="vit_plus",
    config=CONFIG,
    models={"AutoModel": MODEL, "AutoModelForImageClassification": "modeling_vit_plus:ViTPlusForImageClassification"},
    head="AutoModelForImageClassification",
    image_processor=IMAGE_PROCESSOR,
    video_processor=VIDEO_PROCESSOR,
    card=CardSpec(
        template="vit.md",
        pipeline_tag="image-classification",
        task_name="Image Classification",
        tags=("vision", "image-classification", "vit", "hf_vit_plus", "custom_code"),
        architecture=(
            *ENCODER_CARD_FIELDS,
            "conv_stem_layers",
            "conv_stem_channels",
            "classifier_head",
            "use_distillation_token",
            "num_labels",
            # a CNN trained for comparison (train vit --model_type resnet): its own fields
            "embedding_size",
            "hidden_sizes",
            "depths",
            "layer_type",
        ),  # fmt: skip
        # the hybrid's stem (sec. 3.1), in the table only where the model has one
        architecture_when=(("conv_stem_layers", "conv_stem_layers"), ("conv_stem_channels", "conv_stem_layers")),
    ),
    task="hf_vit_plus.training.tasks.vit:ViTTask",
    data="images",
    builtin_data="8x8 digits",
    flags=(
        "ignore_mismatched_sizes",
        "image_column_name",
        "label_column_name",
        "label_smoothing_factor",
        "teacher",
        "model_type",
        *RECIPE_FLAGS,
    ),  # fmt: skip
    flag_help={
        "config_name": "preset ({tiny,small,base,large,huge}-patch{14,16,32}-{224,384}, e.g. 'tiny-patch16-224') or "
        "config folder of a fresh model; default: a small config for the data",
    },
    # the demo's small digits model; the learning rate, warm-up and label smoothing are the --recipe's
    # (`hf_vit_plus.training.recipes`), the weight decay the option's own
    training_defaults=dict(output_dir="outputs/vit", num_train_epochs=30.0, per_device_train_batch_size=64),
    export="image-classifier",
)

VIT_MPP = Family(
    id="vit-mpp",
    help="the Vision Transformer pre-trained by masked patch prediction (the ViT paper, sec. 4.6), to fine-tune "
    "with `train vit --model_name_or_path`",
    model_type="vit_plus",
    config=CONFIG,
    models={"AutoModel": MODEL, "AutoModelForMaskedImageModeling": "modeling_vit_plus:ViTPlusForMaskedImageModeling"},
    head="AutoModelForMaskedImageModeling",
    image_processor=IMAGE_PROCESSOR,
    video_processor=VIDEO_PROCESSOR,
    card=CardSpec(
        template="vit-mpp.md",
        pipeline_tag="image-feature-extraction",
        task_name="Masked Patch Prediction",
        tags=("vision", "image-feature-extraction", "vit", "masked-image-modeling", "hf_vit_plus", "custom_code"),
        architecture=(
            *ENCODER_CARD_FIELDS,
            "mpp_mask_ratio",
            "mpp_num_bits",
            "mpp_value_range",
        ),
    ),  # fmt: skip
    task="hf_vit_plus.training.tasks.vit:ViTMaskedPatchTask",
    data="images",
    builtin_data="8x8 digits",
    flags=("image_column_name", *MPP_RECIPE_FLAGS),
    flag_help={"config_name": "preset or config folder of a fresh model; default: a small config for the data"},
    training_defaults=dict(output_dir="outputs/vit-mpp", num_train_epochs=30.0, per_device_train_batch_size=64),
    export=None,
)
