"""How the Sparse Transformer trains as a language model: byte-level text (the Python standard library's sources
by default, a text file or a Hub data set) cut into blocks, perplexity and bits per token."""

from __future__ import annotations

import math

import numpy as np
import torch
from datasets import Dataset, DatasetDict

from ..learning import LearningMetric, unigram_bits
from .base import (
    TrainingData,
    TrainingTask,
    UnitBatches,
    builtin_data,
    limit_samples,
    load_user_data,
    saved_tokenizer,
    select_columns,
    stream_data,
    user_data_record,
)

# A fresh Sparse Transformer for byte-level text: 4 blocks of width 128, strided pattern of stride 16.
SMALL_SPARSE_LM_CONFIG = dict(
    hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512, attention_type="strided",
    sparse_stride=16, max_position_embeddings=1024,
)  # fmt: skip
# With --streaming: the texts tokenized, concatenated and cut into blocks together (the tokens left over from a group
# dropped, as transformers' run_clm groups 1,000 texts at a time)
STREAM_TEXTS_PER_UNIT = 1000
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
        column = dict(text=(options.text_column, ("text", "content"), "--text_column"))
        record = user_data_record(options, options.train_file or options.train_dir)
        tokenizer = self.tokenizer(options.tokenizer_name or options.model_name_or_path)
        if options.streaming:  # the evaluation texts and the sample in blocks; the stream's, unit by unit
            raw, stream, eval_from, _ = stream_data(options, **column)
            return TrainingData(group_in_blocks(raw, tokenizer, options.block_size), record.pop("name"), stream=stream,
                                eval_from=eval_from, **record)  # fmt: skip
        raw, _ = select_columns(load_user_data(options), **column)
        # tokenised, concatenated and cut into blocks here, so that the plan knows the run's examples: the tokenizer
        # is the one `build` gives the model (--tokenizer_name or --model_name_or_path's, else the byte tokenizer)
        blocks = group_in_blocks(raw, tokenizer, options.block_size)
        return TrainingData(limit_samples(blocks, options), record.pop("name"), **record)

    def tokenizer(self, location: str | None):
        """The tokenizer saved in `location`, else the byte tokenizer."""
        from ...data.text import byte_tokenizer

        return saved_tokenizer(location) or byte_tokenizer()

    def preprocessing(self, plan, processor) -> str:
        name = type(processor).__name__ if processor is not None else "bytes"
        size = f", {len(processor):,} tokens" if processor is not None and hasattr(processor, "__len__") else ""
        return (
            f"The text is tokenized by the tokenizer saved with the model ({name}{size}) and cut into blocks of "
            f"{plan.data_options.block_size} tokens, one training sequence each."
        )

    def build(self, plan, data):
        model_options, block_size = plan.model_options, plan.data_options.block_size
        tokenizer = self.tokenizer(model_options.tokenizer_name or model_options.model_name_or_path)
        # The small default is sized for the tokenizer and --block_size; a saved model or config is taken as it is.
        defaults = dict(
            SMALL_SPARSE_LM_CONFIG,
            vocab_size=len(tokenizer),
            max_position_embeddings=block_size,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        model = self.load_or_create_model(model_options, self.build_config(model_options, defaults, {}))
        if block_size > model.config.max_position_embeddings:
            raise ValueError(
                f"--block_size {block_size} exceeds the model's max_position_embeddings "
                f"({model.config.max_position_embeddings})."
            )
        return model, tokenizer

    def transform(self, data, tokenizer, model, plan):
        return data.raw.with_format("torch")

    def collate_fn(self, tokenizer):
        return collate_blocks

    def unit_batches(self, data, tokenizer, model, plan):
        """A stream: `STREAM_TEXTS_PER_UNIT` texts at a time tokenized and cut into blocks in the loader's workers,
        their blocks in a random order, in batches of the per-device batch (a token budget's blocks: the plan made it
        a number of blocks)."""
        if data.stream is None:
            return None
        make = BlockBatches(tokenizer, plan.data_options.block_size, plan.optimization.per_device_train_batch_size)
        return UnitBatches(make, STREAM_TEXTS_PER_UNIT, whole_batches=False)

    def token_counts(self, batch):
        """Blocks of text: every token is real (no padding)."""
        return batch["input_ids"].numel(), batch["input_ids"].numel()

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


def collate_blocks(examples: list[dict]) -> dict[str, torch.Tensor]:
    """Blocks of token ids -> a batch whose labels are its inputs (the model shifts them)."""
    input_ids = torch.stack([torch.as_tensor(e["input_ids"]) for e in examples])
    return {"input_ids": input_ids, "labels": input_ids.clone()}


def text_blocks(texts: list[str], tokenizer, block: int) -> list[list[int]]:
    """The texts tokenized, concatenated and cut into blocks of `block` tokens (the shorter rest dropped)."""
    ids = [i for text in texts for i in tokenizer(text)["input_ids"]]
    usable = len(ids) // block * block
    return [ids[i : i + block] for i in range(0, usable, block)]


class BlockBatches:
    """A unit of raw texts -> its batches, in the loader's worker: the texts in blocks (`text_blocks`), the blocks in
    a random order, in batches of `batch_size` blocks (the rest, fewer than a batch, dropped).

    Args:
        tokenizer: the run's tokenizer.
        block: tokens per block (--block_size).
        batch_size: blocks per batch.
    """

    def __init__(self, tokenizer, block: int, batch_size: int):
        self.tokenizer, self.block, self.batch_size = tokenizer, block, batch_size

    def __call__(self, columns: dict[str, list], rng: np.random.Generator) -> list[dict[str, torch.Tensor]]:
        blocks = text_blocks(columns["text"], self.tokenizer, self.block)
        order = rng.permutation(len(blocks)).tolist()
        size = self.batch_size
        return [
            collate_blocks([{"input_ids": blocks[i]} for i in order[start : start + size]])
            for start in range(0, len(order) - size + 1, size)
        ]


def group_in_blocks(raw: DatasetDict, tokenizer, block: int) -> DatasetDict:
    """The "text" column of each split tokenised, concatenated and cut into blocks of `block` tokens (the last,
    shorter one dropped); a `ValueError` when a split is shorter than one block."""

    def group(examples):
        return {"input_ids": text_blocks(examples["text"], tokenizer, block)}

    blocks = raw.map(group, batched=True, remove_columns=["text"], desc="tokenizing and grouping")
    for split, rows in blocks.items():
        if len(rows) == 0:
            raise ValueError(f"The {split} text is shorter than one --block_size ({block} tokens).")
    return blocks
