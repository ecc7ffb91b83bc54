"""How the Vision Transformer trains: labelled images (the built-in 8x8 digits, an image folder or a Hub data set),
the image processor made from the model's config, accuracy, and the attention figures of its card."""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import ClassLabel, DatasetDict
from transformers import AutoImageProcessor

from ...data.loading import check_labels, label_names
from ...errors import load_config
from ...models.image_processing_vit_plus import ViTPlusImageProcessor
from .base import TrainingData, TrainingFamily, builtin_data, limit_samples, load_user_data, select_columns

# The demo's ViT for 8x8 digits: 2x2 patches (16 tokens + [CLS]), 4 blocks of width 64.
DIGITS_VIT_CONFIG = dict(
    image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    intermediate_size=128,
)  # fmt: skip
# A fresh ViT for user images when no --config_name is given: 32x32 RGB, 4x4 patches.
SMALL_VIT_CONFIG = dict(DIGITS_VIT_CONFIG, image_size=32, patch_size=4, num_channels=3, hidden_size=128)


class ViTFamily(TrainingFamily):
    name = "vit"

    def load_data(self, args):
        if builtin_data(args):
            from ...data.digits import load_digits_dataset

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
        # --config_overrides may contradict the data (num_labels=3 on 10 classes): found now, not mid-training
        check_labels(names, model.config.num_labels, model="the run's config", label_column=data.label_column)
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
        from ...interpret import write_vit_figures

        mode = "L" if model.config.num_channels == 1 else "RGB"
        images = [raw["validation"][i]["image"].convert(mode) for i in range(min(32, len(raw["validation"])))]
        return list(write_vit_figures(model, images, output_dir, processor=processor, max_images=4))


def collate_images(examples: list[dict]) -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.stack([e["pixel_values"] for e in examples]),
        "labels": torch.stack([torch.as_tensor(e["labels"]) for e in examples]),
    }
