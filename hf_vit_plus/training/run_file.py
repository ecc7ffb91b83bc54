"""Run files: a run's options in a `.yaml` or `.json` file, in place of the flags.

`hf-vit-plus train FAMILY RUN_FILE [flags]` reads the file's options and the flags given with it on top, as the example
scripts of transformers take their options from one `.json` file (`HfArgumentParser.parse_json_file` /
`parse_yaml_file`). Keys are the flags' names (underscores or dashes; the pre-0.3 names too); a value is what the flag
would take (a number, true / false, a string, a list for a flag of several values) or null.

A run writes such a file, its resolved options (every value its plan decided), as OUTPUT_DIR/run_config.yaml
(`write_run_config`); `--print_config` prints the same text (`run_config_text`), and `hf-vit-plus train FAMILY
OUTPUT_DIR/run_config.yaml` repeats the run. A comment names who chose each value that was not given (the family, the
recipe, the data, the launcher); read back, a value equal to that choice is again that choice's (`plan.build_plan`),
so the repeated run starts with the same lines and prints the same file.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cli_utils import one_of, parse_bool
from ..errors import UsageError
from .options import OPTION_GROUPS, RENAMED, applies, base_type, flag_fields, group_fields

if TYPE_CHECKING:  # the plan's module imports torch: the command line reads run files without it
    from .plan import RunPlan

RUN_FILE_SUFFIXES = (".yaml", ".yml", ".json")
RUN_CONFIG_NAME = "run_config.yaml"


# ------------------------------------------------------------------------------------------------ written by a run
def run_config_text(plan: RunPlan) -> str:
    """The resolved options of a planned run as a run file: YAML, one section per option group, each value not given
    by the user followed by a comment naming who chose it.

    Args:
        plan: the run's plan.

    Returns:
        The text of the file.
    """
    import yaml

    from ..families import get_family
    from .options import THE_DEFAULT

    family, record = plan.family, get_family(plan.family)
    lines = [
        f"# The resolved options of a `hf-vit-plus train {family}` run. Repeat it with",
        f"#   hf-vit-plus train {family} {RUN_CONFIG_NAME}",
        "# (flags given after the file override it). A comment names who chose a value that was not given.",
        f"family: {family}",
    ]
    for group in OPTION_GROUPS:
        flags = [flag for flag in group_fields(group) if applies(flag, record)]
        if not flags:
            continue
        lines.append(f"# --- {group._argument_group_name}")
        for flag in flags:
            text = yaml.safe_dump({flag.name: plan.option(flag.name)}, default_flow_style=True, width=10**6)
            line = text.strip().removeprefix("{").removesuffix("}")
            chooser = plan.chosen_by.get(flag.name)
            if chooser and chooser != THE_DEFAULT and not plan.given_by_user(flag.name):
                line += f"  # {chooser}"
            lines.append(line)
    return "\n".join(lines) + "\n"


def write_run_config(plan: RunPlan) -> Path:
    """Write `run_config_text(plan)` as OUTPUT_DIR/run_config.yaml (written next to it, then renamed: never half a
    file). Called by the main process once the run holds its output folder.

    Args:
        plan: the run's plan.

    Returns:
        The file written.
    """
    output_dir = Path(plan.checkpointing.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / RUN_CONFIG_NAME
    staging = output_dir / f".{RUN_CONFIG_NAME}.tmp"
    staging.write_text(run_config_text(plan), encoding="utf-8")
    os.replace(staging, path)
    return path


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


__all__ = ["RUN_CONFIG_NAME", "RUN_FILE_SUFFIXES", "read_run_file", "run_config_text", "write_run_config"]
