"""Push a saved checkpoint folder to the Hugging Face Hub (or any endpoint set with `HF_ENDPOINT`).

One call does: check the folder (a config, or a PEFT adapter's adapter_config.json, safetensors weights, no pickles)
-> `create_repo(exist_ok=True)` -> `create_branch` when a revision is given -> one commit of the folder's files.
Everything in the folder goes up: the weights, config.json, the model-code files that `save_pretrained` copies for
`trust_remote_code`, the processor/tokenizer files, figures and the README.md model card. A folder without README.md
gets the family's card (an adapter folder: an adapter card naming its base model) rendered from its config.json
(`hf_vit_plus.hub.card.model_card_from_config`) in the commit. A README.md in the folder goes up as it is, except
that a card this package wrote is made to name the repository pushed to (`hf_vit_plus.hub.card.card_for_repo`: its
loading examples, e.g. "path/to/this/folder" when it was written without --hub_model_id, its model-index name and
title). The local folder is only read, never written.

`push_model` is what the families' `model.push_to_hub(repo_id)` does: `import hf_vit_plus` sets it (imported at the
first push, `hf_vit_plus.integrations.push_with_family_card`) as the push hook of `hf_vit_plus.models.hub_mixin` (the
models never import this package). It is transformers' push with the
family's card in place of transformers' stock card.

Call it from the main process only (e.g. under `if accelerator.is_main_process:` or
`trainer.is_world_process_zero()`): several processes pushing the same folder make several commits.
"""

from __future__ import annotations

import inspect
import json
import logging
import tempfile
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, ModelCard
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError
from huggingface_hub.hf_api import DEFAULT_IGNORE_PATTERNS
from huggingface_hub.utils import filter_repo_objects

from .adapter import adapter_card, is_adapter_folder

logger = logging.getLogger(__name__)

# Formats that `torch.load` / `pickle` read by running code embedded in the file.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class HubPushError(RuntimeError):
    """A push failed on the Hub side.

    Args:
        message: what failed and why.
        step: the failing step ("create_repo", "create_branch", "validate README.md metadata", "preupload",
            "LFS batch", "LFS upload of <file>", "commit", ...); kept as the attribute `step`.
    """

    def __init__(self, message: str, step: str):
        super().__init__(message)
        self.step = step


# What a training run leaves next to its model and never pushes (hf_vit_plus.training): the training states
# (checkpoints/, with pickled optimiser states), the trackers' logs as they lie (their TensorBoard event files go up
# under runs/ instead: `tensorboard_logs`), half-written files and the run's lock (training.run_lock). So the output
# folder of `hf-vit-plus train` is pushed as it is, by the run and by `hf-vit-plus push` when that push is retried.
RUN_IGNORE_PATTERNS = ["checkpoints/*", "logs/*", ".tmp-*", ".tmp-*/*", ".hf_vit_plus-run.lock"]


# Where a run's TensorBoard event files go in the repository: the Hub shows a "Training metrics" tab for the event
# files under runs/, the folder transformers' Trainer pushes its logs in.
LOGS_IN_REPO = "runs"


def tensorboard_logs(folder: str | Path) -> dict[str, Path]:
    """The TensorBoard event files a training run wrote under `folder`/logs (`hf_vit_plus.training`'s logging dir):
    path in the repository (runs/<path under logs>) -> local file."""
    logs = Path(folder) / "logs"
    if not logs.is_dir():
        return {}
    events = sorted(p for p in logs.rglob("events.out.tfevents.*") if p.is_file())
    return {f"{LOGS_IN_REPO}/{p.relative_to(logs).as_posix()}": p for p in events}


def files_to_push(folder: str | Path) -> list[str]:
    """The files `upload_folder` would send from `folder` (paths relative to it, POSIX style), without a training
    run's own files (`RUN_IGNORE_PATTERNS`)."""
    folder = Path(folder)
    paths = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return list(filter_repo_objects(paths, ignore_patterns=[*DEFAULT_IGNORE_PATTERNS, *RUN_IGNORE_PATTERNS]))


