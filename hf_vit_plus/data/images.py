"""The built-in image data sets of the image models, one entry each: the one registry that training (`hf-vit-plus
train image-lm --dataset`), sampling (`hf-vit-plus sample --complete`), explaining (`hf-vit-plus explain next-pixel
--dataset`) and the experiment scripts read their names, sizes, help texts and defaults from.

- "digits": scikit-learn's 8 x 8 digits (1,437 train / 360 test, the split of `load_digits_dataset()`), 17 grey levels
  scaled to 0..255; ships with scikit-learn.
- "fashion-mnist": Fashion-MNIST (60,000 train / 10,000 test, 28 x 28 grey) from Debian's `dataset-fashion-mnist`
  package; a FileNotFoundError naming the package when it is not installed.

A new data set is a loader (its own module, e.g. `data/fashion_mnist.py`) and one `ImageDataset` entry below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .digits import DIGIT_NAMES
from .fashion_mnist import FASHION_MNIST_CLASSES


@dataclass(frozen=True)
class ImageDataset:
    """One built-in image data set."""

    name: str  # what users type: `--dataset NAME`, `--complete NAME`
    description: str  # for help texts, e.g. "scikit-learn's 8x8 digits, 1,437 train / 360 test"
    image_size: tuple[int, int]  # (height, width); grey images, values 0..255
    card_name: str  # the name a model card gives the data set, in words (e.g. "Fashion-MNIST")
    default_epochs: float  # training epochs when --num_train_epochs is not given
    loader: Callable[[str], np.ndarray]  # split -> images (N, H, W) uint8; FileNotFoundError when not installed
    citation: str = ""  # what a model card trained on it cites (markdown)
    hub_id: str | None = None  # the data set's id on the Hub, where it has one (the card's `datasets` and model-index)
    card_description: str = ""  # what a model card says of its source and splits (markdown)
    splits: tuple[str, ...] = ("train", "test")
    # The class of each image, for the classifiers (`train vit --dataset_name NAME`): split -> labels (N,) int64, and
    # the class names; None / () for a data set without labels.
    label_loader: Callable[[str], np.ndarray] | None = None
    class_names: tuple[str, ...] = ()
    # Whether a left-right mirror image is still an image of its class (augmentation: clothes yes, digits no).
    mirror_symmetric: bool = False

    def load(self, split: str) -> np.ndarray:
        """The images (N, H, W) uint8 of `split`."""
        self._check_split(split)
        return self.loader(split)

    def load_labels(self, split: str) -> np.ndarray:
        """The class (N,) int64 of each image of `split`, in the order of `load(split)`."""
        self._check_split(split)
        if self.label_loader is None:
            raise ValueError(f"The built-in data set {self.name!r} has no labels.")
        return self.label_loader(split)

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            expected = " or ".join(repr(name) for name in self.splits)
            raise ValueError(f"Unknown split {split!r} of {self.name}: expected {expected}.")


def _digits(split: str) -> np.ndarray:
    from .digits import load_digits_dataset

    images = load_digits_dataset(seed=0)[split]["image"]
    return np.stack([np.asarray(image.convert("L"), dtype=np.uint8) for image in images])


def _digit_labels(split: str) -> np.ndarray:
    from .digits import load_digits_dataset

    return np.asarray(load_digits_dataset(seed=0)[split]["label"], dtype=np.int64)


def _fashion_mnist(split: str) -> np.ndarray:
    from .fashion_mnist import load_fashion_mnist_arrays

    return load_fashion_mnist_arrays(split)[0]


def _fashion_mnist_labels(split: str) -> np.ndarray:
    from .fashion_mnist import load_fashion_mnist_arrays

    return load_fashion_mnist_arrays(split)[1]


DIGITS_CITATION = """\
The data, the UCI optical recognition of handwritten digits (the 8x8 copy shipped with scikit-learn):

