"""What differs between the three families inside the one training loop (`loop.py`).

Each `Family` builds its model and processor (image processor or tokenizer), loads and transforms its data
(built-in data by default, user data otherwise), collates batches, computes per-example evaluation outputs that
`gather_for_metrics` can gather, turns them into metrics, and picks its optimiser and schedule. The text families
import their model classes lazily, so the ViT path works on its own.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from datasets import ClassLabel, DatasetDict

from ..data.loading import check_labels, label_names, load_user_dataset, pick_column
from ..errors import UsageError, load_config
from .args import TrainingArguments

logger = logging.getLogger(__name__)

# The demo's ViT for 8x8 digits: 2x2 patches (16 tokens + [CLS]), 4 blocks of width 64.
DIGITS_VIT_CONFIG = dict(
    image_size=8,
    patch_size=2,
    num_channels=1,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=128,
)
# A fresh ViT for user images when no --config_name is given: 32x32 RGB, 4x4 patches.
SMALL_VIT_CONFIG = dict(DIGITS_VIT_CONFIG, image_size=32, patch_size=4, num_channels=3, hidden_size=128)


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
    from transformers import PretrainedConfig

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
    names.update(
        name for name, value in vars(PretrainedConfig).items() if isinstance(value, property) and value.fset
    )
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


def weight_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two optimiser groups, decided by tensor rank (as in nanoGPT): matrices (rank >= 2) are decayed; biases,
    norm weights and other rank < 2 tensors are not."""
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Family:
    """The per-family pieces. Subclasses set `name`, `auto_class` and implement the abstract methods."""

    name: str = ""
    card_family: str = ""  # the family name of `hf_vit_plus.hub.write_model_card`
    auto_class: str = "AutoModel"
    default_scheduler: str = "cosine"
    trains_its_processor: bool = False  # a tokenizer trained on the data (saved with each checkpoint)

    # --- model config
    def default_config_class(self) -> type:
        """The config class of a fresh model of this family."""
        raise NotImplementedError

    def config_class(self, args: TrainingArguments) -> type:
        """The class of the config `build` makes: that of --model_name_or_path or a --config_name folder, else the
        family's own (after checking that a --config_name preset exists)."""
        if args.model_name_or_path:
            return type(load_config(args.model_name_or_path, "--model_name_or_path"))
        config_class = self.default_config_class()
        if args.config_name:
            # a folder, or for a family without presets (sparse-lm) also a Hub id
            if Path(args.config_name).is_dir() or not hasattr(config_class, "from_preset"):
                return type(load_config(args.config_name, "--config_name"))
            try:
                config_class.from_preset(args.config_name)
            except ValueError as error:  # an unknown preset; the message lists the known ones
                raise UsageError(f"--config_name: {error}") from error
        return config_class

    def config_overrides(self, args: TrainingArguments) -> dict[str, Any]:
        """--config_overrides parsed and checked against the fields of the config `build` makes."""
        overrides = parse_overrides(args.config_overrides)
        if overrides:
            check_config_overrides(self.config_class(args), overrides)
        return overrides

    # --- data
    def load_raw_data(self, args: TrainingArguments) -> tuple[DatasetDict, str]:
        """Return ("train", "validation") raw splits and the data set's name for the model card."""
        raise NotImplementedError

    def build(self, args: TrainingArguments, raw: DatasetDict) -> tuple[torch.nn.Module, Any]:
        """Return the model and its processor (image processor or tokenizer)."""
        raise NotImplementedError

    def transform(self, raw: DatasetDict, processor, model, args: TrainingArguments) -> DatasetDict:
        raise NotImplementedError

    def collate_fn(self, processor, model) -> Callable[[list[dict]], dict]:
        raise NotImplementedError

    def training_loss(self, model, batch: dict, args: TrainingArguments) -> torch.Tensor:
        return model(**batch).loss

    # --- evaluation
    def eval_outputs(self, model, batch: dict) -> dict[str, torch.Tensor]:
        """Per-example tensors (first dimension = batch) for `gather_for_metrics`."""
        raise NotImplementedError

    def pad_for_gather(self, accelerator, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Pad variable-length outputs to the same shape on every process before gathering."""
        return outputs

    def concat(self, key: str, values: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(values)

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

        kind = self.default_scheduler if args.lr_scheduler == "auto" else args.lr_scheduler
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
        raise ValueError(f"Unknown --lr_scheduler {kind!r}.")

    # --- card extras
    def figures(self, model, processor, raw: DatasetDict, output_dir: Path) -> list[Path]:
        """The sparse attention pattern the model uses (the Sparse Transformer paper's Fig. 3), when it has one."""
        from ..interpret.patterns import model_sparse_pattern, pattern_from_config

        if model_sparse_pattern(model.config)[0] is None:
            return []
        from ..interpret.plots import plot_sparse_patterns

        return [plot_sparse_patterns([pattern_from_config(model.config)], output_dir / "sparse_attention_pattern.png")]

    def predictions_preview(self, model_dir: Path, raw: DatasetDict, n: int = 8) -> list[tuple[str, str]]:
        return []


def warmup_steps(args: TrainingArguments, total_steps: int) -> int:
    if args.warmup_steps is not None:
        return min(args.warmup_steps, total_steps)
    return int(math.ceil(args.warmup_ratio * total_steps))


# ----------------------------------------------------------------------------------------------------------- ViT
class ViTFamily(Family):
    name = "vit"
    card_family = "vit"
    auto_class = "AutoModelForImageClassification"
    default_scheduler = "cosine"

    def default_config_class(self):
        from ..models.configuration_vit_plus import ViTPlusConfig

        return ViTPlusConfig

    def load_raw_data(self, args):
        if not (args.dataset_name or args.train_dir):
            if args.train_file:
                raise ValueError("The ViT family reads images: use --train_dir or --dataset_name, not --train_file.")
            from ..data.digits import load_digits_dataset

            digits = load_digits_dataset(seed=0)
            raw, dataset_name = DatasetDict(train=digits["train"], validation=digits["test"]), "sklearn-digits"
        else:
            raw = load_user_dataset(
                dataset_name=args.dataset_name,
                dataset_config=args.dataset_config,
                train_dir=args.train_dir,
                validation_dir=args.validation_dir,
                validation_split_percentage=args.validation_split_percentage,
                seed=args.seed,
            )
            dataset_name = args.dataset_name or Path(args.train_dir).name
        columns = raw["train"].column_names
        image_column = pick_column(columns, args.image_column, ("image", "img", "picture"), "--image_column")
        label_column = pick_column(columns, args.label_column, ("label", "labels", "fine_label"), "--label_column")
        for split in raw.values():  # the same columns must exist in every split
            pick_column(split.column_names, image_column, (), "--image_column")
            pick_column(split.column_names, label_column, (), "--label_column")
        names = label_names(raw, label_column)
        raw = raw.select_columns([image_column, label_column])
        if not isinstance(raw["train"].features[label_column], ClassLabel):
            raw = raw.cast_column(label_column, ClassLabel(names=names))
        if image_column != "image":
            raw = raw.rename_column(image_column, "image")
        if label_column != "label":
            raw = raw.rename_column(label_column, "label")
        raw = _limit(raw, args)
        self.label_column = label_column
        return raw, dataset_name

    def build(self, args, raw):
        from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageClassification

        from ..models.configuration_vit_plus import ViTPlusConfig
        from ..models.image_processing_vit_plus import ViTPlusImageProcessor
        from ..models.modeling_vit_plus import ViTPlusForImageClassification

        names = raw["train"].features["label"].names
        labels = dict(
            num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)}
        )
        overrides = self.config_overrides(args)
        if args.model_name_or_path:
            with config_value_errors(args):
                config = AutoConfig.from_pretrained(args.model_name_or_path, **overrides)
            if not args.ignore_mismatched_sizes:
                check_labels(names, config.num_labels, model=args.model_name_or_path, label_column=self.label_column)
            model = AutoModelForImageClassification.from_pretrained(
                args.model_name_or_path, config=config, ignore_mismatched_sizes=args.ignore_mismatched_sizes, **labels
            )
            try:
                processor = AutoImageProcessor.from_pretrained(args.model_name_or_path)
            except OSError:
                processor = ViTPlusImageProcessor.from_model_config(model.config)
        else:
            with config_value_errors(args):
                if args.config_name and Path(args.config_name).is_dir():
                    config = AutoConfig.from_pretrained(args.config_name, **overrides, **labels)
                elif args.config_name:
                    config = ViTPlusConfig.from_preset(args.config_name, **overrides, **labels)
                else:
                    base = DIGITS_VIT_CONFIG if not (args.dataset_name or args.train_dir) else SMALL_VIT_CONFIG
                    config = ViTPlusConfig(**{**base, **overrides, **labels})
            model = ViTPlusForImageClassification(config)
            processor = ViTPlusImageProcessor.from_model_config(config)
        return model, processor

    def transform(self, raw, processor, model, args):
        mode = "L" if model.config.num_channels == 1 else "RGB"

        def to_pixels(examples):
            images = [image.convert(mode) for image in examples["image"]]
            pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
            return {"pixel_values": pixel_values, "labels": torch.tensor(examples["label"], dtype=torch.long)}

        return raw.with_transform(to_pixels)

    def collate_fn(self, processor, model):
        return collate_images

    def eval_outputs(self, model, batch):
        logits = model(pixel_values=batch["pixel_values"]).logits.float()
        losses = torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="none")
        return {"loss": losses, "predictions": logits.argmax(-1), "labels": batch["labels"]}

    def metrics(self, gathered):
        correct = (gathered["predictions"] == gathered["labels"]).float()
        return {"accuracy": correct.mean().item(), "loss": gathered["loss"].mean().item(), "samples": len(correct)}

    def figures(self, model, processor, raw, output_dir):
        try:
            from ..interpret import write_vit_figures  # written by the interpretability module, when present
        except ImportError:
            return []
        mode = "L" if model.config.num_channels == 1 else "RGB"
        images = [raw["validation"][i]["image"].convert(mode) for i in range(min(32, len(raw["validation"])))]
        return list(write_vit_figures(model, images, output_dir, processor=processor, max_images=4))

    def predictions_preview(self, model_dir, raw, n=8):
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        model = AutoModelForImageClassification.from_pretrained(model_dir).eval()
        processor = AutoImageProcessor.from_pretrained(model_dir)
        mode = "L" if model.config.num_channels == 1 else "RGB"
        rows = raw["validation"].select(range(min(n, len(raw["validation"]))))
        inputs = processor(images=[row["image"].convert(mode) for row in rows], return_tensors="pt")
        with torch.no_grad():
            predicted = model(**inputs).logits.argmax(-1).tolist()
        names = raw["validation"].features["label"].names
        return [(model.config.id2label[p], names[row["label"]]) for p, row in zip(predicted, rows)]


