"""The built-in image data sets of the image models, by name: one loader for training, sampling, explaining and the
experiment scripts.

- "digits": scikit-learn's 8 x 8 digits (1,437 train / 360 test, the split of `load_digits_dataset()`), 17 grey levels
  scaled to 0..255; ships with scikit-learn.
- "fashion-mnist": Fashion-MNIST (60,000 train / 10,000 test, 28 x 28 grey) from Debian's `dataset-fashion-mnist`
  package; a FileNotFoundError naming the package when it is not installed.
"""

from __future__ import annotations

import numpy as np

# name -> (image size [height, width], the name a model card gives the data set)
IMAGE_DATASETS = {
    "digits": ([8, 8], "sklearn-digits"),
    "fashion-mnist": ([28, 28], "zalando-datasets/fashion_mnist"),
}


def load_image_arrays(name: str, split: str) -> np.ndarray:
    """The images (N, H, W) uint8 of the "train" or "test" split of the built-in data set `name`."""
    if name not in IMAGE_DATASETS:
        raise ValueError(f"Unknown image data set {name!r}; expected one of {', '.join(IMAGE_DATASETS)}.")
    if split not in ("train", "test"):
        raise ValueError(f"Unknown split {split!r} of {name}: expected 'train' or 'test'.")
    if name == "digits":
        from .digits import load_digits_dataset

        images = load_digits_dataset(seed=0)[split]["image"]
        return np.stack([np.asarray(image.convert("L"), dtype=np.uint8) for image in images])
    from .fashion_mnist import load_fashion_mnist_arrays

    return load_fashion_mnist_arrays(split)[0]


__all__ = ["IMAGE_DATASETS", "load_image_arrays"]
