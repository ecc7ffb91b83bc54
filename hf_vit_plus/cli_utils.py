"""What every `hf-vit-plus` sub-command shares: the parser class, the help formatter and the argparse types.

The sub-command modules (`conversion/cli.py`, `training/cli.py`, `export_cli.py`, ...) import this module and never
`hf_vit_plus.cli`, which imports them: the command line is a tree, `cli.py` at its root.
"""

from __future__ import annotations

import argparse
import difflib
import math
from pathlib import Path


class CommandParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one line, and which records in the namespace the `prog` of the innermost
    sub-command parsed (`command_prog`, e.g. "hf-vit-plus train vit", to prefix the errors found later) and its flags
    (`command_flags`, to suggest the closest one for a flag it does not know). Sub-parsers inherit the class.

    Abbreviations are off (`allow_abbrev=False`): argparse would take `--dataset` for `--dataset_name`, or refuse it as
    "ambiguous" where two flags start with it; a flag must be written out, and a wrong one is named as unrecognized
    with the closest valid flag."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs):
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if getattr(namespace, "command_prog", None) is None:  # a sub-command's parser has set it first
            namespace.command_prog = self.prog
            namespace.command_flags = visible_flags(self)
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            message = unrecognized_arguments(extras, namespace.command_flags)
            self.exit(2, f"{namespace.command_prog}: error: {message}\n")
        return namespace


def visible_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long and short flags `parser` lists in its help (hidden aliases left out)."""
    return [
        flag
        for action in parser._actions  # argparse has no public list of its actions
        if action.help != argparse.SUPPRESS
        for flag in action.option_strings
    ]


def unrecognized_arguments(extras: list[str], flags: list[str]) -> str:
    """argparse's "unrecognized arguments: ..." message, naming for each unknown flag the closest valid one."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    suggestions = []
    for extra in extras:
        if not extra.startswith("-") or extra in ("-", "--"):
            continue
        name = extra.split("=", 1)[0]
        close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
        if close and close[0] != name:
            suggestions.append(f"{name}: did you mean {close[0]}?")
    return message + (f" ({'; '.join(suggestions)})" if suggestions else "")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, unless there is none to show (None, an off switch) or the help says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class RawDescriptionDefaultsFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """The description as written (a module docstring with its usage lines), each flag with its default."""


def one_line(message: str) -> str:
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def one_of(names) -> str:
    """'a', 'a or b', 'a, b or c': the names as a sentence gives a choice."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


# ---------------------------------------------------------------------------------------------- argparse types
def checked_number(convert: type, accept, expected: str):
    """An argparse `type` that reads a number with `convert` and refuses (one line, exit status 2) what `accept`
    rejects, saying what was `expected`."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


positive_int = checked_number(int, lambda value: value >= 1, "a positive integer")  # a count or a length
positive_float = checked_number(float, lambda value: 0 < value < math.inf, "a positive number")
unit_interval = checked_number(float, lambda value: 0.0 <= value <= 1.0, "a number in [0, 1]")  # a weight


def existing_file(text: str) -> Path:
    """argparse `type` of an input file: refused by argparse (one line, exit status 2) when it does not exist."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    return path


def parse_bool(text: str) -> bool:
    """argparse `type` of a switch that is on by default: `--write_card false`."""
    lowered = str(text).lower()
    if lowered in ("1", "true", "yes", "y"):
        return True
    if lowered in ("0", "false", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


__all__ = [
    "CommandParser",
    "HelpFormatter",
    "RawDescriptionDefaultsFormatter",
    "checked_number",
    "existing_file",
    "one_line",
    "one_of",
    "unrecognized_arguments",
    "visible_flags",
    "parse_bool",
    "positive_float",
    "positive_int",
    "unit_interval",
]
