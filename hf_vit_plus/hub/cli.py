"""`hf-vit-plus push DIR REPO_ID`: push a checkpoint folder to the Hub (see `hf_vit_plus.hub.push`)."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "push",
        help="push a checkpoint folder (safetensors, config, model code, card) to the Hub",
        description=(
            "Push a save_pretrained folder to a Hub model repository as one commit. The repository is created "
            "if missing; with --revision the branch is created from main if missing. Pickled weights are refused. "
            "The endpoint is HF_ENDPOINT (default https://huggingface.co)."
        ),
    )
    parser.add_argument("dir", help="checkpoint folder")
    parser.add_argument("repo_id", help="Hub repository id, 'namespace/name'")
    parser.add_argument("--revision", "--branch", dest="revision", default=None, help="branch to push to (main)")
    parser.add_argument(
        "--no_create_branch",
        "--no-create-branch",
        dest="create_branch",
        action="store_false",
        help="fail instead of creating --revision when it does not exist",
    )
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the saved login)")
    parser.add_argument("--commit_message", "--commit-message", dest="commit_message", default=None)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from .push import HubPushError, push_checkpoint

    try:
        commit = push_checkpoint(
            args.dir,
            args.repo_id,
            revision=args.revision,
            create_branch=args.create_branch,
            private=args.private,
            token=args.token,
            commit_message=args.commit_message,
        )
    except (HubPushError, ValueError, FileNotFoundError) as err:
        print(f"hf-vit-plus push: error: {err}", file=sys.stderr)
        return 1
    print(commit)
    return 0
