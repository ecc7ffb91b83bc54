"""A built-in text-to-text task that needs no download: integers written in digits -> English words.

    "4021" -> "four thousand twenty-one"        "700012" -> "seven hundred thousand twelve"

American style, without "and", hyphenated tens ("forty-two"). The pairs are generated deterministically, so the
task is real (a fixed function a model must learn, with carries of structure across positions such as "0" digits
that vanish), small, and the held-out numbers are never seen in training.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import DatasetDict

__all__ = ["load_number_words_dataset", "number_to_words"]

_ONES = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
]  # fmt: skip
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = [(10**9, "billion"), (10**6, "million"), (10**3, "thousand")]
MAX_NUMBER = 10**12 - 1


def _below_thousand(n: int) -> list[str]:
    words = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += [_ONES[hundreds], "hundred"]
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(_TENS[tens] + (f"-{_ONES[ones]}" if ones else ""))
    elif rest:
        words.append(_ONES[rest])
    return words


def number_to_words(n: int) -> str:
    """English words of an integer in [0, 10**12): `number_to_words(4021) == "four thousand twenty-one"`."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"n must be an int, got {type(n).__name__}: {n!r}")
    if not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"n must be in [0, {MAX_NUMBER}], got {n}")
    if n == 0:
        return "zero"
    words = []
    for scale, name in _SCALES:
        count, n = divmod(n, scale)
        if count:
            words += _below_thousand(count) + [name]
    words += _below_thousand(n)
    return " ".join(words)


def load_number_words_dataset(
    max_number: int = 9999,
    num_train: int | None = None,
    num_test: int = 500,
    seed: int = 0,
) -> DatasetDict:
    """Train / test splits of `source` (digits) -> `target` (words) over the integers 0..`max_number`.

    The integers are shuffled with `seed` and cut into disjoint sets: the first `num_test` are held out, the next
    `num_train` (default: all the rest) are for training. Same arguments, same splits.
    """
    for name, value in (("max_number", max_number), ("num_test", num_test), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if not 1 <= max_number <= MAX_NUMBER:
        raise ValueError(f"max_number must be in [1, {MAX_NUMBER}], got {max_number}")
    available = max_number + 1
    if not 1 <= num_test < available:
        raise ValueError(f"num_test must be in [1, {available - 1}] for max_number={max_number}, got {num_test}")
    if num_train is None:
        num_train = available - num_test
    if not isinstance(num_train, int) or not 1 <= num_train <= available - num_test:
        raise ValueError(
            f"num_train must be an int in [1, {available - num_test}] (max_number={max_number}, "
            f"num_test={num_test}), got {num_train!r}"
        )
    from datasets import Dataset, DatasetDict

    # sample() draws distinct integers without building the whole range in memory.
    numbers = random.Random(seed).sample(range(available), num_test + num_train)

    def build(chunk: list[int]) -> Dataset:
        return Dataset.from_dict({"source": [str(n) for n in chunk], "target": [number_to_words(n) for n in chunk]})

    return DatasetDict({"train": build(numbers[num_test:]), "test": build(numbers[:num_test])})
