"""Value checks shared by the configuration classes: each raises a `ValueError` (or `TypeError` for a value of the
wrong type) naming the field, the value and what was expected.

A configuration class lists the kind of each of its fields once (`FIELD_CHECKS`, name -> check) and calls
`check_fields` on its arguments before anything else (before transformers' own `PretrainedConfig.__init__`, which
would otherwise choke on some of them first, e.g. `num_labels=2.0`), then checks the relations between fields.
Numbers must be finite; ints are ints (`2.0` is refused, not truncated), bools are bools, strings are strings.
The keywords a config does not take as its own parameters go through `check_transformers_kwargs`: another config's
name of a field sets the field, and any other keyword that no part of the config uses is a logged warning.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import logging
import math
import re
import warnings
from collections.abc import Callable

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


class FromDictChecksMixin:
    """Inherited before `PretrainedConfig` by the configs whose `__init__` ends with `validate_fields()`: transformers
    sets the keyword arguments of `from_pretrained` after the config is built (`from_pretrained(folder,
    image_size=32)`), so `from_dict` runs the same checks again, and a combination they make that cannot work is
    refused by name."""

    def validate_fields(self) -> None:
        """Raise a `ValueError` (`TypeError`) naming the offending values if the fields do not describe a valid
        model."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> PretrainedConfig | tuple[PretrainedConfig, dict]:
        """transformers' `from_dict`, then the checks of `__init__` again (`validate_fields`).

        Args:
            config_dict: the saved fields.
            **kwargs: fields set on top, and transformers' own options of `from_dict` (`return_unused_kwargs`).

        Returns:
            The config (with the unused keyword arguments, where `return_unused_kwargs=True`).

        Raises:
            ValueError: fields that cannot work together, named.
        """
        result = super().from_dict(config_dict, **kwargs)
        (result[0] if isinstance(result, tuple) else result).validate_fields()
        return result


# Names that parts of transformers other than the config classes write into or read from a config dict (the Auto
# classes' remote code, tokenizers, pipelines, the config.json of older versions; `Trainer` sets `use_cache` on every
# model's config, and its base config's own check of generation settings exempts it; a quantized model's
# `from_pretrained` sets `quantization_config`): no config class declares them, so introspection cannot find them. A
# folder transformers saved loads without a warning.
_TRANSFORMERS_EXTRA_KEYS = frozenset(
    {"auto_map", "custom_pipelines", "tokenizer_class", "task_specific_params", "_attn_implementation_autoset",
     "use_cache", "quantization_config"}
)  # fmt: skip
# `kwargs.pop("name", ...)` / `kwargs.get("name", ...)` in the source of transformers' base config
_KWARGS_READ = re.compile(r"""kwargs\.(?:pop|get)\(\s*["'](\w+)["']""")
# How close (difflib's ratio) an unknown keyword must be to a known name for the warning to suggest that name.
_NEAR_MISS_CUTOFF = 0.6

# In the package, under its own logger (transformers' verbosity rules it: hf_vit_plus.utils.logging); as a
# checkpoint's remote code, under transformers' logger, for the same reason.
logger = logging.getLogger(__name__ if __name__.startswith("hf_vit_plus.") else f"transformers.{__name__}")


# The names other transformers configs give the fields of a config named as transformers' ViT is (`hidden_size`,
# `num_hidden_layers`, ...), where the meaning is the same: GPT-2's, BART's, T5's, Falcon's and OPT's. A config puts
# them in its `attribute_map`, so that such a keyword sets the field (and reads it back) instead of being kept unused.
HIDDEN_SIZE_STYLE_ALIASES = {
    **dict.fromkeys(("n_embd", "d_model"), "hidden_size"),
    **dict.fromkeys(("num_layers", "n_layer", "n_layers"), "num_hidden_layers"),
    **dict.fromkeys(("n_head", "num_heads"), "num_attention_heads"),
    **dict.fromkeys(("n_inner", "ffn_dim", "d_ff"), "intermediate_size"),
    "activation_function": "hidden_act",
    "layer_norm_epsilon": "layer_norm_eps",
    **dict.fromkeys(("hidden_dropout", "dropout"), "hidden_dropout_prob"),
    **dict.fromkeys(("attention_dropout", "attn_pdrop"), "attention_probs_dropout_prob"),
    "init_std": "initializer_range",
}
# Keys transformers' base config reads for rotary position embeddings, which none of the models has.
_UNUSED_BASE_KEYS = frozenset({"rope_scaling", "rope_theta"})


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
    """The keyword arguments transformers' base config takes and keeps, computed once per process from the installed
    transformers (a few milliseconds, no import of any model).

    Returns:
        `PretrainedConfig`'s fields, `__init__` parameters, settable properties and `attribute_map`; the keys it
        takes out of its kwargs (`torch_dtype`, `num_labels`, `attn_implementation`, ...); the keys of the dict a
        default config saves (`model_type`, `_name_or_path`, ...); and the few names the rest of transformers keeps
        in a config dict (`auto_map`, `tokenizer_class`, ...). Generation settings are not among them
        (`generation_setting_names`).
    """
    names = config_class_names(PretrainedConfig)
    for method in ("__init__", "__post_init__"):
        if callable(getattr(PretrainedConfig, method, None)):
            names |= keywords_read_by(getattr(PretrainedConfig, method))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names.update(PretrainedConfig().to_dict())
    return frozenset((names | _TRANSFORMERS_EXTRA_KEYS) - _UNUSED_BASE_KEYS)


