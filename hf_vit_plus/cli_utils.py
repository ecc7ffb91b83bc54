"""What every `hf-vit-plus` sub-command shares: the parser class, the help formatter and the argparse types.

The sub-command modules (`conversion/cli.py`, `training/cli.py`, `export_cli.py`, ...) import this module and never
`hf_vit_plus.cli`, which imports them: the command line is a tree, `cli.py` at its root.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import math
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError


class CommandParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one line, and which records in the namespace the `prog` of the innermost
    sub-command parsed (`command_prog`, e.g. "hf-vit-plus train vit", to prefix the errors found later) and its flags
    (`command_flags`, to suggest the closest one for a flag it does not know). Sub-parsers inherit the class.

    Abbreviations are off (`allow_abbrev=False`): argparse would take `--dataset` for `--dataset_name`, or refuse it as
    "ambiguous" where two flags start with it; a flag must be written out, and a wrong one is named as unrecognized
    with the closest valid flag. A flag may be written with dashes for its underscores (`--output-dir`), as
    transformers' `HfArgumentParser` accepts both: the help shows the underscores."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs):
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)
        self._pending: list = []
        add_logging_arguments(self)

    def add_arguments_later(self, builder) -> None:
        """Call `builder(self)` to add arguments only when this parser parses or prints its help: for arguments whose
        choices or help need a heavy import (torch), so that building the whole command line stays cheap.

        Args:
            builder: a function of the parser that adds its arguments.
        """
        self._pending.append(builder)

    def _build_pending(self) -> None:
        while self._pending:
            self._pending.pop(0)(self)

    def format_usage(self) -> str:
        self._build_pending()
        return super().format_usage()

    def format_help(self) -> str:
        self._build_pending()
        return super().format_help()

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")

    def parse_known_args(self, args=None, namespace=None):
        self._build_pending()
        namespace, extras = super().parse_known_args(self._underscores(args), namespace)
        if getattr(namespace, "command_prog", None) is None:  # a sub-command's parser has set it first
            namespace.command_prog = self.prog
            namespace.command_flags = visible_flags(self)
        return namespace, extras

    def _underscores(self, args):
        """`args` with each `--a-b` (or `--a-b=value`) that this parser does not know, but knows as `--a_b`, written
        so; the arguments after `--` are left as they are."""
        import sys

        args = list(sys.argv[1:] if args is None else args)
        known = self._option_string_actions  # argparse has no public table of its flags
        for index, arg in enumerate(args):
            if arg == "--":
                break
            name, equals, value = arg.partition("=")
            if name.startswith("--") and "-" in name[2:] and name not in known:
                spelled = "--" + name[2:].replace("-", "_")
                if spelled in known:
                    args[index] = spelled + equals + value
        return args

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            message = unrecognized_arguments(extras, namespace.command_flags)
            self.exit(2, f"{namespace.command_prog}: error: {message}\n")
        return namespace


# --log_level's values: transformers' `TrainingArguments.log_level` ("passive": leave transformers' own level alone)
LOG_LEVEL_CHOICES = ("debug", "info", "warning", "error", "critical", "passive")


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    """`--log_level`, `-q` and `-v` on `parser`: every parser of the command line has them, so they go before or
    after the sub-command. They default to `argparse.SUPPRESS`, so a sub-command's parser never overwrites what the
    top-level parser read (`configure_logging` reads them with `getattr`)."""
    parser.add_argument(
        "--log_level",
        choices=LOG_LEVEL_CHOICES,
        default=argparse.SUPPRESS,
        help="level of hf_vit_plus's and transformers' logs (default: hf_vit_plus at info, transformers' own level)",
    )
    quiet_help = "warnings and errors only, no progress bars"
    parser.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=quiet_help)
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logs (transformers' info logs)"
    )


@contextlib.contextmanager
def command_logging(args: argparse.Namespace) -> Iterator[None]:
    """The log levels and progress bars that `--log_level`, `-q` and `-v` ask for (see `add_logging_arguments`), for
    the time the command runs; the settings before it are back afterwards (`hf_vit_plus.cli.main` may be called from
    Python).

    By default the command shows the package's INFO lines (what a run is doing) and leaves transformers at its own
    level. It also hides torch's deprecation notice about torchao's enums, which torch logs when transformers imports
    torchao and which says nothing about the command (the library itself filters no log).
    """
    import logging

    level = getattr(args, "log_level", None)
    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)
    if sum(bool(option) for option in (level, quiet, verbose)) > 1:
        raise UsageError("Give one of --log_level, -q and -v.")
    pytree = logging.getLogger("torch.utils._pytree")
    pytree.addFilter(_drop_torchao_enum_notice)
    from transformers.utils import logging as transformers_logging

    from .utils import logging as package_logging

    package = logging.getLogger(package_logging.ROOT_LOGGER)
    before = (package.level, transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled())
    try:
        _set_levels(level, quiet, verbose)
        yield
    finally:
        package.setLevel(before[0])
        transformers_logging.set_verbosity(before[1])
        (transformers_logging.enable_progress_bar if before[2] else transformers_logging.disable_progress_bar)()
        pytree.removeFilter(_drop_torchao_enum_notice)


def _set_levels(level: str | None, quiet: bool, verbose: bool) -> None:
    from transformers.utils import logging as transformers_logging

    from .utils import logging as package_logging

    if quiet:
        package_logging.set_verbosity_warning()
        package_logging.disable_progress_bar()
    elif verbose:
        package_logging.set_verbosity_debug()
        transformers_logging.set_verbosity_info()
    elif level in (None, "passive"):
        package_logging.set_verbosity_info()
    else:
        package_logging.set_verbosity(level)
        transformers_logging.set_verbosity(package_logging.LOG_LEVELS[level])


def _drop_torchao_enum_notice(record) -> bool:
    return "register_constant() on Enum subclasses is deprecated" not in record.getMessage()


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
non_negative_int = checked_number(int, lambda value: value >= 0, "a non-negative integer")  # a seed, threads (0: auto)
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
    "non_negative_int",
    "one_line",
    "one_of",
    "unrecognized_arguments",
    "visible_flags",
    "parse_bool",
    "positive_float",
    "positive_int",
    "unit_interval",
]
