"""The encoder-decoder Transformer (Vaswani et al. 2017): translation and other text-to-text tasks."""

from __future__ import annotations

from .record import CardSpec, Family

SEQ2SEQ = Family(
    id="seq2seq",
    help="the encoder-decoder Transformer (default data: numbers -> English words)",
    model_type="seq2seq_transformer",
    config="configuration_seq2seq_transformer:Seq2SeqTransformerConfig",
    models={
        "AutoModel": "modeling_seq2seq_transformer:Seq2SeqTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_seq2seq_transformer:Seq2SeqTransformerForConditionalGeneration",
    },
    head="AutoModelForSeq2SeqLM",
    card=CardSpec(
        template="seq2seq.md",
        pipeline_tag="translation",
        task_name="Translation",
        tags=("translation", "seq2seq", "transformer", "hf_vit_plus", "custom_code"),
        architecture=(
            "vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "activation_function",
            "max_position_embeddings",
            "normalize_before",
            "scale_embedding",
            "tie_word_embeddings",
            "dropout",
            "label_smoothing",
        ),  # fmt: skip
    ),
    task="hf_vit_plus.training.tasks.seq2seq:Seq2SeqTask",
    data="text",
    builtin_data="numbers -> English words",
    flags=(
        "source_column",
        "target_column",
        "max_source_length",
        "max_target_length",
        "vocab_size",
        "label_smoothing_factor",
        "source_lang",
        "target_lang",
        "max_tokens_per_batch",
    ),  # fmt: skip
    flag_help={
        "max_tokens_per_batch": "batches by a token budget per process instead of a number of pairs, as fairseq's "
        "--max-tokens: a batch of n pairs whose longest source or target has L tokens counts n x L (the padded "
        "batch); pairs of about one length batched together (sorted by length in pools); needs --max_steps",
        "config_name": "preset ('base' or 'big', the paper's) or config folder of a fresh model; default: a small "
        "2+2-layer model",
        "tokenizer_name": "saved tokenizer (folder or Hub id); default: the model's own, else a byte-level BPE "
        "trained on the data",
        "learning_rate": "peak learning rate of the paper's schedule (transformers' inverse_sqrt): the rate rises "
        "linearly to it over the warm-up, then decays with the inverse square root of the update",
        "warmup_ratio": "share of the updates spent warming up: the schedule peaks there",
    },
    # Section 5.3 of "Attention Is All You Need": Adam 0.9/0.98/1e-9, the warm-up schedule, label smoothing 0.1. The
    # paper's rate peaks at d_model^-0.5 x warm-up^-0.5 (4,000 warm-up updates of 100,000); a run of a few thousand
    # updates with a short warm-up peaks far higher and, depending on the seed and on the order of floating-point
    # sums (the thread count), escapes the loss plateau or never learns. The defaults keep the schedule's shape and
    # scale it to the run: warm-up a tenth of the updates, the peak a quarter of the paper's height for the built-in
    # task's run, gradients clipped (the option's default norm); docs: training defaults.
    training_defaults=dict(
        output_dir="outputs/seq2seq",
        learning_rate=1.25e-3,
        weight_decay=0.0,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        num_train_epochs=10.0,
        warmup_ratio=0.1,
        label_smoothing_factor=0.1,
    ),
    lr_scheduler="noam",
    export="encoder-decoder",
)
