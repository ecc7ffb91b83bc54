"""What differs between the four families inside the one training loop (`loop.py`).

A family holds no state: each step takes what it needs and returns values. The loop calls

    load_data(args)                        -> TrainingData: "train" / "validation" with the family's columns
    build(args, data)                      -> (model, processor): image processor or tokenizer
    transform(data, processor, model, args)-> the datasets the loaders read, processed on the fly
    collate_fn(processor)                  -> batches
    eval_outputs(model, batch), metrics(gathered)
    create_optimizer(model, args), create_scheduler(optimizer, args, total_steps, config)
    figures(model, processor, raw, output_dir)   for the model card

`load_data` may also return reference numbers measured on the evaluation split (`TrainingData.baselines`, e.g. the
image model's floors), which the loop writes beside the model's results.

Every family builds its model on one path (`build_config`, then `load_or_create_model`): the config of
--model_name_or_path, of a --config_name folder or preset, or the family's small default, with what the data fixes
(labels, vocabulary, special tokens) and then --config_overrides set on top.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import ClassLabel, Dataset, DatasetDict
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PretrainedConfig,
)

from ..data.images import IMAGE_DATASETS
from ..data.loading import check_labels, label_names, load_user_dataset, pick_column
from ..errors import UsageError, load_config
from ..models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig
from ..models.configuration_sparse_transformer import SparseTransformerConfig
from ..models.configuration_vit_plus import ViTPlusConfig
from ..models.image_processing_vit_plus import ViTPlusImageProcessor
from ..models.modeling_seq2seq_transformer import Seq2SeqTransformerForConditionalGeneration
from ..models.modeling_sparse_transformer import SparseTransformerForCausalLM, SparseTransformerForImageGeneration
from ..models.modeling_vit_plus import ViTPlusForImageClassification
from .args import TrainingArguments

# The demo's ViT for 8x8 digits: 2x2 patches (16 tokens + [CLS]), 4 blocks of width 64.
DIGITS_VIT_CONFIG = dict(
    image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    intermediate_size=128,
)  # fmt: skip
# A fresh ViT for user images when no --config_name is given: 32x32 RGB, 4x4 patches.
SMALL_VIT_CONFIG = dict(DIGITS_VIT_CONFIG, image_size=32, patch_size=4, num_channels=3, hidden_size=128)
# A fresh encoder-decoder for the built-in number -> words task (post-norm, as in the paper).
SMALL_SEQ2SEQ_CONFIG = dict(
    d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=256, decoder_ffn_dim=256, dropout=0.1, max_position_embeddings=256,
)  # fmt: skip
# A fresh Sparse Transformer for byte-level text: 4 blocks of width 128, strided pattern of stride 16.
SMALL_SPARSE_LM_CONFIG = dict(
    hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512, attention_type="strided",
    sparse_stride=16, max_position_embeddings=1024,
)  # fmt: skip
# A fresh image model, on top of what the images fix (`IMAGE_CONFIG_FIELDS`): 4 blocks of width 64, untied embeddings
# (as `SparseTransformerConfig.for_images`), the strided pattern (stride: one image row) with its two parts (the row
# so far, the column above) on separate heads: with "interleaved", the fastest pattern mode at 28x28 on CPU, and
# every layer still sees both parts.
SMALL_IMAGE_LM_CONFIG = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256, tie_word_embeddings=False,
    attention_type="strided", sparse_pattern_mode="heads",
)  # fmt: skip
# The config fields that the images fix (those `SparseTransformerConfig.for_images` sets from their size): set on a
# fresh model, checked against a saved one.
IMAGE_CONFIG_FIELDS = (
    "vocab_size", "bos_token_id", "pad_token_id", "eos_token_id", "max_position_embeddings",
    "position_embedding_type", "factorized_shape", "sparse_stride", "sparse_summary_size", "image_size",
    "num_channels",
)  # fmt: skip
# --dataset -> the name the model card gives the data (its Hub id where there is one)
STDLIB_TRAIN_BYTES = 2_000_000
STDLIB_HELDOUT_BYTES = 100_000


# ------------------------------------------------------------------------------------------------ config checks
def parse_overrides(text: str | None) -> dict[str, Any]:
    """'a=1,b=0.5,c=gelu,d=true' -> {"a": 1, "b": 0.5, "c": "gelu", "d": True}."""
    result: dict[str, Any] = {}
    if not text:
        return result
    for item in text.split(","):
        if "=" not in item:
            raise UsageError(f"--config_overrides expects 'name=value' items separated by commas, got {item!r}.")
        key, value = (part.strip() for part in item.split("=", 1))
        if not key:
            raise UsageError(f"--config_overrides: an item has no field name, got {item!r}.")
        lowered = value.lower()
        if lowered in ("true", "false"):
            result[key] = lowered == "true"
        elif lowered in ("none", "null"):
            result[key] = None
        else:
            for kind in (int, float):
                try:
                    result[key] = kind(value)
                    break
                except ValueError:
                    continue
            else:
                result[key] = value
    return result


def config_fields(config_class: type) -> set[str]:
    """The field names a config class accepts: its own `__init__` parameters (and those of the project classes
    it derives from), `PretrainedConfig`'s standard fields (`id2label`, `num_labels`, ...) and its `attribute_map`
    aliases (e.g. `hidden_size` for the encoder-decoder's `d_model`)."""
    names: set[str] = set()
    for cls in config_class.__mro__:
        if cls is PretrainedConfig or not issubclass(cls, PretrainedConfig):
            break
        if "__init__" in vars(cls):
            for name, parameter in inspect.signature(cls.__init__).parameters.items():
                if name != "self" and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                    names.add(name)
        if dataclasses.is_dataclass(cls) and cls is not PretrainedConfig:
            names.update(f.name for f in dataclasses.fields(cls))
    names.update(PretrainedConfig().to_dict())
    # settable properties of the base class, e.g. num_labels (it resizes id2label / label2id)
    names.update(name for name, value in vars(PretrainedConfig).items() if isinstance(value, property) and value.fset)
    names.update(getattr(config_class, "attribute_map", {}) or {})
    return {name for name in names if not name.startswith("_")} - {"model_type", "transformers_version"}


def check_config_overrides(config_class: type, overrides: dict[str, Any]) -> None:
    """Refuse the keys of `overrides` that are not fields of `config_class` (transformers configs would keep them
    silently), naming the closest valid field."""
    valid = config_fields(config_class)
    model_type = getattr(config_class, "model_type", None) or config_class.__name__
    for key in overrides:
        if key in valid:
            continue
        close = difflib.get_close_matches(key, sorted(valid), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"expected one of {sorted(valid)}."
        raise UsageError(f"Unknown config field {key!r} for {model_type}; {hint}")


@contextmanager
def config_value_errors(args: TrainingArguments) -> Iterator[None]:
    """Report a config that refuses its values (they come from --config_name / --config_overrides) as a
    `UsageError`; config constructors only validate, so their `ValueError`s are about the user's values."""
    try:
        yield
    except UsageError:
        raise
    except (ValueError, TypeError) as error:
        given = f" (--config_overrides {args.config_overrides!r})" if args.config_overrides else ""
        raise UsageError(f"Invalid model config{given}: {error}") from error


# --------------------------------------------------------------------------------------------------- optimisation
def weight_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two optimiser groups, decided by tensor rank (as in nanoGPT): matrices (rank >= 2) are decayed; biases,
    norm weights and other rank < 2 tensors are not."""
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_steps(args: TrainingArguments, total_steps: int) -> int:
    if args.warmup_steps is not None:
        return min(args.warmup_steps, total_steps)
    return int(math.ceil(args.warmup_ratio * total_steps))


# ---------------------------------------------------------------------------------------------------- the family
@dataclass(frozen=True)
class TrainingData:
    """The raw splits of a run, as `Family.load_data` returns them."""

    raw: DatasetDict  # "train" and "validation", with the family's column names
    name: str  # the data set's name in the model card
    label_column: str | None = None  # ViT: the user's label column, named when the model has another class count
    # reference numbers on the evaluation split that are not the model's (e.g. an image model's floors in bits/dim)
    baselines: dict[str, float] = dataclasses.field(default_factory=dict)
    eval_split: str = "validation"  # the data set's split that "validation" holds, as the model card names it


class Family:
    """The per-family pieces of the loop. Subclasses set the class attributes and implement the data and
    evaluation methods."""

    name: str = ""
    config_class: type  # the config of a fresh model
    model_class: type  # the model trained
    auto_model_class: type  # the Auto class that loads --model_name_or_path
    default_scheduler: str = "cosine"  # what --lr_scheduler_type auto means
    trains_its_processor: bool = False  # a tokenizer trained on the data (saved with each checkpoint)

    # --- model
    def is_preset(self, config_name: str) -> bool:
        """Whether --config_name names a preset of the family (else a config folder or Hub id)."""
        return hasattr(self.config_class, "from_preset") and not Path(config_name).is_dir()

    def config_class_for(self, args: TrainingArguments) -> type:
        """The class of the config `build_config` makes: that of --model_name_or_path or a --config_name folder,
        else the family's own (after checking that a --config_name preset exists)."""
        if args.model_name_or_path:
            return type(load_config(args.model_name_or_path, "--model_name_or_path"))
        if args.config_name and not self.is_preset(args.config_name):
            return type(load_config(args.config_name, "--config_name"))
        if args.config_name:
            try:
                self.config_class.from_preset(args.config_name)
            except ValueError as error:  # an unknown preset; the message lists the known ones
                raise UsageError(f"--config_name: {error}") from error
        return self.config_class

    def config_overrides(self, args: TrainingArguments) -> dict[str, Any]:
        """--config_overrides parsed and checked against the fields of the config `build_config` makes."""
        overrides = parse_overrides(args.config_overrides)
        if overrides:
            check_config_overrides(self.config_class_for(args), overrides)
        return overrides

    def build_config(self, args: TrainingArguments, defaults: dict, fields: dict) -> PretrainedConfig:
        """The model's config: that of --model_name_or_path, of a --config_name folder, Hub id or preset, or the
        family's `defaults`; then `fields` (what the data and the run fix) and --config_overrides on top."""
        values = {**fields, **self.config_overrides(args)}
        source = args.model_name_or_path or args.config_name
        with config_value_errors(args):
            if source and (args.model_name_or_path or not self.is_preset(source)):
                return AutoConfig.from_pretrained(source, **values)
            if source:
                return self.config_class.from_preset(source, **values)
            return self.config_class(**{**defaults, **values})

    def load_or_create_model(self, args: TrainingArguments, config: PretrainedConfig) -> torch.nn.Module:
        """The saved model of --model_name_or_path with `config`, or a fresh one."""
        if args.model_name_or_path:
            return self.auto_model_class.from_pretrained(
                args.model_name_or_path, config=config, ignore_mismatched_sizes=args.ignore_mismatched_sizes
            )
        return self.model_class(config)

    def build(self, args: TrainingArguments, data: TrainingData) -> tuple[torch.nn.Module, Any]:
        """Return the model and its processor (image processor or tokenizer)."""
        raise NotImplementedError

    # --- data
    def load_data(self, args: TrainingArguments) -> TrainingData:
        raise NotImplementedError

    def transform(self, data: TrainingData, processor, model, args: TrainingArguments) -> DatasetDict:
        raise NotImplementedError

    def collate_fn(self, processor) -> Callable[[list[dict]], dict]:
        raise NotImplementedError

    # --- evaluation
    def eval_outputs(self, model, batch: dict) -> dict[str, torch.Tensor]:
        """Per-example tensors (first dimension = batch) for `gather_for_metrics`."""
        raise NotImplementedError

    def metrics(self, gathered: dict[str, torch.Tensor]) -> dict[str, float]:
        raise NotImplementedError

    # --- optimisation
    def create_optimizer(self, model, args: TrainingArguments) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            weight_decay_groups(model, args.weight_decay),
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
        )

    def create_scheduler(self, optimizer, args: TrainingArguments, total_steps: int, model_config):
        from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

        from .schedules import get_noam_schedule, get_warmup_cosine_schedule

        kind = self.default_scheduler if args.lr_scheduler_type == "auto" else args.lr_scheduler_type
        warmup = warmup_steps(args, total_steps)
        if kind == "cosine":
            return get_warmup_cosine_schedule(optimizer, warmup, total_steps)
        if kind == "linear":
            return get_linear_schedule_with_warmup(optimizer, warmup, total_steps)
        if kind == "constant":
            return get_constant_schedule_with_warmup(optimizer, warmup)
        if kind == "noam":
            d_model = getattr(model_config, "d_model", None) or model_config.hidden_size
            return get_noam_schedule(optimizer, d_model=d_model, warmup_steps=max(1, warmup))
        raise ValueError(f"Unknown --lr_scheduler_type {kind!r}.")

    # --- card extras
    def figures(self, model, processor, raw: DatasetDict, output_dir: Path) -> list[Path]:
        """The sparse attention pattern the model uses (the Sparse Transformer paper's Fig. 3), when it has one."""
        from ..models.sparse_layouts import pattern_from_config as sparse_pattern

        if sparse_pattern(model.config) is None:  # dense attention
            return []
        from ..interpret import pattern_from_config, plot_sparse_patterns

        return [plot_sparse_patterns([pattern_from_config(model.config)], output_dir / "sparse_attention_pattern.png")]


# ----------------------------------------------------------------------------------------------------------- ViT
class ViTFamily(Family):
    name = "vit"
    config_class = ViTPlusConfig
    model_class = ViTPlusForImageClassification
    auto_model_class = AutoModelForImageClassification

    def load_data(self, args):
        if builtin_data(args):
            from ..data.digits import load_digits_dataset

            digits = load_digits_dataset(seed=0)
            raw, name = DatasetDict(train=digits["train"], validation=digits["test"]), "sklearn-digits"
        else:
            raw, name = load_user_data(args), args.dataset_name or Path(args.train_dir).name
        raw, chosen = select_columns(
            raw,
            image=(args.image_column_name, ("image", "img", "picture"), "--image_column_name"),
            label=(args.label_column_name, ("label", "labels", "fine_label"), "--label_column_name"),
        )
        if not isinstance(raw["train"].features["label"], ClassLabel):
            raw = raw.cast_column("label", ClassLabel(names=label_names(raw, "label")))
        return TrainingData(limit_samples(raw, args), name, label_column=chosen["label"])

    def build(self, args, data):
        names = data.raw["train"].features["label"].names
        labels = dict(
            num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)}
        )
        if args.model_name_or_path and not args.ignore_mismatched_sizes:
            saved = load_config(args.model_name_or_path, "--model_name_or_path")
            check_labels(names, saved.num_labels, model=args.model_name_or_path, label_column=data.label_column)
        defaults = DIGITS_VIT_CONFIG if builtin_data(args) else SMALL_VIT_CONFIG
        model = self.load_or_create_model(args, self.build_config(args, defaults, labels))
        return model, self.image_processor(args, model.config)

    def image_processor(self, args, config) -> ViTPlusImageProcessor:
        """The saved model's processor, else one made from the model's config."""
        if args.model_name_or_path:
            try:
                return AutoImageProcessor.from_pretrained(args.model_name_or_path)
            except OSError:
                pass
        return ViTPlusImageProcessor.from_model_config(config)

    def transform(self, data, processor, model, args):
        mode = "L" if model.config.num_channels == 1 else "RGB"

        def to_pixels(examples):
            images = [image.convert(mode) for image in examples["image"]]
            pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
            return {"pixel_values": pixel_values, "labels": torch.tensor(examples["label"], dtype=torch.long)}

        return data.raw.with_transform(to_pixels)

    def collate_fn(self, processor):
        return collate_images

    def eval_outputs(self, model, batch):
        logits = model(pixel_values=batch["pixel_values"]).logits.float()
        losses = torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="none")
        return {"loss": losses, "predictions": logits.argmax(-1), "labels": batch["labels"]}

    def metrics(self, gathered):
        correct = (gathered["predictions"] == gathered["labels"]).float()
        return {"accuracy": correct.mean().item(), "loss": gathered["loss"].mean().item(), "samples": len(correct)}

    def figures(self, model, processor, raw, output_dir):
        from ..interpret import write_vit_figures

        mode = "L" if model.config.num_channels == 1 else "RGB"
        images = [raw["validation"][i]["image"].convert(mode) for i in range(min(32, len(raw["validation"])))]
        return list(write_vit_figures(model, images, output_dir, processor=processor, max_images=4))


