"""How the Vision Transformer trains: labelled images (the built-in 8x8 digits, a built-in labelled data set with
--dataset_name digits|fashion-mnist, an image folder or a Hub data set), the image processor made from the model's
config, accuracy, and the attention figures of its card.

On top of plain training (`--recipe none`, as before 0.3), the data-efficient recipe of DeiT (`--recipe deit`,
`training/recipes.py`): augmentation of each image and Mixup/CutMix of each batch (`training/augment.py`), label
smoothing, stochastic depth, an average of the weights; DeiT's hard-label distillation from a teacher (`--teacher`,
`training/distillation.py`); fresh transformers models of another type for comparison (`--model_type resnet|vit`).
The masked patch prediction of the ViT paper (sec. 4.6) is the "vit-mpp" family (`ViTMaskedPatchTask`).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from datasets import Array2D, ClassLabel, Dataset, DatasetDict, Features
from transformers import AutoImageProcessor, PretrainedConfig

from ...data.images import IMAGE_DATASETS, labelled_image_datasets
from ...data.loading import check_labels, label_names
from ...errors import UsageError
from ...models.configuration_vit_plus import ViTPlusConfig
from ...models.image_processing_vit_plus import ViTPlusImageProcessor
from ..augment import (
    BatchMixer,
    PixelNormalizer,
    erasing,
    example_augmentation,
    image_augmentation,
    mixes_batches,
    soft_cross_entropy,
)
from ..learning import LearningMetric, majority_accuracy
from ..recipes import RecipeContext, recipe_drop_path_rate
from .base import (
    IMAGE_COLUMNS,
    LABEL_COLUMNS,
    TrainingData,
    TrainingTask,
    UnitBatches,
    builtin_card_record,
    builtin_data,
    limit_samples,
    load_user_data,
    select_columns,
    stream_data,
    user_data_record,
)

# The demo's ViT for 8x8 digits: 2x2 patches (16 tokens + [CLS]), 4 blocks of width 64.
DIGITS_VIT_CONFIG = dict(
    image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    intermediate_size=128,
)  # fmt: skip
# A fresh ViT for user images when no --config_name is given: 32x32 RGB, 4x4 patches.
SMALL_VIT_CONFIG = dict(DIGITS_VIT_CONFIG, image_size=32, patch_size=4, num_channels=3, hidden_size=128)
# A ViT for 28x28 Fashion-MNIST: 7x7 patches (16 tokens + [CLS]), 6 blocks of width 96 (456k parameters): the
# shape that learned most in 45 minutes on a 2-core CPU (README, ViT section; 4x4 patches at width 128: 4.6 points
# behind).
FASHION_VIT_CONFIG = dict(
    image_size=28, patch_size=7, num_channels=1, hidden_size=96, num_hidden_layers=6, num_attention_heads=4,
    intermediate_size=192,
)  # fmt: skip
BUILTIN_VIT_CONFIGS = {"digits": DIGITS_VIT_CONFIG, "fashion-mnist": FASHION_VIT_CONFIG}
# Fresh transformers models of another type (--model_type), sized for small images. A ResNet (He et al. 2016) with
# basic blocks in three stages of 32, 64 and 128 channels, two blocks each (about 0.7M parameters): the inductive-bias
# baseline and the teacher. Types not listed take the ViT's sizes where their config has those fields (e.g. "vit":
# transformers' ViT of the same shape as the ViTPlus).
TRANSFORMERS_CONFIGS: dict[str, dict[str, Any]] = {
    "resnet": dict(
        embedding_size=32,
        hidden_sizes=[32, 64, 128],
        depths=[2, 2, 2],
        layer_type="basic",
        downsample_in_first_stage=False,
    ),  # fmt: skip
    "vit": dict(layer_norm_eps=1e-6),  # the paper's (and our) epsilon, not transformers' 1e-12
    "timm_wrapper": dict(architecture="resnet18"),
}
# Mean and std of the image processors of this family (0..255 -> [-1, 1])
PROCESSOR_MEAN, PROCESSOR_STD = 0.5, 0.5


# The flags that change training images (the card's preprocessing names those a run turned on).
AUGMENTATION_FLAGS = ("auto_augment", "random_resized_crop_scale", "horizontal_flip", "random_erasing_prob",
                      "mixup_alpha", "cutmix_alpha")  # fmt: skip


def _on(value) -> bool:
    return value not in (None, 0, 1, False, "none", "")  # random_resized_crop_scale 1: the whole image


def _cell_list(values) -> str:
    return "not set" if values is None else ", ".join(f"{value:g}" for value in values)


class ViTTask(TrainingTask):
    name = "vit"
    learning_metric = LearningMetric(
        "accuracy", "majority_class_accuracy", True, "always answering the majority class"
    )

    def measure_baselines(self, data, datasets):
        train, validation = data.raw["train"], data.raw["validation"]
        if "label" not in train.column_names or "label" not in validation.column_names:
            return {}
        return {"majority_class_accuracy": majority_accuracy(train["label"], validation["label"])}

    # ------------------------------------------------------------------------------------------------ data
    def load_data(self, options):
        builtin = labelled_image_datasets()
        extra = {}
        if builtin_data(options):
            from ...data.digits import load_digits_dataset

            digits = load_digits_dataset(seed=0)
            raw = DatasetDict(train=digits["train"], validation=digits["test"])
            name, extra = builtin_card_record(IMAGE_DATASETS["digits"])
        elif options.dataset_name in builtin:  # the whole test split is the evaluation split
            dataset = builtin[options.dataset_name]
            raw = DatasetDict(train=_array_dataset(dataset, "train"), validation=_array_dataset(dataset, "test"))
            name, extra = builtin_card_record(dataset)
        elif options.streaming:
            raw, stream, eval_from, chosen = stream_data(options, **self.columns(options))
            record = user_data_record(options, options.train_dir or options.train_file)
            if "label" in raw["train"].features and not isinstance(raw["train"].features["label"], ClassLabel):
                raw = raw.cast_column("label", ClassLabel(names=label_names(raw, "label")))
            return TrainingData(raw, record.pop("name"), label_column=chosen.get("label"), stream=stream,
                                eval_from=eval_from, **record)  # fmt: skip
        else:
            raw, record = load_user_data(options), user_data_record(options, options.train_dir)
            name, extra = record.pop("name"), record
        raw, chosen = select_columns(raw, **self.columns(options))
        if "label" in raw["train"].features and not isinstance(raw["train"].features["label"], ClassLabel):
            raw = raw.cast_column("label", ClassLabel(names=label_names(raw, "label")))
        return TrainingData(limit_samples(raw, options), name, label_column=chosen.get("label"), **extra)

    def preprocessing(self, plan, processor) -> str:
        recipe = plan.recipe
        size = getattr(processor, "size", None) or {}
        side = f"{size['height']}x{size['width']} pixels" if "height" in size else f"{dict(size)}"
        mode = "grey" if getattr(processor, "do_convert_grayscale", False) else "RGB"
        text = (
            f"The image processor saved with the model (`AutoImageProcessor`, {type(processor).__name__}) converts "
            f"images to {mode}, resizes them to {side} and normalises them with mean "
            f"{_cell_list(getattr(processor, 'image_mean', None))} and standard deviation "
            f"{_cell_list(getattr(processor, 'image_std', None))}."
        )
        flags = [f"{flag} {getattr(recipe, flag)}" for flag in AUGMENTATION_FLAGS if _on(getattr(recipe, flag))]
        if flags:
            text += f" Training images are augmented ({', '.join(flags)}); evaluation images are not."
        return text

    def columns(self, options) -> dict:
        """The columns `select_columns` keeps, by role."""
        return dict(
            image=(options.image_column_name, IMAGE_COLUMNS, "--image_column_name"),
            label=(options.label_column_name, LABEL_COLUMNS, "--label_column_name"),
        )

    def recipe_context(self, options, data, config, global_batch, total_steps, epochs):
        """What the recipe's values depend on (`training/recipes.py`): the model's input size, the batch, the run's
        length and whether a mirrored image keeps its class."""
        return RecipeContext(
            family=self.name,
            image_size=self.input_size(options, config),
            global_batch=global_batch,
            total_steps=total_steps,
            epochs=epochs,
            mirror_symmetric=self.mirror_symmetric(options),
        )

    def mirror_symmetric(self, options) -> bool:
        """Whether a mirrored image keeps its class: the built-in data set says; user images (photos) do."""
        if builtin_data(options):
            return False  # digits
        dataset = labelled_image_datasets().get(options.dataset_name)
        return dataset.mirror_symmetric if dataset is not None else True

    def input_size(self, options, config) -> tuple[int, int]:
        """(height, width) of the model's input: the run's config's image size (the data's for a fresh built-in
        model)."""
        if options.model_name_or_path or options.config_name or options.model_type:
            size = getattr(config, "image_size", None)
            if isinstance(size, int):
                return size, size
        return (self.default_config(options)["image_size"],) * 2

    def smallest_feature_map(self, args) -> int | None:
        """The side of the smallest feature map of a fresh --model_type network (a ResNet, ...) on the run's images,
        from a forward pass on the meta device (no weights, no data); None for the ViT, a saved model or a model
        without image-shaped hidden states."""
        if not args.model_type or args.model_name_or_path or args.config_name:
            return None
        from transformers import AutoModelForImageClassification

        shape = self.default_config(args)
        config = self.transformers_config(args, {})
        with torch.device("meta"):
            model = AutoModelForImageClassification.from_config(config).eval()
            pixels = torch.empty(1, shape["num_channels"], shape["image_size"], shape["image_size"])
        with torch.no_grad():
            hidden = model(pixel_values=pixels, output_hidden_states=True).hidden_states or ()
        sides = [min(h.shape[-2:]) for h in hidden if h.dim() == 4]  # (B, C, H, W) maps
        return min(sides) if sides else None

    # ------------------------------------------------------------------------------------------------ model
    def default_config(self, options) -> dict:
        """The ViTPlus fields of a fresh model for the data."""
        if builtin_data(options):
            return DIGITS_VIT_CONFIG
        return BUILTIN_VIT_CONFIGS.get(options.dataset_name, SMALL_VIT_CONFIG)

    def config_class_for(self, options, saved=None):
        if getattr(options, "model_type", None) and not (options.model_name_or_path or options.config_name):
            return _transformers_config_class(options.model_type)
        return super().config_class_for(options, saved)

    def label_fields(self, data) -> dict:
        names = data.raw["train"].features["label"].names
        return dict(
            num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)}
        )

    def model_config(self, options, data) -> PretrainedConfig:
        """The config of the run's model (see `TrainingTask.build_config`), with the data's labels: that of a saved
        classifier must hold them (unless --ignore_mismatched_sizes gives it a new head), and so must the config
        with --config_overrides (num_labels=3 on 10 classes is found now, not mid-training)."""
        names = data.raw["train"].features["label"].names
        config = self.config_from_saved(options, data)
        check_labels(names, config.num_labels, model="the run's config", label_column=data.label_column)
        return config

    def config_from_saved(self, options, data) -> PretrainedConfig:
        """The run's config with the data's fields: a fresh transformers config of --model_type, or `build_config`'s
        (the saved config read once; a saved classifier checked against the data's labels first)."""
        fields = self.label_fields(data)
        if options.model_type and not (options.model_name_or_path or options.config_name):
            return self.transformers_config(options, fields)
        saved = self.saved_config(options)
        if options.model_name_or_path and not options.ignore_mismatched_sizes and _is_classifier(saved) and fields:
            # a pre-trained encoder (masked patch prediction) gets a new head
            check_labels(list(fields["id2label"].values()), saved.num_labels, model=options.model_name_or_path,
                         label_column=data.label_column)  # fmt: skip
        return self.build_config(options, self.default_config(options), fields, saved)

    def transformers_config(self, options, fields: dict) -> PretrainedConfig:
        """A fresh transformers config of --model_type, sized for the data (`TRANSFORMERS_CONFIGS`, else the ViT's
        sizes where the config has the field), then the labels and --config_overrides."""
        from .overrides import config_value_errors

        config_class = _transformers_config_class(options.model_type)
        defaults = config_class()
        values = {k: v for k, v in self.default_config(options).items() if hasattr(defaults, k)}
        values.update(TRANSFORMERS_CONFIGS.get(options.model_type, {}))
        if options.model_type == "timm_wrapper":  # timm's own argument for the input channels
            values["model_args"] = {"in_chans": self.default_config(options)["num_channels"]}
        values.update({k: v for k, v in fields.items() if k != "drop_path_rate" or hasattr(defaults, k)})
        with config_value_errors(options):
            return config_class(**{**values, **self.config_overrides(options)})

    def build(self, plan, data):
        # the plan's config stays the plan's record: the model gets a copy of it
        model = self.load_or_create_model(plan.model_options, copy.deepcopy(plan.model_config))
        return model, self.image_processor(plan, model.config, data)

    def recipe_config_fields(self, options, config, epochs) -> dict:
        """Config fields the run sets on a fresh or fine-tuned ViTPlus, and who chose each: the recipe's stochastic
        depth (unless --config_overrides sets it) and DeiT's distillation token for a fresh student of --teacher."""
        from .overrides import parse_overrides

        if not isinstance(config, ViTPlusConfig):
            return {}
        overrides = parse_overrides(options.config_overrides)
        fields = {}
        if "drop_path_rate" not in overrides and options.recipe != "none":
            rate = recipe_drop_path_rate(options.recipe, config.num_hidden_layers, epochs)
            fields["drop_path_rate"] = (rate, f"--recipe {options.recipe}")
        # a saved model keeps its token layout (its position embeddings fit it): without a token, the teacher trains
        # the class head too (DeiT's distillation without a distillation token)
        if options.teacher and not options.model_name_or_path and "use_distillation_token" not in overrides:
            fields["use_distillation_token"] = (True, "--teacher")
        return fields

    def load_or_create_model(self, options, config):
        if not options.model_name_or_path and not isinstance(config, ViTPlusConfig):
            from transformers import AutoModelForImageClassification

            return AutoModelForImageClassification.from_config(config)  # --model_type: a transformers model
        return super().load_or_create_model(options, config)

    def image_processor(self, plan, config, data=None) -> ViTPlusImageProcessor:
        """The saved model's processor, else one made from the model's config (for another model type: from the
        data's image size and channels)."""
        location = plan.model_options.model_name_or_path
        if location:
            try:
                return AutoImageProcessor.from_pretrained(location)
            except OSError:
                pass
        if isinstance(config, ViTPlusConfig):
            return ViTPlusImageProcessor.from_model_config(config)
        defaults = self.default_config(plan.data_options)
        shape = ViTPlusConfig(
            image_size=getattr(config, "image_size", None) or defaults["image_size"],
            patch_size=1,
            num_channels=getattr(config, "num_channels", None) or defaults["num_channels"],
        )
        return ViTPlusImageProcessor.from_model_config(shape)

    # ------------------------------------------------------------------------------------------------ pixels
    def transform(self, data, processor, model, plan):
        channels = model_channels(model.config, processor)
        size = processor_size(processor)
        mean, std = _processor_stats(processor, channels)
        augment = image_augmentation(plan.recipe, size)
        erase = erasing(plan.recipe)
        keys = self.example_keys(data)
        if isinstance(data.raw["train"].features["image"], Array2D):  # built-in arrays at the model's size
            return {
                split: ArrayImages(
                    data.raw[split], channels, size, mean, std, keys,
                    augment if split == "train" else None, erase if split == "train" else None,
                )
                for split in data.raw
            }  # fmt: skip
        mode = "L" if channels == 1 else "RGB"

        def to_pixels(examples, augmented: bool = False):
            images = [image.convert(mode) for image in examples["image"]]
            if not augmented:
                out = {"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"]}
            else:  # augment the resized 0..255 pixels, then normalise as the processor does
                unit = processor(images=images, return_tensors="pt", do_normalize=False)["pixel_values"]
                pixels = (unit * 255).round().clamp(0, 255).to(torch.uint8)
                out = {"pixel_values": augmented_pixels(pixels, augment, erase, mean, std)}
            if "labels" in keys:
                out["labels"] = torch.tensor(examples["label"], dtype=torch.long)
            return out

        train_augmented = augment is not None or erase is not None
        result = DatasetDict({split: data.raw[split].with_transform(to_pixels) for split in data.raw})
        if train_augmented:
            result["train"] = data.raw["train"].with_transform(lambda examples: to_pixels(examples, augmented=True))
        return result

    def example_keys(self, data) -> tuple[str, ...]:
        return ("pixel_values", "labels")

    def collate_fn(self, processor):
        return collate_images

    def unit_batches(self, data, processor, model, plan):
        """Images read from files (a stream, or an image column of a data set read whole): each decoded and augmented
        alone in the loader's workers, one batch per unit of the per-device batch's examples, reaching the device as
        uint8 (`on_device` normalises and erases them)."""
        if data.stream is None and isinstance(data.raw["train"].features["image"], Array2D):
            return None  # the built-in arrays: `ArrayImages`
        labels = "labels" in self.example_keys(data)
        names = data.raw["train"].features["label"].names if labels else None
        augmentation = example_augmentation(plan.recipe, processor_size(processor))
        make = ImageBatches(augmentation, model_channels(model.config, processor), names if labels else None)
        return UnitBatches(make, plan.optimization.per_device_train_batch_size, whole_batches=True)

    def on_device(self, batch, extras):
        """uint8 images (read from files) normalised and randomly erased on the device, the whole batch at once."""
        pixels = batch["pixel_values"]
        if pixels.dtype != torch.uint8:
            return batch
        return {**batch, "pixel_values": extras["pixels"](pixels)}

    # ------------------------------------------------------------------------------------------------ training
    def extras(self, plan, model, accelerator) -> dict[str, Any]:
        """The batch mixer, the label smoothing and the teacher of the run."""
        from accelerate.utils import extract_model_from_parallel

        recipe = plan.recipe
        config = extract_model_from_parallel(model).config
        extras: dict[str, Any] = {"label_smoothing": plan.optimization.label_smoothing_factor or 0.0,
                                  "pixels": self.pixel_normalizer(plan, config)}  # fmt: skip
        if mixes_batches(recipe):
            extras["mixer"] = BatchMixer(config.num_labels, recipe.mixup_alpha, recipe.cutmix_alpha, recipe.mixup_prob)
        if recipe.teacher:
            from ..distillation import load_teacher

            names = [config.id2label[i] for i in range(config.num_labels)]
            processor = self.image_processor(plan, config)
            extras["teacher"] = load_teacher(recipe.teacher, processor, config, names, accelerator.device)
        return extras

    def pixel_normalizer(self, plan, config) -> PixelNormalizer:
        """What `on_device` does to uint8 images: the processor's normalisation, then the run's random erasing."""
        processor = self.image_processor(plan, config)
        mean, std = _processor_stats(processor, model_channels(config, processor))
        return PixelNormalizer(mean, std, erasing(plan.recipe))

    def training_loss(self, model, batch, extras):
        """The model's own loss for plain training; with mixing, smoothing or a teacher: soft-target cross-entropy
        of the class head and, with a teacher, DeiT's hard distillation: (CE(class head, targets) + CE(distillation
        head, teacher's classes)) / 2 (the class head takes both when the model has no distillation token)."""
        mixer, teacher, smoothing = extras.get("mixer"), extras.get("teacher"), extras.get("label_smoothing", 0.0)
        if mixer is None and teacher is None and not smoothing:
            return model(**batch).loss
        pixel_values, targets = batch["pixel_values"], batch["labels"]
        if mixer is not None:
            pixel_values, targets = mixer(pixel_values, targets)
        outputs = model(pixel_values=pixel_values)
        cls_logits = getattr(outputs, "cls_logits", None)
        distillation_logits = getattr(outputs, "distillation_logits", None)
        if cls_logits is None:  # no distillation token: one head
            cls_logits = outputs.logits
        loss = soft_cross_entropy(cls_logits, targets, smoothing)
        if teacher is not None:
            teacher_labels = teacher.labels(pixel_values)
            student = distillation_logits if distillation_logits is not None else cls_logits
            loss = (loss + soft_cross_entropy(student, teacher_labels)) / 2
        elif distillation_logits is not None:  # a distillation token but no teacher: both heads learn the labels
            loss = (loss + soft_cross_entropy(distillation_logits, targets, smoothing)) / 2
        return loss

    # ------------------------------------------------------------------------------------------------ evaluation
    def eval_outputs(self, model, batch):
        outputs = model(pixel_values=batch["pixel_values"])
        logits = outputs.logits.float()
        losses = torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="none")
        result = {"loss": losses, "predictions": logits.argmax(-1), "labels": batch["labels"]}
        if getattr(outputs, "distillation_logits", None) is not None:  # DeiT: each head on its own too
            result["cls_predictions"] = outputs.cls_logits.argmax(-1)
            result["distillation_predictions"] = outputs.distillation_logits.argmax(-1)
        return result

    def metrics(self, gathered):
        labels = gathered["labels"]
        correct = (gathered["predictions"] == labels).float()
        metrics = {"accuracy": correct.mean().item(), "loss": gathered["loss"].mean().item()}
        for head in ("cls", "distillation"):
            if f"{head}_predictions" in gathered:
                metrics[f"{head}_head_accuracy"] = (gathered[f"{head}_predictions"] == labels).float().mean().item()
        return metrics | {"samples": len(correct)}

    def figures(self, model, processor, raw, output_dir):
        from ...interpret import write_vit_figures

        if not _is_vit(model.config):  # a CNN (--model_type resnet): no attention to draw
            return []
        mode = "L" if model.config.num_channels == 1 else "RGB"
        images = [as_pil(raw["validation"][i]["image"]).convert(mode) for i in range(min(32, len(raw["validation"])))]
        return list(write_vit_figures(model, images, output_dir, processor=processor, max_images=4))


