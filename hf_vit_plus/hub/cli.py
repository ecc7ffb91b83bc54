"""`hf-vit-plus push DIR REPO_ID`: push a checkpoint folder to the Hub (see `hf_vit_plus.hub.push`)."""

from __future__ import annotations

import argparse
import sys

from ..cli_utils import HelpFormatter
from ..errors import UsageError


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "push",
        help="push a checkpoint folder (safetensors, config, model code, card) to the Hub",
        description=(
            "Push a save_pretrained folder (a model, or a PEFT adapter: adapter_config.json + "
            "adapter_model.safetensors) to a Hub model repository as one commit. The repository is created "
            "if missing; with --revision the branch is created from main if missing. Pickled weights are refused; "
            "a training run's checkpoints/ are left out, and its TensorBoard event files (logs/) go up under runs/, "
            "where the Hub shows them as training metrics (--no_logs: not). "
            "A README.md in the folder is pushed as it is (a card hf_vit_plus wrote is made to name REPO_ID in its "
            "loading examples, model-index and title); without one, the commit gets the family's model card "
            "rendered from config.json, or an adapter card for an adapter (the folder itself is only read). "
            "The endpoint is HF_ENDPOINT (default https://huggingface.co)."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("dir", help="checkpoint folder")
    parser.add_argument("repo_id", help="Hub repository id, 'namespace/name'")
    parser.add_argument("--revision", default=None, help="branch to push to (default: main)")
    parser.add_argument(
        "--no_create_branch",
        dest="create_branch",
        action="store_false",
        help="fail instead of creating --revision when it does not exist",
    )
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument(
        "--no_logs", dest="logs", action="store_false", help="leave the run's TensorBoard logs (logs/) out"
    )
    parser.add_argument(
        "--space",
        default=None,
        metavar="SPACE_REPO_ID",
        help="also create this Gradio Space and push a demo of the model that loads REPO_ID (see `hf-vit-plus space`)",
    )
    parser.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the saved login)")
    parser.add_argument(
        "--commit_message", default=None, help="title of the commit (default: 'Upload DIR with hf_vit_plus')"
    )
    # Other spellings accepted before, hidden: --branch, and dashes for underscores.
    hidden = dict(default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--branch", dest="revision", **hidden)
    parser.add_argument("--no-create-branch", dest="create_branch", action="store_false", **hidden)
    parser.add_argument("--commit-message", dest="commit_message", **hidden)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Push a saved model folder to the Hub (`hf-vit-plus push`), and with `--space` a demo Space for it.

    Args:
        args: the parsed command line.

    Returns:
        The exit status: 0 when the push succeeded, 1 when a Hub request fails; the commit is printed.

    Raises:
        UsageError: a bad folder, repo id or revision (nothing is sent; `hf_vit_plus.cli.main` prints it and exits
            with status 2).
    """
    from .push import HubPushError, push_checkpoint

    if args.space is not None:
        _check_space(args)
    try:
        commit = push_checkpoint(
            args.dir,
            args.repo_id,
            revision=args.revision,
            create_branch=args.create_branch,
            private=args.private,
            token=args.token,
            commit_message=args.commit_message,
            logs=args.logs,
        )
    except HubPushError as err:
        print(f"hf-vit-plus push: error: {err}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as err:  # push_checkpoint's checks, before any request
        raise UsageError(str(err)) from err
    print(commit)
    return _push_space(args) if args.space is not None else 0


def _check_space(args: argparse.Namespace) -> None:
    """--space's checks, before the model is pushed: the id, and that the folder's family has a demo."""
    from .space import check_model_id, space_family

    try:
        check_model_id(args.space, "--space")
        space_family(args.dir)
    except ValueError as err:
        raise UsageError(str(err)) from err


def _push_space(args: argparse.Namespace) -> int:
    from .push import HubPushError, push_space

    try:
        commit = push_space(args.dir, args.space, args.repo_id, private=args.private, token=args.token)
    except HubPushError as err:
        print(f"hf-vit-plus push: error: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        raise UsageError(str(err)) from err
    print(commit)
    return 0