# --------------------------------------------------------------------------------------------------- seq2seq
# A fresh encoder-decoder for the built-in number -> words task (post-norm, as in the paper).
SMALL_SEQ2SEQ_CONFIG = dict(
    d_model=128,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=256,
    decoder_ffn_dim=256,
    dropout=0.1,
    max_position_embeddings=256,
)


class Seq2SeqFamily(Family):
    name = "seq2seq"
    card_family = "seq2seq"
    auto_class = "AutoModelForSeq2SeqLM"
    default_scheduler = "noam"
    trains_its_processor = True

    def default_config_class(self):
        from ..models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig

        return Seq2SeqTransformerConfig

    def load_raw_data(self, args):
        if not (args.dataset_name or args.train_file):
            if args.train_dir:
                raise ValueError("The seq2seq family reads text: use --train_file or --dataset_name, not --train_dir.")
            from ..data.number_words import load_number_words_dataset

            data = load_number_words_dataset(max_number=9999, num_test=500, seed=0)
            raw, dataset_name = DatasetDict(train=data["train"], validation=data["test"]), "number-words"
        else:
            raw = load_user_dataset(
                dataset_name=args.dataset_name,
                dataset_config=args.dataset_config,
                train_file=args.train_file,
                validation_file=args.validation_file,
                validation_split_percentage=args.validation_split_percentage,
                seed=args.seed,
            )
            dataset_name = args.dataset_name or Path(args.train_file).stem
        for split in raw.values():
            source = pick_column(split.column_names, args.source_column, ("source", "src", "input"), "--source_column")
            target = pick_column(
                split.column_names, args.target_column, ("target", "tgt", "output"), "--target_column"
            )
        raw = raw.select_columns([source, target])
        if source != "source":
            raw = raw.rename_column(source, "source")
        if target != "target":
            raw = raw.rename_column(target, "target")
        return _limit(raw, args), dataset_name

    def build(self, args, raw):
        from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

        from ..models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig
        from ..models.modeling_seq2seq_transformer import Seq2SeqTransformerForConditionalGeneration

        overrides = self.config_overrides(args)
        if args.tokenizer_name or args.model_name_or_path:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or args.model_name_or_path)
        else:
            from ..tokenization import train_bpe_tokenizer

            texts = list(raw["train"]["source"]) + list(raw["train"]["target"])
            tokenizer = train_bpe_tokenizer(texts, vocab_size=args.vocab_size, split_digits=True)
        special = dict(
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.bos_token_id,
        )
        if args.model_name_or_path:
            with config_value_errors(args):
                config = AutoConfig.from_pretrained(
                    args.model_name_or_path, label_smoothing=args.label_smoothing, **overrides
                )
            model = AutoModelForSeq2SeqLM.from_pretrained(args.model_name_or_path, config=config)
        else:
            fields = dict(SMALL_SEQ2SEQ_CONFIG, vocab_size=len(tokenizer), label_smoothing=args.label_smoothing)
            fields.update(special)
            with config_value_errors(args):
                if args.config_name and Path(args.config_name).is_dir():
                    config = AutoConfig.from_pretrained(args.config_name, **{**special, **overrides})
                elif args.config_name:
                    config = Seq2SeqTransformerConfig.from_preset(
                        args.config_name, vocab_size=len(tokenizer), label_smoothing=args.label_smoothing,
                        **{**special, **overrides},
                    )  # fmt: skip
                else:
                    config = Seq2SeqTransformerConfig(**{**fields, **overrides})
            model = Seq2SeqTransformerForConditionalGeneration(config)
        if model.config.vocab_size < len(tokenizer):
            raise ValueError(
                f"The tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {model.config.vocab_size}."
            )
        return model, tokenizer

    def transform(self, raw, tokenizer, model, args):
        def tokenize(examples):
            inputs = tokenizer(examples["source"], truncation=True, max_length=args.max_source_length)
            labels = tokenizer(text_target=examples["target"], truncation=True, max_length=args.max_target_length)
            return {"input_ids": inputs["input_ids"], "labels": labels["input_ids"]}

        return raw.with_transform(tokenize)

    def collate_fn(self, tokenizer, model):
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

    def predictions_preview(self, model_dir, raw, n=8):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        rows = raw["validation"].select(range(min(n, len(raw["validation"]))))
        inputs = tokenizer(list(rows["source"]), return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=32)
        return list(zip(tokenizer.batch_decode(out, skip_special_tokens=True), rows["target"]))


