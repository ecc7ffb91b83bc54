"""How the encoder-decoder Transformer trains: source/target text pairs (the built-in numbers -> English words, a
text file or a Hub data set), a byte-level BPE trained on them, the paper's Adam and warm-up schedule, and token
accuracy plus greedy exact match."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from datasets import DatasetDict

from ..learning import LearningMetric, majority_accuracy, sequence_keys
from .base import (
    TrainingData,
    TrainingFamily,
    builtin_data,
    limit_samples,
    load_user_data,
    pad_sequences,
    saved_tokenizer,
    select_columns,
    weight_decay_groups,
)

# A fresh encoder-decoder for the built-in number -> words task (post-norm, as in the paper).
SMALL_SEQ2SEQ_CONFIG = dict(
    d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=256, decoder_ffn_dim=256, dropout=0.1, max_position_embeddings=256,
)  # fmt: skip


class Seq2SeqFamily(TrainingFamily):
    name = "seq2seq"
    trains_its_processor = True
    learning_metric = LearningMetric(
        "exact_match", "most_common_target_exact_match", True, "always answering the commonest training target"
    )

    def measure_baselines(self, data, datasets):
        targets = data.raw["train"]["target"]
        return {"most_common_target_exact_match": majority_accuracy(targets, data.raw["validation"]["target"])}

    def load_data(self, args):
        if builtin_data(args):
            from ...data.number_words import load_number_words_dataset

            words = load_number_words_dataset(max_number=9999, num_test=500, seed=0)
            raw, name = DatasetDict(train=words["train"], validation=words["test"]), "number-words"
        else:
            raw, name = load_user_data(args), args.dataset_name or Path(args.train_file).stem
        raw, _ = select_columns(
            raw,
            source=(args.source_column, ("source", "src", "input"), "--source_column"),
            target=(args.target_column, ("target", "tgt", "output"), "--target_column"),
        )
        return TrainingData(limit_samples(raw, args), name)

    def build(self, args, data):
        tokenizer = saved_tokenizer(args)
        if tokenizer is None:
            from ...tokenization import train_bpe_tokenizer

            texts = list(data.raw["train"]["source"]) + list(data.raw["train"]["target"])
            tokenizer = train_bpe_tokenizer(texts, vocab_size=args.vocab_size, split_digits=True)
        fields = dict(label_smoothing=args.label_smoothing_factor)
        if not args.model_name_or_path:  # a fresh model is sized for the tokenizer
            fields.update(
                vocab_size=len(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                decoder_start_token_id=tokenizer.bos_token_id,
            )
        model = self.load_or_create_model(args, self.build_config(args, SMALL_SEQ2SEQ_CONFIG, fields))
        if model.config.vocab_size < len(tokenizer):
            raise ValueError(
                f"The tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {model.config.vocab_size}."
            )
        return model, tokenizer

    def transform(self, data, tokenizer, model, args):
        def tokenize(examples):
            inputs = tokenizer(examples["source"], truncation=True, max_length=args.max_source_length)
            labels = tokenizer(text_target=examples["target"], truncation=True, max_length=args.max_target_length)
            return {"input_ids": inputs["input_ids"], "labels": labels["input_ids"]}

        return data.raw.with_transform(tokenize)

    def collate_fn(self, tokenizer):
        pad = tokenizer.pad_token_id

        def collate(examples):
            input_ids = pad_sequences([e["input_ids"] for e in examples], pad)
            return {
                "input_ids": input_ids,
                "attention_mask": (input_ids != pad).long(),
                "labels": pad_sequences([e["labels"] for e in examples], -100),
            }

        return collate

    def create_optimizer(self, model, args):
        from ..schedules import paper_adam

        # The paper's Adam (sec. 5.3); with the default learning rate 1.0 the schedule gives the absolute rate.
        return paper_adam(
            weight_decay_groups(model, args.weight_decay),
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
        )

    def eval_outputs(self, model, batch):
        from accelerate.utils import extract_model_from_parallel

        from ..sharding import is_sharded

        labels = batch["labels"]
        logits = model(**batch).logits.float()
        mask = labels != -100
        token_losses = (
            torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp_min(0), reduction="none") * mask
        )  # (B, T), no label smoothing: the true negative log-likelihood
        correct = (logits.argmax(-1) == labels) & mask
        # greedy decoding, compared with the reference token by token (exact match of the whole output)
        bare = extract_model_from_parallel(model)
        generated = bare.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            num_beams=1,
            do_sample=False,
            max_new_tokens=labels.shape[1] + 5,
            # a sharded model gathers its weights in every step: all processes step until the last one is done
            # (transformers detects FSDP modules of its own, not Accelerate's)
            synced_gpus=True if is_sharded(bare) else None,
        )[:, 1:]  # drop decoder_start_token_id
        pad = bare.config.pad_token_id
        reference = labels.masked_fill(~mask, pad)
        width = max(generated.shape[1], reference.shape[1])
        generated = torch.nn.functional.pad(generated, (0, width - generated.shape[1]), value=pad)
        reference = torch.nn.functional.pad(reference, (0, width - reference.shape[1]), value=pad)
        return {
            "nll_sum": token_losses.sum(-1),
            "tokens": mask.sum(-1),
            "correct": correct.sum(-1),
            "exact": (generated == reference).all(-1).long(),
            # whether the output depends on the input: distinct outputs against distinct references
            "output_key": sequence_keys(generated, pad).to(labels.device),
            "reference_key": sequence_keys(reference, pad).to(labels.device),
        }

    def metrics(self, gathered):
        tokens = gathered["tokens"].sum().item()
        loss = gathered["nll_sum"].sum().item() / tokens
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "token_accuracy": gathered["correct"].sum().item() / tokens,
            "exact_match": gathered["exact"].float().mean().item(),
            "output_variety": min(
                1.0, gathered["output_key"].unique().numel() / max(1, gathered["reference_key"].unique().numel())
            ),
            "samples": len(gathered["tokens"]),
        }
