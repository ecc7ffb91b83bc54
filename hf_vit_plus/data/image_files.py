"""Images as files: opened with Pillow (JPEG through libjpeg-turbo, PNG, GIF, WebP, BMP, TIFF, ...) from what
`datasets` gives of an image column it does not decode (`Image(decode=False)`: {"bytes", "path"}), a path, bytes, a
PIL image or an array, as grey ("L") or RGB images, or as uint8 tensors (C, H, W).

Decoding is left to the DataLoader workers of a training run (`hf_vit_plus.data.pipeline`): the stream and the
data set hand them the undecoded bytes (or the path), which cost nothing to skip. (`torchvision.io`'s decoders are
deprecated since torchvision 0.29 in favour of TorchCodec, whose releases each fit one torch release; Pillow is what
`datasets`, transformers' image processors and timm decode with.)
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch


def image_feature_columns(features) -> list[str]:
    """The columns of `features` (a `datasets.Features`, or None) that hold images (`datasets.Image`)."""
    from datasets import Image

    return [name for name, feature in (features or {}).items() if isinstance(feature, Image)]


def undecoded(dataset):
    """`dataset` (a `Dataset` or an `IterableDataset`) with its image columns left undecoded ({"bytes", "path"}):
    what the loader's workers decode themselves."""
    from datasets import Image

    for name in image_feature_columns(dataset.features):
        dataset = dataset.cast_column(name, Image(decode=False))
    return dataset


def open_image(value: Any, channels: int):
    """An image as a loaded PIL image, grey ("L") for 1 channel, RGB for 3.

    Args:
        value: {"bytes", "path"} (an undecoded `datasets.Image`), a path, bytes, a PIL image, or a uint8 array
            (H, W) or (H, W, C).
        channels: 1 or 3.

    Returns:
        The image.

    Raises:
        ValueError: a value that is not an image, or a channel count other than 1 or 3.
    """
    from PIL import Image

    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels!r}.")
    mode = "L" if channels == 1 else "RGB"
    data, path = value, None
    if isinstance(value, Mapping):
        data, path = value.get("bytes"), value.get("path")
    elif isinstance(value, (str, Path)):
        data, path = None, value
    if data is None and path is not None:
        with Image.open(path) as image:
            return image.convert(mode)
    if isinstance(data, (bytes, bytearray, memoryview)):
        with Image.open(io.BytesIO(bytes(data))) as image:
            return image.convert(mode)
    if isinstance(data, Image.Image):
        return data.convert(mode)
    if isinstance(data, (np.ndarray, list)):
        array = np.asarray(data, dtype=np.uint8)
        if array.ndim not in (2, 3):
            raise ValueError(f"An image array is (H, W) or (H, W, C), got shape {array.shape}.")
        return Image.fromarray(array[..., 0] if array.ndim == 3 and array.shape[-1] == 1 else array).convert(mode)
    raise ValueError(f"Not an image: {type(value).__name__}.")


def pil_to_tensor(image) -> torch.Tensor:
    """A PIL image ("L" or "RGB") as uint8 (C, H, W)."""
    array = np.array(image, dtype=np.uint8)  # a copy: torch takes writable memory
    return torch.from_numpy(array)[None] if array.ndim == 2 else torch.from_numpy(array).permute(2, 0, 1)


def decode_image(value: Any, channels: int) -> torch.Tensor:
    """An image as uint8 (channels, H, W) (see `open_image` for what `value` may be).

    Args:
        value: the image.
        channels: 1 (grey) or 3 (RGB).

    Returns:
        The decoded image.
    """
    return pil_to_tensor(open_image(value, channels))


__all__ = ["decode_image", "image_feature_columns", "open_image", "pil_to_tensor", "undecoded"]