def check_checkpoint_folder(folder: str | Path) -> list[str]:
    """Check that `folder` is a pushable checkpoint and return the files that would be pushed.

    Raises:
        FileNotFoundError: the folder does not exist.
        ValueError: not a folder, no config.json, no safetensors weights, or pickled files in it.
    """
    folder = Path(folder)
    if not folder.exists():
        raise FileNotFoundError(f"Checkpoint folder {str(folder)!r} does not exist.")
    if not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is not a folder; push_checkpoint pushes a `save_pretrained` folder.")
    files = files_to_push(folder)
    pickled = [f for f in files if f.lower().endswith(PICKLE_SUFFIXES)]
    if pickled:
        raise ValueError(
            f"Refusing to push pickled files from {str(folder)!r}: {', '.join(pickled)}. Loading a pickle runs "
            "code from the file, so this project only publishes safetensors weights. Save with "
            "`save_pretrained` (safetensors by default) and move these files out of the folder (for a Trainer "
            "output dir, push the final model folder, not the one holding checkpoint-*/ and training_args.bin)."
        )
    if "config.json" not in files and not is_adapter_folder(folder):
        raise ValueError(
            f"{str(folder)!r} has no config.json, nor adapter_config.json + adapter_model.safetensors: is it a "
            "`save_pretrained` folder?"
        )
    if not any(f.endswith(".safetensors") and "/" not in f for f in files):
        raise ValueError(f"{str(folder)!r} has no *.safetensors weights at its top level.")
    return files


def _card_for_folder(folder: Path, repo_id: str) -> str | None:
    """The family's card (text) for a checkpoint folder without README.md, from its config.json; None for a model
    type of another project."""
    from .card import family_of, model_card_from_config

    if is_adapter_folder(folder) and not (folder / "config.json").is_file():
        logger.info("%s has no README.md: uploading an adapter card naming its base model.", folder)
        return str(adapter_card(folder, family=None, repo_id=repo_id))
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(config_path)!r} is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise ValueError(f"{str(config_path)!r} must hold a JSON object, got {type(config).__name__}.")
    if family_of(config) is None:
        logger.warning(
            "%s has no README.md and its model_type %r is not one of hf_vit_plus's: the repository gets no model "
            "card.",
            folder,
            config.get("model_type"),
        )
        return None
    logger.info("%s has no README.md: uploading the family's card rendered from config.json.", folder)
    return str(model_card_from_config(config, repo_id=repo_id))


def _card_naming_repo(folder: Path, repo_id: str) -> str | None:
    """The folder's README.md rewritten to name `repo_id` (`hub.card.card_for_repo`: the loading examples, the
    model-index name, the title), when it is one of this package's cards and names something else; None when it goes
    up as it is."""
    from .card import card_for_repo

    try:
        text = (folder / "README.md").read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
    card = card_for_repo(text, repo_id, folder.resolve().name)
    if card is None or card == text:
        return None
    logger.info("Uploading %s/README.md rewritten to name %s (the local file is kept).", folder, repo_id)
    return card


def _request_of(err: BaseException) -> tuple[str, str] | None:
    """(method, url) of the HTTP request behind a Hub error, when there is one."""
    if not isinstance(err, HfHubHTTPError):
        return None
    try:
        request = err.response.request
        return request.method, str(request.url)
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError for a response without a request
        return None


_STEPS_BY_URL = (
    ("/api/repos/create", "create_repo"),
    ("/api/validate-yaml", "validate README.md metadata"),
    ("/preupload/", "preupload"),
    ("/info/lfs/objects/batch", "LFS batch"),
    ("/commit/", "commit"),
    ("/branch/", "create_branch"),
)


