"""`hf-vit-plus` command line. Each sub-command lives in its own module that defines
`add_parser(subparsers)`; the parser it adds sets `func` (called with the parsed arguments).

User errors are reported the argparse way: one line `hf-vit-plus <command>: error: <message>` on stderr and exit
status 2. argparse finds some of them itself (a missing argument, a value outside `choices`); the others are
`hf_vit_plus.errors.UsageError`s raised while the sub-command checks its arguments. Any other exception is a bug
(or a failure of the run itself) and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from hf_vit_plus.errors import UsageError

# module that defines `add_parser(subparsers)`, in the order they are listed by --help
COMMAND_MODULES = [
    "hf_vit_plus.conversion.cli",
    "hf_vit_plus.interpret.cli",
    "hf_vit_plus.training.cli",
    "hf_vit_plus.hub.cli",
    "hf_vit_plus.export_cli",
    "hf_vit_plus.sample_cli",
    "hf_vit_plus.env_cli",
]


class CommandParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one line, and which records in the namespace (`command_prog`) the
    `prog` of the innermost sub-command parsed, e.g. "hf-vit-plus train vit", to prefix the errors found later.
    Sub-parsers inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if getattr(namespace, "command_prog", None) is None:  # a sub-command's parser has set it first
            namespace.command_prog = self.prog
        return namespace, extras


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, unless there is none to show (None, an off switch) or the help says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def one_line(message: str) -> str:
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


DESCRIPTION = (
    "The Vision Transformer, the encoder-decoder Transformer and the Sparse Transformer as Hugging Face models: "
    "convert checkpoints, draw attention figures, train with Accelerate, push to the Hub. "
    "`hf-vit-plus COMMAND --help` describes a command."
)


def build_parser() -> argparse.ArgumentParser:
    from hf_vit_plus import __version__

    parser = CommandParser(prog="hf-vit-plus", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `hf-vit-plus` on `argv`; the exit status (2 for a user error). argparse's own errors and --help
    raise `SystemExit` as usual."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # named after the sub-command that was given them, not the top-level parser
        parser.exit(2, f"{args.command_prog}: error: unrecognized arguments: {' '.join(extras)}\n")
    try:
        result = args.func(args)
    except UsageError as error:
        print(f"{args.command_prog}: error: {one_line(error)}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