class ViTMaskedPatchTask(ViTTask):
    learning_metric = LearningMetric(
        "mpp_accuracy", "baseline_commonest_colour_accuracy", True, "always answering the commonest colour"
    )

    def measure_baselines(self, data, datasets):
        return {}  # measured by the evaluation itself (`baseline_commonest_colour_accuracy`)

    """Masked patch prediction (the ViT paper, sec. 4.6): the same images and augmentation as "vit" without labels;
    each step corrupts half of the patches (`models.modeling_vit_plus.corrupt_patches`) and the loss is the
    cross-entropy of their mean colours. Evaluation corrupts each batch the same way every time (a fixed seed) and
    reports the colour accuracy on the corrupted patches, beside that of always guessing the commonest colour."""

    name = "vit-mpp"
    eval_seed = 0

    def columns(self, options) -> dict:
        return dict(image=(options.image_column_name, IMAGE_COLUMNS, "--image_column_name"))

    def label_fields(self, data) -> dict:
        return {}

    def example_keys(self, data) -> tuple[str, ...]:
        return ("pixel_values",)

    def model_config(self, options, data) -> PretrainedConfig:
        config = self.config_from_saved(options, data)
        if not isinstance(config, ViTPlusConfig):
            raise UsageError(f"The vit-mpp family pre-trains a ViTPlus; {type(config).__name__} is another model.")
        return config

    def build(self, plan, data):
        config = copy.deepcopy(plan.model_config)
        return self.load_or_create_model(plan.model_options, config), self.image_processor(plan, config, data)

    def recipe_config_fields(self, options, config, epochs) -> dict:
        fields = super().recipe_config_fields(options, config, epochs)
        fields.pop("use_distillation_token", None)
        return fields

    def extras(self, plan, model, accelerator) -> dict[str, Any]:
        from accelerate.utils import extract_model_from_parallel

        return {"pixels": self.pixel_normalizer(plan, extract_model_from_parallel(model).config)}

    def training_loss(self, model, batch, extras):
        from accelerate.utils import extract_model_from_parallel

        from ...models.modeling_vit_plus import corrupt_patches

        inputs = corrupt_patches(batch["pixel_values"], extract_model_from_parallel(model).config)
        return model(**inputs).loss

    def eval_outputs(self, model, batch):
        from accelerate.utils import extract_model_from_parallel

        from ...models.modeling_vit_plus import corrupt_patches

        config = extract_model_from_parallel(model).config
        generator = torch.Generator().manual_seed(self.eval_seed)
        inputs = corrupt_patches(batch["pixel_values"], config, generator=generator)
        logits = model(**inputs).logits.float()  # (B, N, classes)
        labels = inputs["labels"]
        scored = labels != -100
        losses = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), labels.clamp(min=0), reduction="none"
        )  # (B, N)
        counts = torch.nn.functional.one_hot(labels.clamp(min=0), config.mpp_num_classes) * scored[..., None]
        return {
            "nll_sum": (losses * scored).sum(-1),
            "correct": ((logits.argmax(-1) == labels) & scored).sum(-1).float(),
            "scored": scored.sum(-1).float(),
            "colour_counts": counts.sum(1).float(),  # (B, classes): for the commonest-colour baseline
        }

    def metrics(self, gathered):
        scored = gathered["scored"].sum().item()
        return {
            "loss": gathered["nll_sum"].sum().item() / scored,
            "mpp_accuracy": gathered["correct"].sum().item() / scored,
            "baseline_commonest_colour_accuracy": gathered["colour_counts"].sum(0).max().item() / scored,
            "samples": len(gathered["scored"]),
        }


