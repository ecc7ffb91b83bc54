"""The schema of --fsdp_config, next to the sharding it tunes (`sharding.py`): transformers' `fsdp_config` keys
(`TrainingArguments.fsdp_config`, an `fsdp_` prefix allowed), what each means, and its check. A light module (no
torch): the command line's help and the checks of the options read it before anything is imported.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from typing import Any

from ..cli_utils import one_of
from ..errors import UsageError, check_exists


def _boolean(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise UsageError(f"--fsdp_config {key} must be true or false, got {value!r}.")


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def check(key: str, value) -> str:
        if not isinstance(value, str) or value.upper() not in choices:
            raise UsageError(f"--fsdp_config {key} must be {one_of(choices)}, got {value!r}.")
        return value.upper()

    return check


def _class_names(key: str, value) -> list[str]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise UsageError(f"--fsdp_config {key} must be a class name or a list of them, got {value!r}.")
    return [n.strip() for n in names]


def _version(key: str, value) -> int:
    if isinstance(value, bool) or value not in (1, 2, "1", "2"):
        raise UsageError(f"--fsdp_config {key} must be 2 (FSDP2), got {value!r}.")
    return int(value)


PRECISIONS = ("bf16", "fp16", "fp32")
POLICY_FIELDS = ("param_dtype", "reduce_dtype", "output_dtype")


def _precision_policy(key: str, value):
    if isinstance(value, str) and value in PRECISIONS:
        return value
    if isinstance(value, dict) and value and all(k in POLICY_FIELDS and v in PRECISIONS for k, v in value.items()):
        return dict(value)
    raise UsageError(
        f"--fsdp_config {key} must be one of {PRECISIONS} or an object of {', '.join(POLICY_FIELDS)} -> one of "
        f'them (e.g. {{"param_dtype": "bf16", "reduce_dtype": "fp32"}}), got {value!r}.'
    )


FSDP_CONFIG_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "version": ("2 (FSDP2, the default; 1 is refused)", _version),
    "reshard_after_forward": ("free gathered parameters after each unit's forward, default true", _boolean),
    "activation_checkpointing": ("as --activation_checkpointing", _boolean),
    "cpu_offload": ("keep parameters on the CPU between uses (GPU runs)", _boolean),
    "cpu_ram_efficient_loading": (
        "only the main process reads --model_name_or_path's weights, the others receive them, default false",
        _boolean,
    ),
    "state_dict_type": (
        "training checkpoints SHARDED_STATE_DICT (default) or FULL_STATE_DICT",
        _choice("SHARDED_STATE_DICT", "FULL_STATE_DICT"),
    ),
    "auto_wrap_policy": (
        "TRANSFORMER_BASED_WRAP (the model's layers, default) or NO_WRAP",
        _choice("TRANSFORMER_BASED_WRAP", "NO_WRAP"),
    ),
    "transformer_layer_cls_to_wrap": ("layer classes to wrap (default: the model's _no_split_modules)", _class_names),
    "mixed_precision_policy": (
        "bf16, or {param_dtype, reduce_dtype, output_dtype: bf16|fp16|fp32}",
        _precision_policy,
    ),
}


def fsdp_config_help() -> str:
    """The help of --fsdp_config: the keys and what each means."""
    keys = "; ".join(f"{key}: {what}" for key, (what, _) in FSDP_CONFIG_KEYS.items())
    return f"FSDP settings with --fsdp: a JSON file or object with transformers' fsdp_config keys ({keys})"


def read_fsdp_config(value: str) -> dict:
    """--fsdp_config (a JSON file, or a JSON object on the command line) as a dict of `FSDP_CONFIG_KEYS`.

    Args:
        value: the path of a JSON file, or a JSON object.

    Returns:
        Key (without its `fsdp_` prefix) -> the checked value.

    Raises:
        UsageError: a missing file, invalid JSON, an unknown key (named with the closest) or a bad value.
    """
    text = str(value).strip()
    if not text.startswith(("{", "[")):
        path = check_exists(text, "--fsdp_config", "file")
        text = path.read_text()
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--fsdp_config {str(value)!r} is not valid JSON: {error}.") from None
    if not isinstance(config, dict):
        raise UsageError(f"--fsdp_config must be a JSON object, got {type(config).__name__}.")
    options = {}
    for key, item in config.items():
        name = key.removeprefix("fsdp_")
        if name not in FSDP_CONFIG_KEYS:
            close = difflib.get_close_matches(name, FSDP_CONFIG_KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(
                f"--fsdp_config has an unknown key {key!r}: {hint}expected {one_of(list(FSDP_CONFIG_KEYS))}."
            )
        options[name] = FSDP_CONFIG_KEYS[name][1](key, item)
    return options


__all__ = ["FSDP_CONFIG_KEYS", "fsdp_config_help", "read_fsdp_config"]
