"""Value checks shared by the configuration classes: each raises a `ValueError` (or `TypeError` for a value of the
wrong type) naming the field, the value and what was expected.

A configuration class lists the kind of each of its fields once (`FIELD_CHECKS`, name -> check) and calls
`check_fields` on its arguments before anything else (before transformers' own `PretrainedConfig.__init__`, which
would otherwise choke on some of them first, e.g. `num_labels=2.0`), then checks the relations between fields.
Numbers must be finite; ints are ints (`2.0` is refused, not truncated), bools are bools, strings are strings.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import re
import warnings
from collections.abc import Callable, Iterable

from transformers import PretrainedConfig
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


# The largest standard deviation of an initialisation: weights drawn wider than 1 overflow a deep network's
# activations into inf/NaN at the first forward (2**31 gave a NaN loss), and no recipe draws them wider.
MAX_INIT_STD = 1.0


def check_init_std(name: str, value) -> None:
    """A standard deviation of weights at initialisation: a finite number in (0, `MAX_INIT_STD`]."""
    check_positive_number(name, value)
    if value > MAX_INIT_STD:
        raise ValueError(
            f"`{name}` is the standard deviation of the initial weights: at most {MAX_INIT_STD} (transformers' "
            f"models use about 0.02), got {value!r}."
        )


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


# Names that parts of transformers other than the config classes write into or read from a config dict (the Auto
# classes' remote code, tokenizers, pipelines, the config.json of older versions): no config class declares them, so
# introspection cannot find them.
_TRANSFORMERS_EXTRA_KEYS = frozenset(
    {"auto_map", "custom_pipelines", "tokenizer_class", "task_specific_params", "_attn_implementation_autoset"}
)
# `kwargs.pop("name", ...)` / `kwargs.get("name", ...)` in the source of transformers' base config
_KWARGS_READ = re.compile(r"""kwargs\.(?:pop|get)\(\s*["'](\w+)["']""")


def config_class_names(config_class: type) -> set[str]:
    """The keyword names a config class declares (through its bases, down to transformers' base config).

    Args:
        config_class: a subclass of transformers' `PretrainedConfig` (or the class itself).

    Returns:
        Its dataclass fields, the named parameters of the `__init__` of each class of its MRO, its settable
        properties (e.g. `num_labels`) and the keys and values of its `attribute_map`s (e.g. GPT-2's `n_embd` and
        the `hidden_size` it stands for).
    """
    names: set[str] = set()
    if dataclasses.is_dataclass(config_class):
        names.update(field.name for field in dataclasses.fields(config_class))
    for cls in config_class.__mro__:
        if not issubclass(cls, PretrainedConfig):
            continue
        init = vars(cls).get("__init__")
        if init is not None:
            try:
                parameters = inspect.signature(init).parameters.values()
            except (TypeError, ValueError):  # no signature to read (a builtin)
                parameters = ()
            variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            names.update(p.name for p in parameters if p.name != "self" and p.kind not in variadic)
        names.update(name for name, value in vars(cls).items() if isinstance(value, property) and value.fset)
        attribute_map = vars(cls).get("attribute_map")
        if isinstance(attribute_map, dict):
            names.update(key for key in attribute_map if isinstance(key, str))
            names.update(value for value in attribute_map.values() if isinstance(value, str))
    return names


def keywords_read_by(function) -> set[str]:
    """The keyword arguments a function takes out of its `**kwargs` by name, read from its source.

    Args:
        function: a function whose source has `kwargs.pop("name", ...)` or `kwargs.get("name", ...)` calls.

    Returns:
        The names it reads; none where the source cannot be read (e.g. a build without `.py` files).
    """
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return set()
    return set(_KWARGS_READ.findall(source))


@functools.cache
def pretrained_config_names() -> frozenset[str]:
    """The keyword arguments transformers' base config accepts or writes, computed once per process (cheap: a few
    milliseconds, no import of any model).

    Returns:
        `PretrainedConfig`'s fields, `__init__` parameters, settable properties and `attribute_map`; the keys it
        takes out of its kwargs (`torch_dtype`, `num_labels`, `attn_implementation`, ...); the keys of the dict a
        default config saves (`model_type`, `_name_or_path`, ...); the generation parameters, which it accepts and
        drops (`max_length`, `num_beams`, ...); and the few names the rest of transformers keeps in a config dict
        (`auto_map`, `tokenizer_class`, ...).
    """
    from transformers import GenerationConfig

    names = config_class_names(PretrainedConfig)
    for method in ("__init__", "__post_init__"):
        if callable(getattr(PretrainedConfig, method, None)):
            names |= keywords_read_by(getattr(PretrainedConfig, method))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names.update(PretrainedConfig().to_dict())
        names.update(GenerationConfig().to_dict())
    return frozenset(names | _TRANSFORMERS_EXTRA_KEYS)


@functools.cache
def transformers_config_names() -> frozenset[str]:
    """The keyword arguments transformers' configs accept: those of its base config and the names every config
    registered in `transformers.CONFIG_MAPPING` declares (`config_class_names`: e.g. GPT-2's `layer_norm_epsilon`
    and `n_embd`, Llama's `rms_norm_eps`, Falcon's `hidden_dropout`).

    Computed once per process, and only when needed: it imports every config module of transformers (about 3 s for
    the ~800 configs of transformers 5).

    Returns:
        The set of names.
    """
    from transformers import CONFIG_MAPPING

    names = set(pretrained_config_names())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (deprecated models may warn on import)
        for model_type in list(CONFIG_MAPPING.keys()):
            try:
                config_class = CONFIG_MAPPING[model_type]
            except Exception:  # a config that cannot be imported here: its names are not needed to build ours
                continue
            names |= config_class_names(config_class)
    return frozenset(names)


def config_classes_named(name: str) -> list[type]:
    """The config classes defined so far with a given class name.

    Args:
        name: a class name, e.g. "ViTPlusConfig".

    Returns:
        The subclasses of transformers' `PretrainedConfig` with that `__name__` (more than one where the same code
        was loaded twice, e.g. from the package and as a checkpoint's remote code).
    """
    found, seen, stack = [], set(), [PretrainedConfig]
    while stack:
        for subclass in stack.pop().__subclasses__():
            if subclass not in seen:
                seen.add(subclass)
                stack.append(subclass)
                if subclass.__name__ == name:
                    found.append(subclass)
    return found


def check_transformers_kwargs(
    config_name: str, kwargs: dict, fields: Iterable[str], *, config_class: type | None = None
) -> None:
    """Check the keyword arguments a config passes on to transformers.

    `num_labels` must be a positive int within bounds. An unknown name that looks like a typo of a field gets a
    `UserWarning` naming the closest field (transformers keeps unknown keys silently), unless it is a name that
    transformers knows: one its base config accepts or writes (`pretrained_config_names`), one its configs declare
    (`transformers_config_names`), or one of the config class's own (its `attribute_map`'s keys and values, its
    `__init__` parameters). The names of transformers are looked up lazily: a config built from its own fields
    only never computes them, and the configs of transformers are imported only for a name close to a field.

    Args:
        config_name: the config class's name (for the message; also how the class is found when `config_class`
            is not given).
        kwargs: the keyword arguments the config did not take as its own fields.
        fields: the config's field names.
        config_class: the config class, when the caller has it.
    """
    if "num_labels" in kwargs:
        check_int("num_labels", kwargs["num_labels"], minimum=1, maximum=MAX_LABELS)
    fields = set(fields)
    unknown = [key for key in kwargs if key not in fields]
    if not unknown:
        return
    base = pretrained_config_names()
    unknown = [key for key in unknown if key not in base]
    if not unknown:
        return
    classes = [config_class] if config_class is not None else config_classes_named(config_name)
    own = set().union(*(config_class_names(cls) for cls in classes))
    aliases = {key for cls in classes for key in (getattr(cls, "attribute_map", None) or {})}
    candidates = sorted(fields | aliases)
    for key in unknown:
        if key in own:
            continue
        close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.8)
        if close and key not in transformers_config_names():
            warnings.warn(
                f"{config_name} got an unknown field {key!r} (kept, unused): did you mean {close[0]!r}?",
                UserWarning,
                stacklevel=3,
            )