# ---------------------------------------------------------------------------------------------------- helpers
class ArrayImages(torch.utils.data.Dataset):
    """A built-in labelled data set held as uint8 arrays (N, H, W) at the model's size: each example normalised as
    the image processor does (x / 255 - mean) / std, augmented first for training."""

    def __init__(self, split: Dataset, channels: int, size, mean, std, keys, augment=None, erase=None):
        arrays = split.with_format("numpy")[:]  # whole columns at once (row by row took 80 s for Fashion-MNIST)
        images = torch.from_numpy(np.ascontiguousarray(arrays["image"], dtype=np.uint8)).unsqueeze(1)  # (N, 1, H, W)
        if tuple(images.shape[-2:]) != tuple(size):
            raise UsageError(
                f"The model reads {size[0]}x{size[1]} images; the built-in data set's are "
                f"{images.shape[-2]}x{images.shape[-1]}: use a model of that size."
            )
        self.images = images.expand(-1, channels, -1, -1) if channels > 1 else images
        self.labels = torch.from_numpy(np.asarray(arrays["label"], dtype=np.int64)) if "labels" in keys else None
        self.mean, self.std = mean, std
        self.augment, self.erase = augment, erase

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        """The examples of a batch, augmented and normalised all at once (torch's DataLoader fetches a batch's
        indices through this method when a data set has it)."""
        index = torch.as_tensor(indices, dtype=torch.long)
        pixels = self.images[index]  # (B, C, H, W) uint8
        if self.augment is not None or self.erase is not None:
            pixel_values = augmented_pixels(pixels, self.augment, self.erase, self.mean, self.std)
        else:
            pixel_values = (pixels.float() / 255.0 - self.mean) / self.std
        labels = self.labels[index] if self.labels is not None else None
        examples = []
        for position, values in enumerate(pixel_values):
            example = {"pixel_values": values}
            if labels is not None:
                example["labels"] = labels[position]
            examples.append(example)
        return examples