# ------------------------------------------------------------------------------------------------- sparse LM
# A fresh Sparse Transformer for byte-level text: 4 blocks of width 128, strided pattern of stride 16.
SMALL_SPARSE_LM_CONFIG = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=512,
    attention_type="strided",
    sparse_stride=16,
    max_position_embeddings=1024,
)
STDLIB_TRAIN_BYTES = 2_000_000
STDLIB_HELDOUT_BYTES = 100_000


class SparseLMFamily(Family):
    name = "sparse-lm"
    card_family = "sparse_lm"
    auto_class = "AutoModelForCausalLM"
    default_scheduler = "cosine"

    def default_config_class(self):
        from ..models.configuration_sparse_transformer import SparseTransformerConfig

        return SparseTransformerConfig

    def load_raw_data(self, args):
        from datasets import Dataset

        if not (args.dataset_name or args.train_file):
            if args.train_dir:
                raise ValueError("The sparse-lm family reads text: use --train_file or --dataset_name.")
            from ..data.text import load_stdlib_text, sequential_windows

            text = load_stdlib_text(max_train_bytes=STDLIB_TRAIN_BYTES, max_heldout_bytes=STDLIB_HELDOUT_BYTES)
            # Byte ids already: non-overlapping windows of block_size, shuffled by the sampler each epoch.
            splits = {}
            for split, key in (("train", "train"), ("validation", "heldout")):
                windows = sequential_windows(text[key], args.block_size)
                splits[split] = Dataset.from_dict({"input_ids": windows.tolist()})
            self.pretokenized = True
            return _limit(DatasetDict(splits), args), "python-stdlib-bytes"
        raw = load_user_dataset(
            dataset_name=args.dataset_name,
            dataset_config=args.dataset_config,
            train_file=args.train_file,
            validation_file=args.validation_file,
            validation_split_percentage=args.validation_split_percentage,
            seed=args.seed,
        )
        for split in raw.values():
            column = pick_column(split.column_names, args.text_column, ("text", "content"), "--text_column")
        raw = raw.select_columns([column])
        if column != "text":
            raw = raw.rename_column(column, "text")
        self.pretokenized = False
        return raw, args.dataset_name or Path(args.train_file).stem

    def build(self, args, raw):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from ..data.text import byte_tokenizer
        from ..models.configuration_sparse_transformer import SparseTransformerConfig
        from ..models.modeling_sparse_transformer import SparseTransformerForCausalLM

        overrides = self.config_overrides(args)
        if args.tokenizer_name or args.model_name_or_path:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or args.model_name_or_path)
        else:
            tokenizer = byte_tokenizer()
        if args.model_name_or_path:
            with config_value_errors(args):
                config = AutoConfig.from_pretrained(args.model_name_or_path, **overrides)
            model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, config=config)
        elif args.config_name:
            with config_value_errors(args):
                config = AutoConfig.from_pretrained(args.config_name, **overrides)
            model = SparseTransformerForCausalLM(config)
        else:
            fields = dict(SMALL_SPARSE_LM_CONFIG, vocab_size=len(tokenizer), max_position_embeddings=args.block_size)
            fields.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            with config_value_errors(args):
                config = SparseTransformerConfig(**{**fields, **overrides})
            model = SparseTransformerForCausalLM(config)
        if args.block_size > model.config.max_position_embeddings:
            raise ValueError(
                f"--block_size {args.block_size} exceeds the model's max_position_embeddings "
                f"({model.config.max_position_embeddings})."
            )
        return model, tokenizer

    def transform(self, raw, tokenizer, model, args):
        if not self.pretokenized:
            block = args.block_size

            def group(examples):
                ids = [i for text in examples["text"] for i in tokenizer(text)["input_ids"]]
                usable = len(ids) // block * block
                return {"input_ids": [ids[i : i + block] for i in range(0, usable, block)]}

            raw = raw.map(group, batched=True, remove_columns=["text"], desc="tokenizing and grouping")
            raw = _limit(raw, args)
            for split, data in raw.items():
                if len(data) == 0:
                    raise ValueError(f"The {split} text is shorter than one --block_size ({block} tokens).")
        return raw.with_format("torch")

    def collate_fn(self, tokenizer, model):
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


def _limit(raw: DatasetDict, args: TrainingArguments) -> DatasetDict:
    if args.max_train_samples is not None:
        raw["train"] = raw["train"].select(range(min(args.max_train_samples, len(raw["train"]))))
    if args.max_eval_samples is not None:
        raw["validation"] = raw["validation"].select(range(min(args.max_eval_samples, len(raw["validation"]))))
    return raw


_FAMILIES: dict[str, type[Family]] = {"vit": ViTFamily, "seq2seq": Seq2SeqFamily, "sparse-lm": SparseLMFamily}


def get_family(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"Unknown family {name!r}; expected one of {sorted(_FAMILIES)}.")
    return _FAMILIES[name]()
