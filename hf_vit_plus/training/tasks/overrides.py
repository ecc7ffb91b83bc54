"""Checking --config_overrides: parsing 'name=value,...', refusing names the config class does not have (naming the
closest one), and reporting a config that refuses its values as a user error. Shared by every family's
`build_config` and by `hf-vit-plus train`'s checks before a run starts."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from transformers import PretrainedConfig

from ...errors import UsageError
from ..options import ModelArguments


def parse_overrides(text: str | None) -> dict[str, Any]:
    """Parse the text of --config_overrides.

    Values become bools (true / false), None (none / null), ints, floats, or else stay strings.

    Example:
        `parse_overrides("a=1,b=0.5,c=gelu,d=true")` is `{"a": 1, "b": 0.5, "c": "gelu", "d": True}`.

    Args:
        text: comma-separated `name=value` items; None or "" for none.

    Returns:
        Field name -> value.

    Raises:
        UsageError: an item without `=` or without a name.
    """
    result: dict[str, Any] = {}
    if not text:
        return result
    for item in text.split(","):
        if "=" not in item:
            raise UsageError(f"--config_overrides expects 'name=value' items separated by commas, got {item!r}.")
        key, value = (part.strip() for part in item.split("=", 1))
        if not key:
            raise UsageError(f"--config_overrides: an item has no field name, got {item!r}.")
        lowered = value.lower()
        if lowered in ("true", "false"):
            result[key] = lowered == "true"
        elif lowered in ("none", "null"):
            result[key] = None
        else:
            for kind in (int, float):
                try:
                    result[key] = kind(value)
                    break
                except ValueError:
                    continue
            else:
                result[key] = value
    return result


def config_fields(config_class: type) -> set[str]:
    """The field names a config class accepts.

    Its own `__init__` parameters (and those of the project classes it derives from), `PretrainedConfig`'s standard
    fields (`id2label`, `num_labels`, ...) and its `attribute_map` aliases (e.g. `hidden_size` for the
    encoder-decoder's `d_model`).

    Args:
        config_class: a `PretrainedConfig` subclass.

    Returns:
        The accepted names.
    """
    names: set[str] = set()
    for cls in config_class.__mro__:
        if cls is PretrainedConfig or not issubclass(cls, PretrainedConfig):
            break
        if "__init__" in vars(cls):
            for name, parameter in inspect.signature(cls.__init__).parameters.items():
                if name != "self" and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                    names.add(name)
        if dataclasses.is_dataclass(cls) and cls is not PretrainedConfig:
            names.update(f.name for f in dataclasses.fields(cls))
    names.update(PretrainedConfig().to_dict())
    # settable properties of the base class, e.g. num_labels (it resizes id2label / label2id)
    names.update(name for name, value in vars(PretrainedConfig).items() if isinstance(value, property) and value.fset)
    names.update(getattr(config_class, "attribute_map", {}) or {})
    return {name for name in names if not name.startswith("_")} - {"model_type", "transformers_version"}


def check_config_overrides(config_class: type, overrides: dict[str, Any]) -> None:
    """Refuse the keys of `overrides` that are not fields of `config_class`, naming the closest valid field.

    transformers configs would keep unknown keys silently.

    Args:
        config_class: the class of the config the overrides go to.
        overrides: field name -> value, from `parse_overrides`.

    Raises:
        UsageError: a key that is not a field of `config_class`.
    """
    valid = config_fields(config_class)
    model_type = getattr(config_class, "model_type", None) or config_class.__name__
    for key in overrides:
        if key in valid:
            continue
        close = difflib.get_close_matches(key, sorted(valid), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"expected one of {sorted(valid)}."
        raise UsageError(f"Unknown config field {key!r} for {model_type}; {hint}")


@contextmanager
def config_value_errors(args: ModelArguments) -> Iterator[None]:
    """Report a config that refuses its values (from --config_name / --config_overrides) as a `UsageError`.

    Config constructors only validate, so their `ValueError`s and `TypeError`s are about the user's values.

    Args:
        args: the run's model options (the message quotes --config_overrides).

    Raises:
        UsageError: the config raised `ValueError` or `TypeError` within the context.
    """
    try:
        yield
    except UsageError:
        raise
    except (ValueError, TypeError) as error:
        given = f" (--config_overrides {args.config_overrides!r})" if args.config_overrides else ""
        raise UsageError(f"Invalid model config{given}: {error}") from error
