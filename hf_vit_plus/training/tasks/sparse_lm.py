"""How the Sparse Transformer trains as a language model: byte-level text (the Python standard library's sources
by default, a text file or a Hub data set) cut into blocks, perplexity and bits per token."""

from __future__ import annotations

import math

import torch
from datasets import Dataset, DatasetDict

from ..learning import LearningMetric, unigram_bits
from .base import (
    TrainingData,
    TrainingTask,
    builtin_data,
    limit_samples,
    load_user_data,
    saved_tokenizer,
    select_columns,
    user_data_record,
)

# A fresh Sparse Transformer for byte-level text: 4 blocks of width 128, strided pattern of stride 16.
SMALL_SPARSE_LM_CONFIG = dict(
    hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512, attention_type="strided",
    sparse_stride=16, max_position_embeddings=1024,
)  # fmt: skip
STDLIB_TRAIN_BYTES = 2_000_000
STDLIB_HELDOUT_BYTES = 100_000
# What the model card says of the built-in text.
STDLIB_DESCRIPTION = (
    "the Python standard library's own `.py` sources, read from the interpreter that trained the model "
    "(`hf_vit_plus.data.text.load_stdlib_text`): bytes as tokens, files in sorted order, each file held out or not by "
    "a hash of its path (a tenth held out), up to {train:,} training and {heldout:,} held-out bytes (the evaluation "
    "split), cut into windows of the block size. Not on the Hub."
)


class SparseLMTask(TrainingTask):
    name = "sparse-lm"
    learning_metric = LearningMetric("bits_per_token", "unigram_bits_per_token", False, "a unigram model")

    def measure_baselines(self, data, datasets):
        train, validation = (datasets[split].with_format("numpy")[:]["input_ids"] for split in ("train", "validation"))
        vocab = int(max(train.max(), validation.max())) + 1
        return {"unigram_bits_per_token": unigram_bits([train], [validation], vocab)}

    def load_data(self, options):
        if builtin_data(options):
            from ...data.text import load_stdlib_text, sequential_windows

            text = load_stdlib_text(max_train_bytes=STDLIB_TRAIN_BYTES, max_heldout_bytes=STDLIB_HELDOUT_BYTES)
            # Byte ids already: non-overlapping windows of block_size, shuffled by the sampler each epoch.
            windows = {
                split: Dataset.from_dict({"input_ids": sequential_windows(text[key], options.block_size).tolist()})
                for split, key in (("train", "train"), ("validation", "heldout"))
            }
            about = STDLIB_DESCRIPTION.format(train=STDLIB_TRAIN_BYTES, heldout=STDLIB_HELDOUT_BYTES)
            return TrainingData(limit_samples(DatasetDict(windows), options), "python-stdlib-bytes", description=about)
        raw, _ = select_columns(
            load_user_data(options), text=(options.text_column, ("text", "content"), "--text_column")
        )
        record = user_data_record(options, options.train_file)
        # tokenised, concatenated and cut into blocks here, so that the plan knows the run's examples: the tokenizer
        # is the one `build` gives the model (--tokenizer_name or --model_name_or_path's, else the byte tokenizer)
        blocks = group_in_blocks(raw, self.tokenizer(options.tokenizer_name or options.model_name_or_path),
                                 options.block_size)  # fmt: skip
        return TrainingData(limit_samples(blocks, options), record.pop("name"), **record)

    def tokenizer(self, location: str | None):
        """The tokenizer saved in `location`, else the byte tokenizer."""
        from ...data.text import byte_tokenizer

        return saved_tokenizer(location) or byte_tokenizer()

    def preprocessing(self, plan, processor) -> str:
        options = plan.options
        name = type(processor).__name__ if processor is not None else "bytes"
        size = f", {len(processor):,} tokens" if processor is not None and hasattr(processor, "__len__") else ""
        return (
            f"The text is tokenized by the tokenizer saved with the model ({name}{size}) and cut into blocks of "
            f"{options.block_size} tokens, one training sequence each."
        )

    def build(self, plan, data):
        options = plan.options
        tokenizer = self.tokenizer(options.tokenizer_name or options.model_name_or_path)
        # The small default is sized for the tokenizer and --block_size; a saved model or config is taken as it is.
        defaults = dict(
            SMALL_SPARSE_LM_CONFIG,
            vocab_size=len(tokenizer),
            max_position_embeddings=options.block_size,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        model = self.load_or_create_model(options, self.build_config(options, defaults, {}))
        if options.block_size > model.config.max_position_embeddings:
            raise ValueError(
                f"--block_size {options.block_size} exceeds the model's max_position_embeddings "
                f"({model.config.max_position_embeddings})."
            )
        return model, tokenizer

    def transform(self, data, tokenizer, model, plan):
        return data.raw.with_format("torch")

    def collate_fn(self, tokenizer):
        def collate(examples):
            input_ids = torch.stack([torch.as_tensor(e["input_ids"]) for e in examples])
            return {"input_ids": input_ids, "labels": input_ids.clone()}

        return collate

    def eval_outputs(self, model, batch):
        logits = model(input_ids=batch["input_ids"]).logits.float()
        labels = batch["labels"][:, 1:]
        losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels, reduction="none")
        return {"nll_sum": losses.sum(-1), "tokens": torch.full_like(losses[:, 0], labels.shape[1])}

    def metrics(self, gathered):
        loss = gathered["nll_sum"].sum().item() / gathered["tokens"].sum().item()
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "bits_per_token": loss / math.log(2),
            "samples": len(gathered["tokens"]),
        }


def group_in_blocks(raw: DatasetDict, tokenizer, block: int) -> DatasetDict:
    """The "text" column of each split tokenised, concatenated and cut into blocks of `block` tokens (the last,
    shorter one dropped); a `ValueError` when a split is shorter than one block."""

    def group(examples):
        ids = [i for text in examples["text"] for i in tokenizer(text)["input_ids"]]
        usable = len(ids) // block * block
        return {"input_ids": [ids[i : i + block] for i in range(0, usable, block)]}

    blocks = raw.map(group, batched=True, remove_columns=["text"], desc="tokenizing and grouping")
    for split, rows in blocks.items():
        if len(rows) == 0:
            raise ValueError(f"The {split} text is shorter than one --block_size ({block} tokens).")
    return blocks