@functools.cache
def generation_setting_names() -> frozenset[str]:
    """The settings of transformers' `GenerationConfig` that its base model config does not take (`num_beams`,
    `max_length`, ...): a model config does not use them (transformers drops most of them from its keywords).

    Returns:
        The names of a default `GenerationConfig`'s dict, less `pretrained_config_names()`.
    """
    from transformers import GenerationConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return frozenset(GenerationConfig().to_dict()) - pretrained_config_names()


@functools.cache
def _init_defaults(config_class: type) -> dict:
    """The default of each named parameter of `config_class.__init__`."""
    try:
        parameters = inspect.signature(config_class.__init__).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def check_transformers_kwargs(
    config_class: type, kwargs: dict, values: dict | None = None, checks: dict | None = None
) -> None:
    """Check the keyword arguments a config does not take as its own parameters, before it passes them on to
    transformers' base config: none is dropped silently.

    - `num_labels` must be a positive int within bounds.
    - A name of the config's `attribute_map` (the names other transformers configs give the same field:
      `num_layers`, `n_embd`, `layer_norm_epsilon`, ...) is checked as that field (`checks`) and then set as it, by
      transformers; given together with the field itself at another value, it is a `ValueError` naming both.
    - A name transformers' base config takes and keeps (`num_labels`, `id2label`, `dtype`, `output_attentions`, ...)
      passes.
    - Any other name is logged as a warning through the package's logger, which transformers' verbosity rules: a
      generation setting (`num_beams`, ...) as one that belongs in the model's `generation_config`; a name the
      config class lists in `ambiguous_names` (e.g. the encoder-decoder's `num_layers`) with the fields it may
      mean; anything else, with the nearest known name (a typo of a field, or of transformers' own keys such as
      `output_attention`). transformers keeps such a keyword as an attribute, unused.

    The names of transformers are read from its base config and `GenerationConfig` (a few milliseconds, once per
    process), and only when a keyword is not the config's own; no other config of transformers is imported.

    Args:
        config_class: the config class (its `attribute_map`, `ambiguous_names`, `__init__` and name).
        kwargs: the keyword arguments the config did not take as its own parameters.
        values: the config's own parameters as given (its `__init__`'s `locals()`), to find a field given under
            two names.
        checks: the config's field checks (name -> check), run on a value given under another name.
    """
    if "num_labels" in kwargs:
        check_int("num_labels", kwargs["num_labels"], minimum=1, maximum=MAX_LABELS)
    if not kwargs:
        return
    config_name = config_class.__name__
    aliases = dict(getattr(config_class, "attribute_map", None) or {})
    for key, value in kwargs.items():
        field = aliases.get(key)
        if field is None:
            continue
        if checks and field in checks:
            checks[field](key, value)
        default = _init_defaults(config_class).get(field, inspect.Parameter.empty)
        given = (values or {}).get(field, default)
        if given is not default and given != default and given != value:
            raise ValueError(
                f"{config_name} got `{field}`={given!r} and `{key}`={value!r}: `{key}` is another name of "
                f"`{field}`; give one of them."
            )
    unknown = [key for key in kwargs if key not in aliases and key != "num_labels"]
    if not unknown:
        return
    base = pretrained_config_names()
    unknown = [key for key in unknown if key not in base]
    if not unknown:
        return
    own = config_class_names(config_class)
    generation = generation_setting_names()
    ambiguous = getattr(config_class, "ambiguous_names", None) or {}
    candidates = sorted(own | base | generation)
    for key in unknown:
        if key in own and key not in generation:
            continue
        kept = " (kept in the config, unused)"
        if key in ambiguous:
            fields = " and ".join(f"`{name}`" for name in ambiguous[key])
            hint = f"it may mean {fields}: set those"
        elif key in generation:
            kept = ""
            hint = "it is a generation setting, not a model config's: set it on the model's `generation_config`"
        else:
            close = difflib.get_close_matches(key, candidates, n=1, cutoff=_NEAR_MISS_CUTOFF)
            if close:
                target = f" (`{aliases[close[0]]}`)" if close[0] in aliases else ""
                hint = f"did you mean `{close[0]}`{target}?"
            else:
                hint = "no field has a similar name"
        logger.warning("%s does not use `%s`=%.60r%s: %s", config_name, key, kwargs[key], kept, hint)