# --------------------------------------------------------------------------------------------------- seq2seq
class Seq2SeqFamily(Family):
    name = "seq2seq"
    config_class = Seq2SeqTransformerConfig
    model_class = Seq2SeqTransformerForConditionalGeneration
    auto_model_class = AutoModelForSeq2SeqLM
    default_scheduler = "noam"
    trains_its_processor = True

    def load_data(self, args):
        if builtin_data(args):
            from ..data.number_words import load_number_words_dataset

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
            from ..tokenization import train_bpe_tokenizer

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
            input_ids = _pad([e["input_ids"] for e in examples], pad)
            return {
                "input_ids": input_ids,
                "attention_mask": (input_ids != pad).long(),
                "labels": _pad([e["labels"] for e in examples], -100),
            }

        return collate

    def create_optimizer(self, model, args):
        from .schedules import paper_adam

        # The paper's Adam (sec. 5.3); with the default learning rate 1.0 the schedule gives the absolute rate.
        return paper_adam(
            weight_decay_groups(model, args.weight_decay),
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
        )

    def eval_outputs(self, model, batch):
        from accelerate.utils import extract_model_from_parallel

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
        }

    def metrics(self, gathered):
        tokens = gathered["tokens"].sum().item()
        loss = gathered["nll_sum"].sum().item() / tokens
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "token_accuracy": gathered["correct"].sum().item() / tokens,
            "exact_match": gathered["exact"].float().mean().item(),
            "samples": len(gathered["tokens"]),
        }


