"""`hf-vit-plus` command line. Each sub-command lives in its own module that defines
`add_parser(subparsers)`; the parser it adds sets `func` (called with the parsed arguments)."""

from __future__ import annotations

import argparse
import importlib
import sys

# module that defines `add_parser(subparsers)`, in the order they are listed by --help
COMMAND_MODULES = [
    "hf_vit_plus.conversion.cli",
    "hf_vit_plus.interpret.cli",
    "hf_vit_plus.training.cli",
    "hf_vit_plus.hub.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-vit-plus", description=__doc__.split("\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