class ImageBatches:
    """A unit of raw images (undecoded: bytes or path) and labels -> one batch of uint8 pixels (B, C, H, W) at the
    model's size and class indices: each image decoded (`data.image_files.open_image`) and augmented alone
    (`augment.ExampleAugmentation`), in the loader's worker.

    Args:
        augmentation: the per-image crop / resize, flip and automatic augmentation.
        channels: the model's input channels (1: grey, 3: RGB).
        label_names: the class names (labels given as names are looked up in them), or None for images without
            labels (masked patch prediction).
    """

    def __init__(self, augmentation, channels: int, label_names: list[str] | None = None):
        self.augmentation, self.channels = augmentation, channels
        self.label_ids = None if label_names is None else {name: index for index, name in enumerate(label_names)}

    def __call__(self, columns: dict[str, list], rng=None) -> list[dict[str, torch.Tensor]]:
        from ...data.image_files import open_image

        pixels = torch.stack([self.augmentation(open_image(value, self.channels)) for value in columns["image"]])
        batch = {"pixel_values": pixels}
        if self.label_ids is not None:
            batch["labels"] = torch.tensor([self._label(value) for value in columns["label"]], dtype=torch.long)
        return [batch]

    def _label(self, value) -> int:
        if isinstance(value, str):
            if value not in self.label_ids:
                raise ValueError(f"Label {value!r} is not one of the {len(self.label_ids)} classes of the run.")
            return self.label_ids[value]
        index = int(value)
        if not 0 <= index < len(self.label_ids):
            raise ValueError(f"Label {index} is not one of the {len(self.label_ids)} classes of the run (0..."
                             f"{len(self.label_ids) - 1}).")  # fmt: skip
        return index