# ------------------------------------------------------------------------------------------------- sparse LM
class SparseLMFamily(Family):
    name = "sparse-lm"
    config_class = SparseTransformerConfig
    model_class = SparseTransformerForCausalLM
    auto_model_class = AutoModelForCausalLM

    def load_data(self, args):
        if builtin_data(args):
            from ..data.text import load_stdlib_text, sequential_windows

            text = load_stdlib_text(max_train_bytes=STDLIB_TRAIN_BYTES, max_heldout_bytes=STDLIB_HELDOUT_BYTES)
            # Byte ids already: non-overlapping windows of block_size, shuffled by the sampler each epoch.
            windows = {
                split: Dataset.from_dict({"input_ids": sequential_windows(text[key], args.block_size).tolist()})
                for split, key in (("train", "train"), ("validation", "heldout"))
            }
            return TrainingData(limit_samples(DatasetDict(windows), args), "python-stdlib-bytes")
        raw, _ = select_columns(load_user_data(args), text=(args.text_column, ("text", "content"), "--text_column"))
        return TrainingData(raw, args.dataset_name or Path(args.train_file).stem)  # limited once grouped in blocks

    def build(self, args, data):
        from ..data.text import byte_tokenizer

        tokenizer = saved_tokenizer(args) or byte_tokenizer()
        # The small default is sized for the tokenizer and --block_size; a saved model or config is taken as it is.
        defaults = dict(
            SMALL_SPARSE_LM_CONFIG,
            vocab_size=len(tokenizer),
            max_position_embeddings=args.block_size,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        model = self.load_or_create_model(args, self.build_config(args, defaults, {}))
        if args.block_size > model.config.max_position_embeddings:
            raise ValueError(
                f"--block_size {args.block_size} exceeds the model's max_position_embeddings "
                f"({model.config.max_position_embeddings})."
            )
        return model, tokenizer

    def transform(self, data, tokenizer, model, args):
        raw = data.raw
        if "text" in raw["train"].column_names:  # user text: tokenised, concatenated and cut into blocks
            block = args.block_size

            def group(examples):
                ids = [i for text in examples["text"] for i in tokenizer(text)["input_ids"]]
                usable = len(ids) // block * block
                return {"input_ids": [ids[i : i + block] for i in range(0, usable, block)]}

            raw = raw.map(group, batched=True, remove_columns=["text"], desc="tokenizing and grouping")
            raw = limit_samples(raw, args)
            for split, blocks in raw.items():
                if len(blocks) == 0:
                    raise ValueError(f"The {split} text is shorter than one --block_size ({block} tokens).")
        return raw.with_format("torch")

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


# ------------------------------------------------------------------------------------------------- image LM
class ImageLMFamily(Family):
    """The Sparse Transformer as an image model (sec. 7.1 of the paper): pixels in raster order as tokens, the loss in
    nats per dim, evaluated in bits per dim on the test split beside two floors (uniform, per-pixel histogram)."""

    name = "image-lm"
    config_class = SparseTransformerConfig
    model_class = SparseTransformerForImageGeneration
    auto_model_class = AutoModelForCausalLM

    def load_data(self, args):
        from ..data.pixel_baselines import pixel_floors

        train, test = load_image_arrays(args.dataset)
        train, test = train[: args.max_train_samples], test[: args.max_eval_samples]  # as `limit_samples`
        raw = DatasetDict(train=pixel_dataset(train), validation=pixel_dataset(test))
        # the floors of exactly the images the model trains and is evaluated on
        floors = pixel_floors(train, test)
        return TrainingData(raw, IMAGE_DATASETS[args.dataset].card_name, baselines=floors, eval_split="test")

    def build(self, args, data):
        height, width = data.raw["train"].features["pixel_values"].shape
        # A fresh model or a --config_name gets the fields the images fix; a saved model must already fit them.
        fields = {} if args.model_name_or_path else image_config_fields(height, width)
        config = self.build_config(args, SMALL_IMAGE_LM_CONFIG, fields)
        check_image_config(config, height, width, args.model_name_or_path or args.config_name)
        return self.load_or_create_model(args, config), None

    def transform(self, data, processor, model, args):
        return data.raw.select_columns(["pixel_values"]).with_format("torch")

    def collate_fn(self, processor):
        def collate(examples):
            return {"pixel_values": torch.stack([e["pixel_values"] for e in examples])}

        return collate

    def eval_outputs(self, model, batch):
        from accelerate.utils import extract_model_from_parallel

        tokens = extract_model_from_parallel(model).pixels_to_tokens(batch["pixel_values"])  # (B, n)
        logits = model(pixel_values=batch["pixel_values"]).logits.float()  # (B, n, V): position t predicts pixel t
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens, reduction="none")  # (B, n), nats
        return {"nll_sum": losses.sum(-1), "dims": torch.full_like(losses[:, 0], tokens.shape[1])}

    def metrics(self, gathered):
        loss = gathered["nll_sum"].sum().item() / gathered["dims"].sum().item()  # nats per dim
        return {"loss": loss, "bits_per_dim": loss / math.log(2), "samples": len(gathered["dims"])}


