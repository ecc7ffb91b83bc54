"""Value checks shared by the configuration classes: each raises a `ValueError` naming the field and the value."""

from __future__ import annotations

from transformers.activations import ACT2FN


def check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")


def check_positive_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"`{name}` must be a positive number, got {value!r}.")


def check_probability(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a probability in [0, 1), got {value!r}.")


def check_divisible(name: str, value: int, divisor_name: str, divisor: int, why: str = "") -> None:
    if value % divisor != 0:
        raise ValueError(f"`{name}` ({value}) must be divisible by `{divisor_name}` ({divisor}){why}.")


def check_activation(name: str, value) -> None:
    if value not in ACT2FN:
        raise ValueError(f"`{name}` {value!r} is not a known activation ({sorted(ACT2FN)}).")


def check_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"Unknown `{name}` {value!r}: expected one of {choices}.")


def check_token_id(name: str, value, vocab_size: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise ValueError(f"`{name}` must be None or a token id in [0, vocab_size={vocab_size}), got {value!r}.")