def augmented_pixels(pixels: torch.Tensor, augment, erase, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 images (B, C, H, W): augmented (`ImageAugmentation`), normalised, then randomly erased
    (`BatchErasing`), the whole batch at once."""
    if augment is not None:
        pixels = augment(pixels)
    pixel_values = (pixels.float() / 255.0 - mean) / std
    if erase is not None:
        pixel_values = erase(pixel_values)
    return pixel_values


def collate_images(examples: list[dict]) -> dict[str, torch.Tensor]:
    batch = {"pixel_values": torch.stack([e["pixel_values"] for e in examples])}
    if "labels" in examples[0]:
        batch["labels"] = torch.stack([torch.as_tensor(e["labels"]) for e in examples])
    return batch


def _array_dataset(dataset, split: str) -> Dataset:
    """A built-in labelled data set's split as a `Dataset` of uint8 arrays and class labels."""
    try:
        images, labels = dataset.load(split), dataset.load_labels(split)
    except FileNotFoundError as error:  # the message names the Debian package
        raise UsageError(f"--dataset_name {dataset.name}: {error}") from error
    height, width = images.shape[1:]
    labels_feature = ClassLabel(names=list(dataset.class_names))
    features = Features({"image": Array2D((height, width), "uint8"), "label": labels_feature})
    return Dataset.from_dict({"image": images, "label": labels}, features=features)


def as_pil(image):
    """A PIL image, from a PIL image or a (H, W) uint8 array (the built-in data sets' examples)."""
    from PIL import Image

    return image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, dtype=np.uint8))


