"""The Sparse Transformer (Child et al. 2019) as a causal language model."""

from __future__ import annotations

from .record import CardSpec, Family

SPARSE_LM = Family(
    id="sparse-lm",
    help="the Sparse Transformer, a causal language model (default data: the Python standard library)",
    model_type="sparse_transformer",
    config="configuration_sparse_transformer:SparseTransformerConfig",
    models={
        "AutoModel": "modeling_sparse_transformer:SparseTransformerModel",
        "AutoModelForCausalLM": "modeling_sparse_transformer:SparseTransformerForCausalLM",
    },
    head="AutoModelForCausalLM",
    image_model=False,
    card=CardSpec(
        template="sparse-lm.md",
        pipeline_tag="text-generation",
        task_name="Text Generation",
        tags=("text-generation", "sparse-attention", "sparse-transformer", "hf_vit_plus", "custom_code"),
        architecture=(
            "vocab_size",
            "max_position_embeddings",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "hidden_act",
            "attention_type",
            "sparse_stride",
            "sparse_summary_size",
            "sparse_num_summary_blocks",
            "sparse_pattern_mode",
        ),  # fmt: skip
        aliases=("sparse_lm",),
    ),
    task="hf_vit_plus.training.tasks.sparse_lm:SparseLMTask",
    data="text",
    builtin_data="the Python standard library's sources",
    flags=("text_column", "block_size", "max_tokens_per_batch"),
    flag_help={
        "max_tokens_per_batch": "batches by a token budget per process instead of a number of blocks: as many "
        "blocks of --block_size tokens as it holds (blocks are never padded)",
        "config_name": "config folder or Hub id of a fresh model; default: a small 4-layer strided model",
        "tokenizer_name": "saved tokenizer (folder or Hub id); default: the model's own, else the byte tokenizer",
    },
    training_defaults=dict(
        output_dir="outputs/sparse-lm",
        learning_rate=1e-3,
        weight_decay=0.1,
        adam_beta2=0.95,
        num_train_epochs=1.0,
        per_device_train_batch_size=16,
        warmup_ratio=0.05,
    ),
    export="causal-lm",
)
