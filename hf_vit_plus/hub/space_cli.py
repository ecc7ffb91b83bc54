"""`hf-vit-plus space MODEL_DIR OUT_DIR`: write a Gradio demo Space for a model folder (`hf_vit_plus.hub.space`)."""

from __future__ import annotations

import argparse

from ..cli_utils import HelpFormatter
from ..errors import UsageError


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "space",
        help="write a Gradio demo Space (app.py, requirements.txt, README.md) for a model folder",
        description=(
            "Write a Gradio Space for a save_pretrained folder into OUT_DIR: app.py (ViT: top-5 labels and attention "
            "rollout; seq2seq: translation with beams and max new tokens; sparse LM: continuation; image LM: a "
            "sample grid), requirements.txt (hf_vit_plus[space]) and a README.md with the Space's configuration "
            "(sdk: gradio, models). The app loads --model_id from the Hub (HF_VIT_PLUS_SPACE_MODEL overrides it, "
            "e.g. with a local folder). Run it locally with `python OUT_DIR/app.py`."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("dir", help="model folder (config.json, weights)")
    parser.add_argument("out_dir", help="folder to write the Space into (new or empty)")
    parser.add_argument("--model_id", default=None, help="Hub id the app loads (default: the one the card names)")
    parser.add_argument("--overwrite", action="store_true", help="write into a folder that is not empty")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Write a Gradio Space for a saved model folder (`hf-vit-plus space`).

    Args:
        args: the parsed command line (`dir`, `out_dir`, `model_id`, `overwrite`).

    Returns:
        The exit status, 0; the files written are printed one a line.

    Raises:
        UsageError: the folder or the output folder cannot be used (the message says why).
    """
    from .space import write_space

    try:
        written = write_space(args.dir, args.out_dir, model_id=args.model_id, overwrite=args.overwrite)
    except ValueError as err:
        raise UsageError(str(err)) from err
    for path in written:
        print(path)
    return 0