def _failed_step(err: BaseException) -> tuple[str, str]:
    """(step, where) for an error raised inside `upload_folder`: walks the exception chain."""
    cause, seen = err, set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, RuntimeError) and str(cause).startswith("Error while uploading '"):
            request = _request_of(cause.__cause__)
            return f"LFS upload of {str(cause).split(chr(39))[1]}", " ".join(request) if request else ""
        if isinstance(cause, ValueError) and "Invalid metadata in README.md" in str(cause):
            return "validate README.md metadata", "POST /api/validate-yaml"
        if isinstance(cause, ValueError) and "LFS batch API returned errors" in str(cause):
            return "LFS batch", ""
        request = _request_of(cause)
        if request is not None:
            path = request[1].split("?")[0]
            step = next((step for marker, step in _STEPS_BY_URL if marker in path), "upload")
            return step, " ".join(request)
        cause = cause.__cause__ or cause.__context__
    return "upload", ""


def _one_line(err: BaseException) -> str:
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()).rstrip(".")


def _push_error(err: BaseException, step: str, where: str, folder: Path, repo_id: str, revision: str) -> HubPushError:
    detail = f"{type(err).__name__}: {_one_line(err)}"
    cause, seen = err.__cause__ or err.__context__, set()
    while cause is not None and id(cause) not in seen:  # the Hub's own answer, when it is deeper in the chain
        seen.add(id(cause))
        if isinstance(cause, HfHubHTTPError):
            detail += f" <- {type(cause).__name__}: {_one_line(cause)}"
            break
        cause = cause.__cause__ or cause.__context__
    outcome = "The Hub did not confirm the commit" if step in ("commit", "upload") else "No commit was made"
    return HubPushError(
        f"Pushing {str(folder)!r} to {repo_id!r} (revision {revision!r}) failed at step '{step}'"
        + (f" ({where})" if where else "")
        + f": {detail[:1000]}. {outcome} on {revision!r}. The local folder was not modified; run the push again "
        "to retry.",
        step,
    )


def push_checkpoint(
    folder: str | Path,
    repo_id: str,
    *,
    revision: str | None = None,
    create_branch: bool = True,
    private: bool = False,
    token: str | None = None,
    commit_message: str | None = None,
    logs: bool = True,
) -> str:
    """Push the checkpoint `folder` to the Hub repository `repo_id` as one commit.

    Main process only: call it once per training run (e.g. under `accelerator.is_main_process`).

    Args:
        folder: a `save_pretrained` folder (safetensors weights, config.json, model code, processor or tokenizer,
            README.md card, figures). Pickled files (*.bin, *.pt, *.pth, *.pkl, *.pickle, *.ckpt) are refused.
            Without a README.md the commit gets the family's card rendered from config.json (the folder is not
            written); a README.md in the folder is pushed unchanged, except that this package's cards are made to
            name `repo_id` in their loading examples, model-index and title (`hub.card.card_for_repo`).
        repo_id: "namespace/name"; created if missing (an existing repository is reused).
        revision: branch to commit to (default: "main"). Created from main's head if missing and
            `create_branch` is true.
        create_branch: create `revision` when it does not exist yet.
        private: create the repository private (ignored when it already exists).
        token: Hub token (default: the saved token or `HF_TOKEN`).
        commit_message: the commit title (default: "Upload <folder name> with hf_vit_plus").
        logs: also push the run's TensorBoard event files (`folder`/logs/**/events.out.tfevents.*) under runs/,
            where the Hub shows them in its "Training metrics" tab (`tensorboard_logs`).

    Returns:
        The commit URL (a `huggingface_hub.CommitInfo`, a `str` whose `.oid` is the 40-hex commit id).

    Raises:
        FileNotFoundError / ValueError: bad folder or config.json (nothing is sent to the Hub).
        HubPushError: a Hub request failed; the message names the step (and the file for LFS uploads). The local
            folder is never modified.
    """
    folder = Path(folder)
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"repo_id must look like 'namespace/name', got {repo_id!r}.")
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise ValueError(f"revision must be a non-empty branch name or None, got {revision!r}.")
    files = check_checkpoint_folder(folder)
    card = _card_naming_repo(folder, repo_id) if "README.md" in files else _card_for_folder(folder, repo_id)
    if card is not None:
        files = [f for f in files if f != "README.md"]
    branch = revision or "main"
    api = HfApi(token=token)
    message = commit_message or f"Upload {folder.resolve().name} with hf_vit_plus"
    events = tensorboard_logs(folder) if logs else {}

    step = "create_repo"
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision is not None and revision != "main" and create_branch:
            step = "create_branch"
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        step = "upload"
        logger.info("Pushing %d files from %s to %s@%s", len(files), folder, repo_id, branch)
        operations = [CommitOperationAdd(path_in_repo=f, path_or_fileobj=folder / f) for f in files]
        operations += [CommitOperationAdd(path_in_repo=f, path_or_fileobj=p) for f, p in events.items()]
        if card is not None:  # rendered or rewritten into the commit only: the folder is not written
            operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode("utf-8")))
        info = api.create_commit(
            repo_id=repo_id,
            operations=operations,
            revision=revision,
            commit_message=message,
            repo_type="model",
        )
    except Exception as err:
        if step == "upload":
            step, where = _failed_step(err)
        else:
            where = _failed_step(err)[1]
        raise _push_error(err, step, where, folder, repo_id, branch) from err
    logger.info("Pushed %s to %s@%s: %s", folder, repo_id, branch, info)
    return info