def load_image_arrays(dataset: str) -> tuple:
    """(train, test) uint8 arrays (N, H, W) of a built-in image data set (`data.images.IMAGE_DATASETS`); a
    `UsageError` naming the Debian package when Fashion-MNIST is not installed."""
    if dataset not in IMAGE_DATASETS:
        raise UsageError(f"Unknown --dataset {dataset!r}; expected one of {', '.join(IMAGE_DATASETS)}.")
    try:
        return IMAGE_DATASETS[dataset].load("train"), IMAGE_DATASETS[dataset].load("test")
    except FileNotFoundError as error:  # the message names the apt package
        raise UsageError(f"--dataset {dataset}: {error}") from error


def pixel_dataset(images) -> Dataset:
    """Images (N, H, W) uint8 as a `Dataset` with one `pixel_values` column (fixed-shape arrays)."""
    from datasets import Array2D, Features

    height, width = images.shape[1:]
    features = Features({"pixel_values": Array2D((height, width), "uint8")})
    return Dataset.from_dict({"pixel_values": images}, features=features)


def image_config_fields(height: int, width: int, num_channels: int = 1) -> dict[str, Any]:
    """The config fields images of this size fix (`IMAGE_CONFIG_FIELDS`, as `SparseTransformerConfig.for_images`
    sets them)."""
    config = SparseTransformerConfig.for_images(height, width, num_channels)
    return {name: getattr(config, name) for name in IMAGE_CONFIG_FIELDS}


