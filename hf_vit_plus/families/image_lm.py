"""The Sparse Transformer as an image model (sec. 7.1 of Child et al. 2019): pixels in raster order, bits per dim."""

from __future__ import annotations

from ..data.images import IMAGE_DATASETS
from .record import CardSpec, Family

IMAGE_LM = Family(
    id="image-lm",
    help="the Sparse Transformer as an image model, pixels in raster order, scored in bits per dim "
    f"(--dataset {' or '.join(IMAGE_DATASETS)}, or your grey images)",
    model_type="sparse_transformer",
    config="configuration_sparse_transformer:SparseTransformerConfig",
    models={
        "AutoModel": "modeling_sparse_transformer:SparseTransformerModel",
        "AutoModelForCausalLM": "modeling_sparse_transformer:SparseTransformerForImageGeneration",
    },
    head="AutoModelForCausalLM",
    image_model=True,
    card=CardSpec(
        template="image-lm.md",
        pipeline_tag="unconditional-image-generation",
        task_name="Unconditional Image Generation",
        tags=(
            "unconditional-image-generation",
            "image-generation",
            "sparse-attention",
            "sparse-transformer",
            "hf_vit_plus",
            "custom_code",
        ),
        architecture=(
            "image_size",
            "num_channels",
            "vocab_size",
            "max_position_embeddings",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "hidden_act",
            "position_embedding_type",
            "factorized_shape",
            "attention_type",
            "sparse_stride",
            "sparse_summary_size",
            "sparse_num_summary_blocks",
            "sparse_pattern_mode",
        ),
    ),  # fmt: skip
    task="hf_vit_plus.training.tasks.image_lm:ImageLMTask",
    data="images",
    builtin_data="digits",
    datasets=IMAGE_DATASETS,
    flags=("image_column_name",),
    flag_help={
        "config_name": "config folder or Hub id of a fresh model (the image size, pixel vocabulary and a stride of "
        "one row are set from the data); default: a small 4-layer strided model",
        "num_train_epochs": "passes over the training images (unless --max_steps is given)",
    },
    # the epochs: the data set's own (`ImageDataset.default_epochs`)
    training_defaults=dict(
        output_dir="outputs/image-lm",
        dataset="digits",
        learning_rate=2e-3,
        weight_decay=0.01,
        adam_beta2=0.95,
        per_device_eval_batch_size=100,
        warmup_ratio=0.05,
    ),
    export="causal-lm",  # an image is a sequence of tokens: the causal LM's graph (input_ids, cache)
)