def push_model(model, repo_id: str, **options):
    """`model.push_to_hub(repo_id, ...)` for the project's models: transformers' steps (create the repository,
    `save_pretrained` into a temporary folder, create the branch, one commit) with the family's model card as
    README.md instead of transformers' stock card.

    The README.md already in the repository (on `revision` when it exists, else the default branch) is kept: it is
    left out of the commit, or, when `tags` (with the model's `model_tags`) adds tags it lacks, loaded and pushed
    back with those tags appended, as transformers does. `options` and the return value (a `CommitInfo`) are those
    of transformers' `PreTrainedModel.push_to_hub`, declared once, with their defaults, by
    `hf_vit_plus.models.hub_mixin.HubMixin.push_to_hub`; Hub errors propagate as transformers' do.
    """
    from ..models.hub_mixin import HubMixin

    bound = inspect.signature(HubMixin.push_to_hub).bind(model, repo_id, **options)  # a TypeError names a typo
    bound.apply_defaults()
    options = bound.arguments
    token, revision = options["token"], options["revision"]

    from .card import family_of, model_card_from_config

    if family_of(model.config) is None:
        raise ValueError(
            f"push_model renders the card of an hf_vit_plus family; {type(model).__name__} has model_type "
            f"{getattr(model.config, 'model_type', None)!r}."
        )
    tags = [options["tags"]] if isinstance(options["tags"], str) else options["tags"] or []
    extra_tags = list(dict.fromkeys([*(getattr(model, "model_tags", None) or []), *tags]))
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=options["private"], token=token, exist_ok=True).repo_id
    if revision is not None and not revision.startswith("refs/pr"):
        try:
            api.create_branch(repo_id, branch=revision, token=token, exist_ok=True)
        except HfHubHTTPError as err:  # as transformers: a PR on a repository we cannot write to
            if not (options["create_pr"] and err.response is not None and err.response.status_code == 403):
                raise
    try:
        existing = api.hf_hub_download(repo_id, "README.md", revision=revision, token=token)
    except EntryNotFoundError:
        existing = None

    with tempfile.TemporaryDirectory() as tmp_dir:
        model.save_pretrained(tmp_dir, max_shard_size=options["max_shard_size"])
        readme = Path(tmp_dir) / "README.md"
        if existing is None:
            model_card_from_config(model.config, repo_id=repo_id, tags=extra_tags).save(readme)
        else:
            card = ModelCard.load(existing)
            missing = [tag for tag in extra_tags if tag not in (card.data.tags or [])]
            if missing:
                card.data.tags = [*(card.data.tags or []), *missing]
                card.save(readme)
                logger.info("Adding tags %s to the README.md of %s.", missing, repo_id)
            else:
                readme.unlink(missing_ok=True)  # the repository's card stays as it is
                logger.info("%s already has a README.md: it is kept.", repo_id)
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=tmp_dir,
            commit_message=options["commit_message"] or "Upload model",
            commit_description=options["commit_description"],
            revision=revision,
            create_pr=options["create_pr"],
        )