def check_image_config(config, height: int, width: int, source: str | None) -> None:
    """A `UsageError` unless `config` is an image model's for grey images of height x width."""
    where = f" of {source!r}" if source else ""
    if not getattr(config, "is_image_model", False):
        raise UsageError(
            f"The model{where} is not an image model (its config has no image_size): the image-lm family trains "
            "SparseTransformerForImageGeneration (config from SparseTransformerConfig.for_images)."
        )
    if list(config.image_size) != [height, width] or config.num_channels != 1:
        raise UsageError(
            f"The model{where} is made for images of {config.image_size[0]}x{config.image_size[1]} with "
            f"{config.num_channels} channel(s); the data has {height}x{width} grey images."
        )


# ------------------------------------------------------------------------------------------------- data helpers
def builtin_data(args: TrainingArguments) -> bool:
    """Whether the run uses the family's built-in data (no data option given)."""
    return not (args.dataset_name or args.train_dir or args.train_file)


def load_user_data(args: TrainingArguments) -> DatasetDict:
    """The user's data (--dataset_name, --train_dir or --train_file) with "train" and "validation" splits."""
    return load_user_dataset(
        dataset_name=args.dataset_name,
        dataset_config_name=args.dataset_config_name,
        train_dir=args.train_dir,
        validation_dir=args.validation_dir,
        train_file=args.train_file,
        validation_file=args.validation_file,
        validation_split_percentage=args.validation_split_percentage,
        seed=args.seed,
    )


