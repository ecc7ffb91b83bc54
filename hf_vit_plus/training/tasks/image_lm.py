"""How the Sparse Transformer trains as an image model (sec. 7.1 of the paper): a built-in image data set
(`hf_vit_plus.data.images`) or the user's images (grey, at the size of the first training image: others are resized
to it), as pixel sequences, the model's config sized from the images, bits per dim on the evaluation split beside the
uniform and per-pixel-histogram floors."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from datasets import Dataset, DatasetDict

from ...data.images import IMAGE_DATASETS, ImageDataset
from ...errors import UsageError
from ...models.configuration_sparse_transformer import SparseTransformerConfig
from ..learning import LearningMetric
from .base import (
    IMAGE_COLUMNS,
    TrainingData,
    TrainingTask,
    UnitBatches,
    builtin_card_record,
    builtin_data,
    load_user_data,
    select_columns,
    stream_data,
    user_data_record,
)

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


class ImageLMTask(TrainingTask):
    """The Sparse Transformer as an image model (sec. 7.1 of the paper): pixels in raster order as tokens, the loss in
    nats per dim, evaluated in bits per dim on the test split beside two floors (uniform, per-pixel histogram)."""

    name = "image-lm"
    learning_metric = LearningMetric(
        "bits_per_dim", "pixel_histogram_bits_per_dim", False, "each pixel's own histogram"
    )

    def load_data(self, options):
        from ...data.pixel_baselines import pixel_floors

        stream = None
        if builtin_data(options):
            train, test = load_image_arrays(options.dataset, self.spec.datasets)
            name, record = builtin_card_record(self.spec.datasets[options.dataset])
        else:  # the user's images, grey, at the size of the first training image
            column = dict(image=(options.image_column_name, IMAGE_COLUMNS, "--image_column_name"))
            record = user_data_record(options, options.train_dir or options.train_file)
            name = record.pop("name")
            if options.streaming:
                raw, stream, record["eval_from"], _ = stream_data(options, **column)
            else:
                raw, _ = select_columns(load_user_data(options), **column)
            train = grey_arrays(raw["train"]["image"])
            test = grey_arrays(raw["validation"]["image"], size=train.shape[1:])
        train, test = train[: options.max_train_samples], test[: options.max_eval_samples]  # as `limit_samples`
        raw = DatasetDict(train=pixel_dataset(train), validation=pixel_dataset(test))
        # the floors of exactly the images the model trains and is evaluated on (a stream: its sample)
        floors = pixel_floors(train, test)
        return TrainingData(raw, name, baselines=floors, stream=stream, **record)

    def unit_batches(self, data, processor, model, plan):
        """A stream: its images decoded, grey, at the model's size, in the loader's workers, one batch per unit."""
        if data.stream is None:
            return None
        height, width = data.raw["train"].features["pixel_values"].shape
        batch = plan.optimization.per_device_train_batch_size
        return UnitBatches(PixelBatches((height, width)), batch, whole_batches=True)

    def preprocessing(self, plan, processor) -> str:
        return (
            "Each image is one sequence: its grey values (0-255), row by row from the top left, are the tokens "
            "(`SparseTransformerConfig.for_images`); the model learns each pixel from those before it. No "
            "augmentation."
        )

    def model_config(self, options, data):
        height, width = data.raw["train"].features["pixel_values"].shape
        # A fresh model or a --config_name gets the fields the images fix; a saved model must already fit them.
        fields = {} if options.model_name_or_path else image_config_fields(height, width)
        config = self.build_config(options, SMALL_IMAGE_LM_CONFIG, fields)
        check_image_config(config, height, width, options.model_name_or_path or options.config_name)
        return config

    def build(self, plan, data):
        return self.load_or_create_model(plan.model_options, copy.deepcopy(plan.model_config)), None

    def transform(self, data, processor, model, plan):
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


def load_image_arrays(dataset: str, datasets: Mapping[str, ImageDataset] = IMAGE_DATASETS) -> tuple:
    """(train, test) uint8 arrays (N, H, W) of the built-in image data set `dataset` (one of `datasets`, by default
    every entry of `data.images.IMAGE_DATASETS`); a `UsageError` naming the Debian package when Fashion-MNIST is not
    installed."""
    if dataset not in datasets:
        raise UsageError(f"Unknown --dataset {dataset!r}; expected one of {', '.join(datasets)}.")
    try:
        return datasets[dataset].load("train"), datasets[dataset].load("test")
    except FileNotFoundError as error:  # the message names the apt package
        raise UsageError(f"--dataset {dataset}: {error}") from error


def grey_image(value, size: tuple[int, int] | None = None) -> torch.Tensor:
    """An image (as `data.image_files.open_image` reads it) as grey uint8 (H, W), resized (Pillow's bilinear,
    antialiased) to `size` (height, width) when given and different."""
    from PIL import Image

    from ...data.image_files import open_image, pil_to_tensor

    image = open_image(value, 1)
    if size is not None and (image.height, image.width) != tuple(size):
        image = image.resize((int(size[1]), int(size[0])), Image.Resampling.BILINEAR)
    return pil_to_tensor(image)[0]


def grey_arrays(images, size: tuple[int, int] | None = None) -> np.ndarray:
    """Images as one grey uint8 array (N, H, W), at `size` or at the size of the first image.

    Raises:
        ValueError: no images.
    """
    images = list(images)
    if not images:
        raise ValueError("The data holds no images.")
    first = grey_image(images[0], size)
    size = tuple(first.shape)
    return np.stack([first.numpy()] + [grey_image(image, size).numpy() for image in images[1:]])


class PixelBatches:
    """A unit of raw images -> one batch of grey pixels (B, H, W) uint8 at the model's `size`, in the loader's worker.

    Args:
        size: (height, width) of the model's images.
    """

    def __init__(self, size: tuple[int, int]):
        self.size = (int(size[0]), int(size[1]))

    def __call__(self, columns: dict[str, list], rng=None) -> list[dict[str, torch.Tensor]]:
        return [{"pixel_values": torch.stack([grey_image(image, self.size) for image in columns["image"]])}]


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
