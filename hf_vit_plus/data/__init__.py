"""Built-in data sets that need no network, and loaders for user data."""

from .digits import DIGIT_NAMES, load_digits_dataset

__all__ = ["DIGIT_NAMES", "load_digits_dataset"]