def select_columns(raw: DatasetDict, **roles: tuple[str | None, tuple[str, ...], str]):
    """Keep one column per role, renamed to the role: `roles` maps it to (the column the user asked for or None,
    the names to guess from, the flag that sets it). Returns the data and the chosen column of each role; a column
    missing from any split is named with the columns that exist."""
    chosen = {}
    for role, (requested, candidates, flag) in roles.items():
        chosen[role] = pick_column(raw["train"].column_names, requested, candidates, flag)
        for split in raw.values():
            pick_column(split.column_names, chosen[role], (), flag)
    raw = raw.select_columns(list(chosen.values()))
    return raw.rename_columns({column: role for role, column in chosen.items() if column != role}), chosen


def limit_samples(raw: DatasetDict, args: TrainingArguments) -> DatasetDict:
    """The first --max_train_samples / --max_eval_samples examples."""
    if args.max_train_samples is not None:
        raw["train"] = raw["train"].select(range(min(args.max_train_samples, len(raw["train"]))))
    if args.max_eval_samples is not None:
        raw["validation"] = raw["validation"].select(range(min(args.max_eval_samples, len(raw["validation"]))))
    return raw


def saved_tokenizer(args: TrainingArguments):
    """The tokenizer of --tokenizer_name or --model_name_or_path; None when neither is given."""
    location = args.tokenizer_name or args.model_name_or_path
    return AutoTokenizer.from_pretrained(location) if location else None


def _pad(sequences: list, value: int) -> torch.Tensor:
    width = max(len(s) for s in sequences)
    out = torch.full((len(sequences), width), value, dtype=torch.long)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out


def collate_images(examples: list[dict]) -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.stack([e["pixel_values"] for e in examples]),
        "labels": torch.stack([torch.as_tensor(e["labels"]) for e in examples]),
    }


FAMILY_CLASSES: dict[str, type[Family]] = {
    "vit": ViTFamily,
    "seq2seq": Seq2SeqFamily,
    "sparse-lm": SparseLMFamily,
    "image-lm": ImageLMFamily,
}


def get_family(name: str) -> Family:
    if name not in FAMILY_CLASSES:
        raise ValueError(f"Unknown family {name!r}; expected one of {sorted(FAMILY_CLASSES)}.")
    return FAMILY_CLASSES[name]()
