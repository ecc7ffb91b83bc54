"""Fashion-MNIST (Xiao, Rasul and Vollgraf 2017) from Debian's `dataset-fashion-mnist` package: 60,000 training and
10,000 test images, 28 x 28, 8-bit grey, 10 clothing classes, MIT licence.

The package installs the four gzipped IDX files under /usr/share/datasets/fashion-mnist/; they are read here with the
standard library and numpy (IDX: a big-endian header of magic number and dimension sizes, then the raw bytes), so no
download is involved.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from datasets import DatasetDict

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
FASHION_MNIST_CLASSES = [
    "t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot",
]  # fmt: skip
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_UBYTE = 0x08  # the IDX type code of unsigned bytes


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (optionally gzipped) as a uint8 array of the shape its header gives."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{str(path)!r} is not an IDX file (its first two bytes must be zero).")
    type_code, ndim = data[2], data[3]
    if type_code != _UBYTE:
        raise ValueError(f"{str(path)!r} holds IDX type 0x{type_code:02x}; only unsigned bytes (0x08) are supported.")
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected = int(np.prod(shape))
    if len(data) - header != expected:
        raise ValueError(
            f"{str(path)!r} is truncated or corrupt: its header announces shape {shape} ({expected} bytes) but "
            f"{len(data) - header} bytes follow."
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def load_fashion_mnist_arrays(split: str, root: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 28, 28) uint8, labels (N,) int64) of the "train" or "test" split."""
    if split not in _FILES:
        raise ValueError(f"Unknown Fashion-MNIST split {split!r}: expected 'train' or 'test'.")
    root = Path(root) if root is not None else FASHION_MNIST_DIR
    image_file, label_file = (root / name for name in _FILES[split])
    missing = [str(p) for p in (image_file, label_file) if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST is not installed: {', '.join(missing)} not found. Install Debian's "
            f"`{FASHION_MNIST_PACKAGE}` package (`sudo apt-get install {FASHION_MNIST_PACKAGE}`), or pass the folder "
            "that holds the four IDX files."
        )
    images, labels = read_idx(image_file), read_idx(label_file)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"Fashion-MNIST {split} files do not match: images {images.shape}, labels {labels.shape} (expected "
            "(N, 28, 28) and (N,))."
        )
    return images, labels.astype(np.int64)


def load_fashion_mnist(root: str | Path | None = None, max_per_split: int | None = None) -> DatasetDict:
    """The two splits as a `DatasetDict` ("train", "test") with an `image` (PIL "L") and a `label` column."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image
    from PIL import Image as PILImage

    features = Features({"image": Image(), "label": ClassLabel(names=FASHION_MNIST_CLASSES)})
    splits = {}
    for split in _FILES:
        images, labels = load_fashion_mnist_arrays(split, root)
        if max_per_split is not None:
            images, labels = images[:max_per_split], labels[:max_per_split]
        data = {"image": [PILImage.fromarray(img, mode="L") for img in images], "label": labels.tolist()}
        splits[split] = Dataset.from_dict(data, features=features)
    return DatasetDict(splits)
