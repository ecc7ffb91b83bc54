"""scikit-learn's 1,797 handwritten digits (UCI, 8x8, 16 grey levels) as a `datasets.DatasetDict` of PIL images.

It ships inside scikit-learn, so the demo and the learning tests need no download.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from datasets import DatasetDict

DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def load_digits_dataset(test_size: float = 0.2, seed: int = 0) -> DatasetDict:
    """scikit-learn's 8x8 digits as a train/test split, stratified by label.

    Args:
        test_size: the share of the images in the test split.
        seed: the seed of the split.

    Returns:
        A `DatasetDict` with "train" and "test"; columns `image` (8x8 PIL "L") and `label` (ClassLabel of 10).
    """
    from datasets import ClassLabel, Dataset, Features, Image

    from ..utils.extras import require

    require("train", "The digits data set", ("sklearn",))
    from sklearn.datasets import load_digits

    digits = load_digits()
    # 0..16 grey levels -> 0..255 uint8 pixels, as an image file would hold them.
    images = (digits.images * (255.0 / 16.0)).round().clip(0, 255).astype(np.uint8)
    features = Features({"image": Image(), "label": ClassLabel(names=DIGIT_NAMES)})
    from PIL import Image as PILImage

    data = {"image": [PILImage.fromarray(img, mode="L") for img in images], "label": digits.target.tolist()}
    dataset = Dataset.from_dict(data, features=features)
    return dataset.train_test_split(test_size=test_size, seed=seed, stratify_by_column="label")