```bibtex
@misc{alpaydin1998optical,
  title     = {Optical Recognition of Handwritten Digits},
  author    = {E. Alpaydin and C. Kaynak},
  year      = {1998},
  publisher = {UCI Machine Learning Repository},
  doi       = {10.24432/C50P49}
}
```"""
FASHION_MNIST_CITATION = """The data, Fashion-MNIST (MIT licence):

```bibtex
@article{xiao2017fashionmnist,
  title         = {Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine Learning Algorithms},
  author        = {Han Xiao and Kashif Rasul and Roland Vollgraf},
  journal       = {arXiv preprint arXiv:1708.07747},
  year          = {2017},
  eprint        = {1708.07747},
  archivePrefix = {arXiv},
  url           = {https://arxiv.org/abs/1708.07747}
}
```"""

# The default epochs give about 1,300 updates on the 1,437 digits and one pass over Fashion-MNIST's 60,000 images at
# the image-lm family's default batch of 32.
IMAGE_DATASETS: dict[str, ImageDataset] = {
    dataset.name: dataset
    for dataset in (
        ImageDataset(
            name="digits",
            description="scikit-learn's 8x8 digits, 1,437 train / 360 test",
            image_size=(8, 8),
            card_name="scikit-learn's digits",
            card_description=(
                "scikit-learn's handwritten digits (`sklearn.datasets.load_digits`: 1,797 grey 8x8 images of the "
                "digits 0-9, read from the scikit-learn package, their 17 grey levels scaled to 0-255). It has no "
                "splits of its own and is not on the Hub: `hf_vit_plus.data.digits.load_digits_dataset(seed=0)` "
                "splits it into 1,437 training and 360 test images, stratified by class; the test images are the "
                "evaluation split."
            ),
            default_epochs=30.0,
            loader=_digits,
            citation=DIGITS_CITATION,
            label_loader=_digit_labels,
            class_names=tuple(DIGIT_NAMES),
        ),
        ImageDataset(
            name="fashion-mnist",
            description="28x28, 60,000 train / 10,000 test, from Debian's dataset-fashion-mnist package",
            image_size=(28, 28),
            card_name="Fashion-MNIST",
            hub_id="zalando-datasets/fashion_mnist",
            card_description=(
                "Zalando's Fashion-MNIST: grey 28x28 images of 10 kinds of clothing, its own 60,000 training and "
                "10,000 test images (read from Debian's `dataset-fashion-mnist` package, the same files as the "
                "Hub's `zalando-datasets/fashion_mnist`); the test images are the evaluation split."
            ),
            default_epochs=1.0,
            loader=_fashion_mnist,
            citation=FASHION_MNIST_CITATION,
            label_loader=_fashion_mnist_labels,
            class_names=tuple(FASHION_MNIST_CLASSES),
            mirror_symmetric=True,
        ),
    )
}


def get_image_dataset(name: str) -> ImageDataset:
    """The entry of `name`, or a ValueError listing the built-in data sets."""
    if name not in IMAGE_DATASETS:
        raise ValueError(f"Unknown image data set {name!r}; expected one of {', '.join(IMAGE_DATASETS)}.")
    return IMAGE_DATASETS[name]


def labelled_image_datasets() -> dict[str, ImageDataset]:
    """The built-in data sets with labels: what the classifiers train on with `--dataset_name NAME`."""
    return {name: dataset for name, dataset in IMAGE_DATASETS.items() if dataset.label_loader is not None}


def load_image_arrays(name: str, split: str) -> np.ndarray:
    """The images (N, H, W) uint8 of the "train" or "test" split of the built-in data set `name`."""
    return get_image_dataset(name).load(split)


def split_names() -> list[str]:
    """Every split a built-in data set has, in registry order (for `choices`)."""
    return list(dict.fromkeys(split for dataset in IMAGE_DATASETS.values() for split in dataset.splits))


__all__ = [
    "IMAGE_DATASETS",
    "ImageDataset",
    "get_image_dataset",
    "labelled_image_datasets",
    "load_image_arrays",
    "split_names",
]