def model_channels(config, processor) -> int:
    channels = getattr(config, "num_channels", None)
    if channels is None:
        channels = int((getattr(config, "model_args", None) or {}).get("in_chans", 3))
    return channels


def processor_size(processor) -> tuple[int, int]:
    size = processor.size
    return int(size["height"]), int(size["width"])


def _processor_stats(processor, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The processor's mean and std as (C, 1, 1) tensors."""
    mean = list(processor.image_mean if processor.image_mean is not None else [PROCESSOR_MEAN])
    std = list(processor.image_std if processor.image_std is not None else [PROCESSOR_STD])
    if len(mean) == 1:
        mean, std = mean * channels, std * channels
    return torch.tensor(mean[:channels]).view(-1, 1, 1), torch.tensor(std[:channels]).view(-1, 1, 1)


def _transformers_config_class(model_type: str) -> type:
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES

    if model_type not in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES or model_type not in CONFIG_MAPPING:
        known = sorted(MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES)
        raise UsageError(
            f"--model_type {model_type!r} is not a transformers image classifier; e.g. 'resnet', 'vit', "
            f"'timm_wrapper' (all: {', '.join(known[:12])}, ...)."
        )
    return CONFIG_MAPPING[model_type]


def _is_classifier(config) -> bool:
    """Whether a saved config is an image classifier's (not, e.g., a masked patch prediction encoder's)."""
    architectures = getattr(config, "architectures", None) or []
    return not architectures or any(name.endswith("ForImageClassification") for name in architectures)


def _is_vit(config) -> bool:
    return isinstance(config, ViTPlusConfig) or getattr(config, "model_type", None) in ("vit", "deit")
