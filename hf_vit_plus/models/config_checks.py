"""Value checks shared by the configuration classes: each raises a `ValueError` (or `TypeError` for a value of the
wrong type) naming the field, the value and what was expected.

A configuration class lists the kind of each of its fields once (`FIELD_CHECKS`, name -> check) and calls
`check_fields` on its arguments before anything else (before transformers' own `PretrainedConfig.__init__`, which
would otherwise choke on some of them first, e.g. `num_labels=2.0`), then checks the relations between fields.
Numbers must be finite; ints are ints (`2.0` is refused, not truncated), bools are bools, strings are strings.
"""

from __future__ import annotations

import difflib
import math
import warnings
from collections.abc import Callable, Iterable

from transformers.activations import ACT2FN

# The largest size a field may take: token ids and sizes are indexed with int32 in places, and a larger value is a
# mistake long before it is a model (a larger embedding would not fit in any memory either).
MAX_SIZE = 2**31 - 1
MAX_LABELS = 2**20  # transformers' config builds an id -> label dict of this size before any check of ours


class FieldTypeError(TypeError, ValueError):
    """A config field of the wrong type: a TypeError, and a ValueError like every other bad config value (callers
    that catch the ValueError of a bad config catch it too)."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value, minimum: int = 1, maximum: int = MAX_SIZE) -> None:
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if not _is_int(value):
        raise FieldTypeError(f"`{name}` must be {what}, got {value!r} ({type(value).__name__}).")
    if value < minimum:
        raise ValueError(f"`{name}` must be {what}, got {value!r}.")
    if value > maximum:
        raise ValueError(f"`{name}` must be at most {maximum:,}, got {value:,}.")


def check_positive_int(name: str, value) -> None:
    check_int(name, value, minimum=1)


def check_non_negative_int(name: str, value) -> None:
    check_int(name, value, minimum=0)


def check_optional_positive_int(name: str, value) -> None:
    if value is not None:
        check_int(name, value, minimum=1)


def check_positive_number(name: str, value) -> None:
    """A finite number > 0 (NaN and infinity refused: they train NaN models)."""
    if not _is_number(value):
        raise FieldTypeError(f"`{name}` must be a finite positive number, got {value!r} ({type(value).__name__}).")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite positive number, got {value!r}.")


def check_probability(name: str, value) -> None:
    if not _is_number(value):
        raise FieldTypeError(f"`{name}` must be a probability in [0, 1), got {value!r} ({type(value).__name__}).")
    if not 0.0 <= value < 1.0:  # NaN fails both comparisons
        raise ValueError(f"`{name}` must be a probability in [0, 1), got {value!r}.")


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise FieldTypeError(f"`{name}` must be True or False, got {value!r} ({type(value).__name__}).")


def check_str(name: str, value) -> None:
    if not isinstance(value, str):
        raise FieldTypeError(f"`{name}` must be a string, got {value!r} ({type(value).__name__}).")


def check_divisible(name: str, value: int, divisor_name: str, divisor: int, why: str = "") -> None:
    if value % divisor != 0:
        raise ValueError(f"`{name}` ({value}) must be divisible by `{divisor_name}` ({divisor}){why}.")


def check_activation(name: str, value) -> None:
    check_str(name, value)
    if value not in ACT2FN:
        raise ValueError(f"`{name}` {value!r} is not a known activation ({sorted(ACT2FN)}).")


def check_choice(name: str, value, choices: tuple) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"Unknown `{name}` {value!r}: expected one of {choices}.")


def choice(choices: tuple) -> Callable[[str, object], None]:
    """The check of a field that takes one of `choices`."""
    return lambda name, value: check_choice(name, value, choices)


def check_token_id(name: str, value, vocab_size: int) -> None:
    if value is None:
        return
    if not _is_int(value) or not 0 <= value < vocab_size:
        raise ValueError(f"`{name}` must be None or a token id in [0, vocab_size={vocab_size}), got {value!r}.")


def check_fields(values: dict, checks: dict[str, Callable[[str, object], None]]) -> None:
    """Run each field's check on its value (the fields `values` holds)."""
    for name, check in checks.items():
        if name in values:
            check(name, values[name])


# Keyword arguments that transformers' configs take or write besides the fields (not typos).
_TRANSFORMERS_KEYS = {
    "num_labels", "id2label", "label2id", "architectures", "auto_map", "transformers_version", "dtype", "torch_dtype",
    "name_or_path", "_name_or_path", "output_attentions", "output_hidden_states", "return_dict", "problem_type",
    "is_encoder_decoder", "chunk_size_feed_forward", "tokenizer_class", "task_specific_params", "model_type",
    "attn_implementation", "_attn_implementation", "_attn_implementation_autoset", "use_return_dict",
}  # fmt: skip


def check_transformers_kwargs(config_name: str, kwargs: dict, fields: Iterable[str]) -> None:
    """The keyword arguments a config passes on to transformers: `num_labels` a positive int within bounds, and a
    `UserWarning` naming the closest field for an unknown name that looks like a typo of one (transformers keeps
    unknown keys silently)."""
    if "num_labels" in kwargs:
        check_int("num_labels", kwargs["num_labels"], minimum=1, maximum=MAX_LABELS)
    fields = sorted(fields)
    for key in kwargs:
        if key in _TRANSFORMERS_KEYS or key in fields:
            continue
        close = difflib.get_close_matches(key, fields, n=1, cutoff=0.8)
        if close:
            warnings.warn(
                f"{config_name} got an unknown field {key!r} (kept, unused): did you mean {close[0]!r}?",
                UserWarning,
                stacklevel=3,
            )
