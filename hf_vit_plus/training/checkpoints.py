"""Training checkpoints on disk: where they are (`OUTPUT_DIR/checkpoints/checkpoint-<update>`), which one to resume
from, their `training_state.json`, the fingerprint that ties a checkpoint to its model, and the atomic save.

A checkpoint holds Accelerate's state (model as safetensors, optimiser, scheduler, RNG states, loaded with
`weights_only=True`) plus `training_state.json` (position in the data, log history and a fingerprint of the model).
It is written to a temporary folder and renamed, so an interrupted save never leaves a half-written checkpoint under
its final name. The rename alone does not prove the files' content reached the disk (a crash after it can leave a
truncated or zeroed file, and disks and copies damage files later), so the last file written is `manifest.json`: each
file's size and a checksum of its first and last MiB. `checkpoint_problem` compares a folder with its manifest, and
"latest" is the newest checkpoint that matches its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import id_tensor_storage

from .disk import SAVE_ERRORS, OutOfSpaceError, is_out_of_space, out_of_space_message

logger = logging.getLogger(__name__)

STATE_FILE = "training_state.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "hf_vit_plus-checkpoint-manifest"
MANIFEST_VERSION = 1
# The checksum reads at most this much from each end of a file: cheap on a multi-GB optimiser state, and truncation,
# zeroed or missing tails, and damaged headers (where safetensors and torch.save keep their indexes) all show there.
CHECKSUM_SPAN = 1 << 20
CHECKSUM_NAME = "sha256 of the first and last MiB (of the whole file under 2 MiB)"
STATE_FORMAT = "hf_vit_plus-training-state"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_PREFIX = "checkpoint-"
PROCESSOR_DIR = "processor"
# Config fields that do not change which model a checkpoint belongs to.
_VOLATILE_CONFIG_KEYS = {
    "transformers_version",
    "_name_or_path",
    "architectures",
    "auto_map",
    "dtype",
    "torch_dtype",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "use_cache",
    "_attn_implementation",
    "_attn_implementation_autoset",
}


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Folders under `output_dir/checkpoints` that look like checkpoints (`checkpoint-<update>` with a
    training_state.json), oldest first; whether one is complete is `checkpoint_problem`'s answer."""
    return [p for p in _checkpoint_folders(output_dir) if (p / STATE_FILE).is_file()]


def complete_checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """The checkpoints under `output_dir/checkpoints` that match their manifest (or predate manifests), oldest first.

    Args:
        output_dir: The run's output folder.

    Returns:
        The complete checkpoint folders, oldest first (reads the head and tail of every file of every checkpoint).
    """
    return [p for p in _checkpoint_folders(output_dir) if checkpoint_problem(p) is None]