def check_push_target(
    repo_id: str, *, revision: str | None = None, private: bool = False, token: str | None = None
) -> str:
    """Check, before a long run, that its final push can succeed, as transformers' Trainer does by creating the
    repository when it starts: the endpoint answers, the token is accepted and may write, the repository exists or
    can be created (it is created now), and the branch `revision` exists or can be created (created now). Returns the
    repository id; raises `HubPushError` whose message is one line saying what failed and what to do.

    Main process or every process alike: each step is idempotent."""
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalTokenNotFoundError, OfflineModeIsEnabled

    endpoint = constants.ENDPOINT
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"--hub_model_id must look like 'namespace/name', got {repo_id!r}.")
    api = HfApi(token=token)
    step = "whoami"
    try:
        user = api.whoami()
        role = ((user.get("auth") or {}).get("accessToken") or {}).get("role")
        if role == "read":
            raise HubPushError(
                f"The token for {endpoint} is read-only (user {user.get('name')!r}): pushing to {repo_id!r} needs a "
                "write token (HF_TOKEN or `hf auth login`).",
                step,
            )
        step = "create_repo"
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision is not None and revision != "main":
            step = "create_branch"
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    except HubPushError:
        raise
    except OfflineModeIsEnabled as err:
        raise HubPushError(f"HF_HUB_OFFLINE is set, so nothing can be pushed to {repo_id!r}: unset it ({err}).",
                           step) from err  # fmt: skip
    except LocalTokenNotFoundError as err:
        raise HubPushError(
            f"No Hub token for {endpoint}: set HF_TOKEN or run `hf auth login` to push to {repo_id!r}.", step
        ) from err
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        if step == "whoami" and status == 401:
            what = "refuses the token (HF_TOKEN or the saved login): it is invalid or expired"
        elif status in (401, 403):
            what = f"does not let this token {'create or write' if step == 'create_repo' else 'write'} {repo_id!r}"
        else:
            what = f"answered {status} to {step}"
        raise HubPushError(f"The Hub at {endpoint} {what} ({_one_line(err)[:300]}).", step) from err
    except Exception as err:  # the endpoint cannot be reached: connection refused, DNS, timeout, TLS
        raise HubPushError(
            f"Cannot reach the Hub at {endpoint} ({type(err).__name__}: {_one_line(err)[:300]}); check HF_ENDPOINT "
            "and the network.",
            step,
        ) from err
    return repo_id


def push_space(
    folder: str | Path, space_id: str, model_id: str, *, private: bool = False, token: str | None = None
) -> str:
    """Create the Gradio Space `space_id` (if missing) and commit the demo of the model folder `folder` to it:
    app.py, requirements.txt and README.md from `hub.space.render_space`, the app loading `model_id`.

    Returns the commit URL. Raises ValueError for a bad folder or id (nothing is sent), HubPushError when a Hub
    request fails."""
    from .space import render_space

    if not isinstance(space_id, str) or space_id.count("/") != 1 or not all(space_id.split("/")):
        raise ValueError(f"--space must look like 'namespace/name', got {space_id!r}.")
    files = render_space(folder, model_id)
    api = HfApi(token=token)
    step = "create_repo"
    try:
        api.create_repo(space_id, private=private, exist_ok=True, repo_type="space", space_sdk="gradio")
        step = "upload"
        operations = [CommitOperationAdd(name, text.encode("utf-8")) for name, text in files.items()]
        info = api.create_commit(
            repo_id=space_id,
            operations=operations,
            commit_message=f"Demo of {model_id}, generated by hf_vit_plus",
            repo_type="space",
        )
    except Exception as err:
        raise _push_error(err, step, _failed_step(err)[1], Path(folder), space_id, "main") from err
    logger.info("Pushed the demo Space of %s to %s: %s", model_id, space_id, info)
    return info
