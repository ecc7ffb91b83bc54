"""`hf-vit-plus` command line. Each sub-command lives in its own module that defines
`add_parser(subparsers)`; the parser it adds sets `func` (called with the parsed arguments).

User errors are reported the argparse way: one line `hf-vit-plus <command>: error: <message>` on stderr and exit
status 2. argparse finds some of them itself (a missing argument, a value outside `choices`); the others are
`hf_vit_plus.errors.UsageError`s raised while the sub-command checks its arguments. A step that fails after the work
was kept (`StepFailedError`: the push after a run) is one line with status 1; a full disk while saving is one line
with status 3 (`hf_vit_plus.training.disk.OutOfSpaceError`: nothing half-written left, resume from the last
checkpoint). Any other exception is a bug (or a failure of the run itself) and keeps its traceback.

This module is the root of the command line: it imports the sub-command modules, and they import only what is
below them (`hf_vit_plus.cli_utils` for the parser class, the help formatter and the argparse types), never this
module.
"""

from __future__ import annotations

import argparse
import sys

from hf_vit_plus import __version__, env_cli, export_cli, sample_cli
from hf_vit_plus.cli_utils import (
    CommandParser,
    HelpFormatter,
    command_logging,
    one_line,
    unrecognized_arguments,
)
from hf_vit_plus.conversion import cli as conversion_cli
from hf_vit_plus.errors import StepFailedError, UsageError
from hf_vit_plus.hub import cli as hub_cli
from hf_vit_plus.hub import space_cli
from hf_vit_plus.interpret import cli as interpret_cli
from hf_vit_plus.training import cli as training_cli
from hf_vit_plus.utils.extras import MissingExtraError

# the modules that define `add_parser(subparsers)`, in the order they are listed by --help
COMMAND_MODULES = [conversion_cli, interpret_cli, training_cli, hub_cli, space_cli, export_cli, sample_cli, env_cli]

DESCRIPTION = (
    "The Vision Transformer, the encoder-decoder Transformer and the Sparse Transformer as Hugging Face models: "
    "convert checkpoints, draw attention figures, train with Accelerate, push to the Hub. "
    "`hf-vit-plus COMMAND --help` describes a command."
)


def build_parser() -> argparse.ArgumentParser:
    """The `hf-vit-plus` argument parser, with one sub-command per module of `COMMAND_MODULES`.

    Returns:
        The top-level parser; parsing sets `func`, the sub-command's entry point, in the namespace.
    """
    parser = CommandParser(prog="hf-vit-plus", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `hf-vit-plus` command line.

    argparse's own errors and --help raise `SystemExit` as usual.

    Args:
        argv: the arguments after the program name; None: `sys.argv[1:]`.

    Returns:
        The exit status: 0 on success, 2 for a user error, 1 for a step that failed after the work was kept (or a
        missing optional dependency), 3 for a full disk while saving, 143 for a training run SIGTERM stopped (its
        state saved).
    """
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # named after the sub-command that was given them, not the top-level parser
        parser.exit(2, f"{args.command_prog}: error: {unrecognized_arguments(extras, args.command_flags)}\n")
    try:
        with command_logging(args):
            # What `import hf_vit_plus` does, unless it left it to the command (the `hf-vit-plus` script): the
            # usage and argparse's own errors come before torch is imported.
            from hf_vit_plus.integrations import integrate

            integrate()
            result = args.func(args)
    except UsageError as error:
        print(f"{args.command_prog}: error: {one_line(error)}", file=sys.stderr)
        return 2
    except (StepFailedError, MissingExtraError) as error:
        if getattr(error, "main_process", True):  # the other processes of a run stop with it, silently
            print(f"{args.command_prog}: error: {one_line(error)}", file=sys.stderr)
        return getattr(error, "exit_status", 1)  # 3: out of disk space (hf_vit_plus.training.disk)
    return int(result or 0)


__all__ = ["COMMAND_MODULES", "CommandParser", "HelpFormatter", "build_parser", "main", "one_line"]

if __name__ == "__main__":
    sys.exit(main())