def _checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """`checkpoint-<update>` folders with a training state or a manifest, oldest first: one whose training state is
    lost but whose manifest is left is a damaged checkpoint, to be reported, not a stranger to be passed over."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    found = [p for p in found if p.name[len(CHECKPOINT_PREFIX) :].isdigit()]
    found = [p for p in found if (p / STATE_FILE).is_file() or (p / MANIFEST_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def _checksum(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        if size <= 2 * CHECKSUM_SPAN:
            digest.update(file.read())
        else:
            digest.update(file.read(CHECKSUM_SPAN))
            file.seek(size - CHECKSUM_SPAN)
            digest.update(file.read(CHECKSUM_SPAN))
    return digest.hexdigest()


def _checkpoint_files(folder: Path) -> list[str]:
    """Every file under `folder` but the manifest, as sorted POSIX paths relative to it."""
    names = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return sorted(n for n in names if n not in (MANIFEST_FILE, f"{MANIFEST_FILE}.tmp"))


def write_manifest(folder: Path) -> Path:
    """Write `folder/manifest.json`: the size and checksum of every other file under `folder`. Call it after the
    last file of the checkpoint is written: it is written to a temporary name, synced, then renamed, so a manifest
    that exists is whole.

    Args:
        folder: The checkpoint folder, complete but for its manifest.

    Returns:
        The manifest's path.
    """
    files = {}
    for name in _checkpoint_files(folder):
        size = (folder / name).stat().st_size
        files[name] = {"size": size, "sha256": _checksum(folder / name, size)}
    manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "checksum": CHECKSUM_NAME, "files": files}
    final, tmp = folder / MANIFEST_FILE, folder / f"{MANIFEST_FILE}.tmp"
    with tmp.open("w") as file:
        file.write(json.dumps(manifest, indent=1))
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, final)
    return final


def checkpoint_problem(path: str | Path) -> str | None:
    """What is wrong with the checkpoint folder `path`, compared with its manifest.json.

    A checkpoint without a manifest but with its training_state.json was written before manifests were, and counts as
    complete. Sizes are compared first (no reading), then the checksums of the files' first and last MiB: a change in
    the middle of a file larger than 2 MiB goes unseen.

    Args:
        path: A checkpoint folder (`.../checkpoints/checkpoint-<update>`).

    Returns:
        None for a complete checkpoint; otherwise one short phrase naming the file and what is wrong with it, e.g.
        "model.safetensors: 412 bytes, the manifest says 838800".
    """
    folder = Path(path)
    if not (folder / MANIFEST_FILE).is_file():
        return None if (folder / STATE_FILE).is_file() else f"neither {MANIFEST_FILE} nor {STATE_FILE}"
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return f"{MANIFEST_FILE}: not valid JSON"
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return f"{MANIFEST_FILE}: not an hf_vit_plus checkpoint manifest"
    version = manifest.get("version")
    if not isinstance(version, int) or version > MANIFEST_VERSION:
        return f"{MANIFEST_FILE}: format version {version!r}, this hf_vit_plus reads {MANIFEST_VERSION}"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return f"{MANIFEST_FILE}: no list of files"
    for name, entry in files.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or "sha256" not in entry:
            return f"{MANIFEST_FILE}: malformed entry for {name!r}"
        # a manifest names files inside its folder only: an entry that leaves it is damage, not a file to read
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{MANIFEST_FILE}: entry {name!r} is outside the checkpoint"
    sizes = {}
    for name, entry in files.items():  # every size before any checksum: a stat is cheaper than a read
        file = folder / name
        if not file.is_file():
            return f"{name}: missing"
        sizes[name] = file.stat().st_size
        if sizes[name] != entry["size"]:
            return f"{name}: {sizes[name]} bytes, the manifest says {entry['size']}"
    for name, entry in files.items():
        try:
            if _checksum(folder / name, sizes[name]) != entry["sha256"]:
                return f"{name}: its content differs from the manifest's checksum"
        except OSError as error:
            return f"{name}: unreadable ({error.strerror or error})"
    return None


# (folder, problem) pairs already warned about: the command line resolves "latest" when it checks its arguments and
# again when the run starts, and the user should read each damage once.
_reported_damage: set[tuple[str, str]] = set()


def _warn_damaged(path: Path, problem: str, resumed: Path) -> None:
    key = (str(path.resolve()), problem)
    # every process of a launch resolves the checkpoint; one report per machine is enough (LOCAL_RANK: torchrun's)
    if key in _reported_damage or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    _reported_damage.add(key)
    logger.warning(f"{path.name} is damaged ({problem}): resuming from {resumed.name}")


def resolve_checkpoint(resume_from_checkpoint: str, output_dir: str | Path) -> Path:
    """The checkpoint folder to resume from: a path, or "latest" (the newest complete one under
    `output_dir/checkpoints`; each damaged newer one is skipped with a warning that names it and its damage).

    Args:
        resume_from_checkpoint: "latest", or the path of a checkpoint folder.
        output_dir: The run's output folder, where "latest" looks.

    Returns:
        The checkpoint folder.

    Raises:
        FileNotFoundError: The path does not exist, or "latest" finds no (complete) checkpoint.
        ValueError: The path is not a training checkpoint, or it does not match its manifest.
    """
    if resume_from_checkpoint == "latest":
        root = str(Path(output_dir) / CHECKPOINTS_DIR)
        found = _checkpoint_folders(output_dir)
        if not found:
            raise FileNotFoundError(f"--resume_from_checkpoint latest: no checkpoint under {root!r}.")
        damaged = []
        for path in reversed(found):
            problem = checkpoint_problem(path)
            if problem is None:
                for skipped, why in damaged:
                    _warn_damaged(skipped, why, path)
                return path
            damaged.append((path, problem))
        shown = "; ".join(f"{path.name} ({problem})" for path, problem in damaged)
        raise FileNotFoundError(
            f"--resume_from_checkpoint latest: no complete checkpoint under {root!r}, all are damaged: {shown}."
        )
    path = Path(resume_from_checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"--resume_from_checkpoint {str(path)!r} does not exist.")
    if not (path / STATE_FILE).is_file() and not (path / MANIFEST_FILE).is_file():
        raise ValueError(
            f"--resume_from_checkpoint {str(path)!r} is not a training checkpoint of hf_vit_plus (no {STATE_FILE}); "
            "to start from saved weights use --model_name_or_path."
        )
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ValueError(
            f"--resume_from_checkpoint {str(path)!r} is damaged: {problem}; resume from an earlier checkpoint "
            "(--resume_from_checkpoint latest takes the newest complete one)."
        )
    return path


def read_training_state(path: Path) -> dict:
    state = json.loads((path / STATE_FILE).read_text())
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"{str(path / STATE_FILE)!r} is not an hf_vit_plus training state.")
    return state


def model_fingerprint(config) -> dict:
    """The config fields that identify a model (JSON-safe)."""
    data = json.loads(config.to_json_string(use_diff=False))
    return {k: v for k, v in data.items() if k not in _VOLATILE_CONFIG_KEYS}


def check_same_model(state: dict, family: str, fingerprint: dict, path: Path) -> None:
    """Refuse a checkpoint that belongs to another family or another model configuration, naming the difference."""
    if state["family"] != family:
        raise ValueError(
            f"Checkpoint {str(path)!r} belongs to the {state['family']!r} family, not {family!r}: refusing to resume."
        )
    saved = state["model_config"]
    keys = sorted(set(saved) | set(fingerprint))
    diffs = [k for k in keys if saved.get(k) != fingerprint.get(k)]
    if diffs:
        shown = "; ".join(f"{k}: checkpoint={saved.get(k)!r}, this run={fingerprint.get(k)!r}" for k in diffs[:8])
        raise ValueError(
            f"Checkpoint {str(path)!r} belongs to another model ({saved.get('model_type')!r}); config fields "
            f"differ: {shown}. Refusing to resume."
        )


def check_same_layout(state: dict, layout: str, path: Path, layouts: dict[str, str]) -> None:
    """Refuse a checkpoint whose model and optimizer are laid out otherwise than this run reads them (a DDP state
    under FSDP, or the reverse), naming both layouts (`layouts`: name -> description)."""
    saved = state.get("checkpoint_layout", "replicated")
    if saved == layout:
        return
    if layout == "replicated":
        how = "with the sharding it was saved with (--fsdp, or the same accelerate config)"
    elif saved == "replicated":
        how = "without --fsdp and without an FSDP accelerate config, as it was saved"
    else:
        how = "with the fsdp_config state_dict_type it was saved with"
    raise ValueError(
        f"Checkpoint {str(path)!r} holds {layouts.get(saved, saved)}, but this run reads {layouts[layout]}: resume "
        f"it {how}. Refusing to resume."
    )


def keep_one_name_per_tensor(models: list, weights: list[dict], output_dir: str) -> None:
    """`accelerator.save_state`'s pre-hook: each model state dict keeps one name per tensor, the first, as
    accelerate's safetensors writer keeps it, which otherwise removes the others itself with a warning at every save
    ("Removed shared tensor {'lm_head.weight'} while saving"). The file is the same; a tied weight comes back through
    the model's own tie when the state is loaded.

    Args:
        models: the prepared models (unused).
        weights: their state dicts, changed in place (the FSDP and DeepSpeed paths pass none: they write their own).
        output_dir: the checkpoint's folder (unused).
    """
    for state in weights:
        first_name = {}
        for name in list(state):
            tensor = state[name]
            if not torch.is_tensor(tensor):
                continue
            storage = id_tensor_storage(tensor)
            if storage in first_name:
                del state[name]
            else:
                first_name[storage] = name


def save_checkpoint(
    accelerator: Accelerator, output_dir: Path, state: dict, total_limit: int | None, processor=None
) -> Path:
    """`accelerator.save_state` into a temporary folder, its manifest last, then one rename: a checkpoint is complete
    or absent, and one damaged later shows as such (`checkpoint_problem`)."""
    root = output_dir / CHECKPOINTS_DIR
    final = root / f"{CHECKPOINT_PREFIX}{state['global_step']}"
    tmp = root / f".tmp-{CHECKPOINT_PREFIX}{state['global_step']}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    hook = accelerator.register_save_state_pre_hook(keep_one_name_per_tensor)
    try:
        full = _out_of_space(lambda: accelerator.save_state(str(tmp), safe_serialization=True), root)
    finally:
        hook.remove()
    # every process's files (its random states, its shards) are written before the main process's manifest vouches for
    # them: without this, a process still writing gives a manifest that misses its file or records it half-written
    accelerator.wait_for_everyone()

    def finish_main_files():
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, default=str))
        if processor is not None:
            processor.save_pretrained(tmp / PROCESSOR_DIR)
        write_manifest(tmp)  # last: a manifest vouches for files that were all written before it

    if accelerator.is_main_process and not full:
        full = _out_of_space(finish_main_files, root)
    if _on_any_process(accelerator, full):  # every process stops, the one line said once
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written is left
        accelerator.wait_for_everyone()
        complete = complete_checkpoint_dirs(output_dir)
        needed = sum(p.stat().st_size for p in complete[-1].rglob("*") if p.is_file()) if complete else None
        message = out_of_space_message(final.name, root, needed, complete[-1] if complete else None)
        raise OutOfSpaceError(message, main_process=accelerator.is_main_process)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        if total_limit is not None:
            for old in checkpoints_to_prune(output_dir, total_limit):
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _out_of_space(write, folder: Path) -> bool:
    """Run `write()`; True when it ran out of disk space (or a file-size limit), any other failure raised."""
    try:
        write()
    except SAVE_ERRORS as error:
        if not is_out_of_space(error, folder):
            raise
        logger.debug("out of space while writing in %s: %s", folder, error)
        return True
    return False


def _on_any_process(accelerator: Accelerator, flag: bool) -> bool:
    """Whether `flag` holds on any process (a collective: every process calls it)."""
    if accelerator.num_processes == 1:
        return flag
    import torch

    total = accelerator.reduce(torch.tensor([int(flag)], device=accelerator.device), reduction="sum")
    return bool(total.item())


def checkpoints_to_prune(output_dir: str | Path, total_limit: int) -> list[Path]:
    """The checkpoints that --save_total_limit deletes: all but the newest `total_limit` complete ones. Damaged
    checkpoints do not count; those older than the newest complete one go, those newer stay (nothing newer can be
    resumed, so they are left for the user to look at).

    Args:
        output_dir: The run's output folder.
        total_limit: How many complete checkpoints to keep (at least 1).

    Returns:
        The folders to delete, newest first.
    """
    kept, prune = 0, []
    for path in reversed(_checkpoint_folders(output_dir)):
        if kept >= total_limit:  # older than every kept one: no need to read it
            prune.append(path)
        elif checkpoint_problem(path) is None:
            kept += 1
        elif kept:
            prune.append(path)
    return prune
