"""Run files: a run's options in a `.yaml` or `.json` file, in place of the flags.

`hf-vit-plus train FAMILY RUN_FILE [flags]` reads the file's options and the flags given with it on top, as the example
scripts of transformers take their options from one `.json` file (`HfArgumentParser.parse_json_file` /
`parse_yaml_file`). Keys are the flags' names (underscores or dashes; the pre-0.3 names too); a value is what the flag
would take (a number, true / false, a string, a list for a flag of several values) or null. A run writes such a file,
its resolved options, as OUTPUT_DIR/run_config.yaml (`run_config.py`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from pathlib import Path
from typing import Any

from ..cli_utils import one_of, parse_bool
from ..errors import UsageError
from .options import RENAMED, base_type, flag_fields

RUN_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def read_run_file(path: str | os.PathLike, family: str) -> dict[str, Any]:
    """The options of a run file, checked against `family`'s flags.

    Args:
        path: a `.yaml`, `.yml` or `.json` file.
        family: the family the run trains; a file that names another (`family:`) is refused.

    Returns:
        Option name -> value (None where the file says null).

    Raises:
        UsageError: a missing or unreadable file, another family's file, an unknown key (named with the closest
            option) or a value of the wrong kind.
    """
    location = Path(path)
    name = location.name
    if location.suffix.lower() not in RUN_FILE_SUFFIXES:
        raise UsageError(f"The run file {str(path)!r} must be a {one_of(RUN_FILE_SUFFIXES)} file of options.")
    if not location.is_file():
        raise UsageError(f"The run file {str(path)!r} does not exist.")
    text = location.read_text(encoding="utf-8")
    try:
        if location.suffix.lower() == ".json":
            content = json.loads(text)
        else:
            import yaml

            content = yaml.safe_load(text)
    except ValueError as error:  # json.JSONDecodeError and yaml.YAMLError's parser errors
        raise UsageError(f"The run file {str(path)!r} cannot be read: {error}") from None
    except Exception as error:  # yaml.YAMLError (yaml is imported lazily)
        raise UsageError(f"The run file {str(path)!r} cannot be read: {error}") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise UsageError(f"The run file {name!r} must hold option: value pairs, got a {type(content).__name__}.")
    flags = {flag.name: flag for flag in flag_fields(family)}
    others = {flag.name for flag in flag_fields()}
    values: dict[str, Any] = {}
    for key, value in content.items():
        option = str(key).replace("-", "_")
        option = RENAMED.get(option, option)
        if option == "family":
            if value != family:
                raise UsageError(
                    f"The run file {name!r} holds the options of a {value} run: use it with `hf-vit-plus train "
                    f"{value}`, not {family}."
                )
            continue
        if option not in flags:
            if option in others:
                raise UsageError(f"{key!r} in the run file {name!r} is not an option of the {family} family.")
            close = difflib.get_close_matches(option, list(flags), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"see `hf-vit-plus train {family} --help`."
            raise UsageError(f"Unknown option {key!r} in the run file {name!r}; {hint}")
        values[option] = _value(flags[option], value, f"{key!r} in the run file {name!r}")
    return values


def _value(flag: dataclasses.Field, value: Any, where: str) -> Any:
    """A run file's value as the flag would take it: strings are read as the flag reads its text."""
    if value is None:
        return None
    kind = base_type(flag)
    if "nargs" in flag.metadata:  # a list of strings
        items = value.split() if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise UsageError(f"{where} must be a list of names, got {value!r}.")
        return list(items)
    try:
        if kind is bool:
            value = value if isinstance(value, bool) else parse_bool(str(value))
        elif kind is int and isinstance(value, str):
            value = int(value)
        elif kind is float and isinstance(value, str):
            value = float(value)
        elif kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # e.g. `save_steps: 100`
    except (ValueError, TypeError) as error:
        raise UsageError(f"{where} must be a {kind.__name__}, got {value!r} ({error}).") from None
    choices = flag.metadata["choices"]
    if choices is not None and value not in choices:
        raise UsageError(f"{where} must be {one_of(repr(choice) for choice in choices)}, got {value!r}.")
    return value


__all__ = ["RUN_FILE_SUFFIXES", "read_run_file"]
