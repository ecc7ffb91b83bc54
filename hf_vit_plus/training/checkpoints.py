"""Training checkpoints on disk: where they are (`OUTPUT_DIR/checkpoints/checkpoint-<update>`), which one to resume
from, their `training_state.json`, the fingerprint that ties a checkpoint to its model, and the atomic save.

A checkpoint holds Accelerate's state (model as safetensors, optimiser, scheduler, RNG states, loaded with
`weights_only=True`) plus `training_state.json` (position in the data, log history and a fingerprint of the model).
It is written to a temporary folder and renamed, so an interrupted save never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from accelerate import Accelerator

STATE_FILE = "training_state.json"
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
    """Complete checkpoints under `output_dir/checkpoints`, oldest first."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    found = [p for p in found if p.name[len(CHECKPOINT_PREFIX) :].isdigit() and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def resolve_checkpoint(resume_from_checkpoint: str, output_dir: str | Path) -> Path:
    """The checkpoint folder to resume from: a path, or "latest" (the newest under `output_dir/checkpoints`)."""
    if resume_from_checkpoint == "latest":
        found = checkpoint_dirs(output_dir)
        if not found:
            raise FileNotFoundError(
                f"--resume_from_checkpoint latest: no checkpoint under {str(Path(output_dir) / CHECKPOINTS_DIR)!r}."
            )
        return found[-1]
    path = Path(resume_from_checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"--resume_from_checkpoint {str(path)!r} does not exist.")
    if not (path / STATE_FILE).is_file():
        raise ValueError(
            f"--resume_from_checkpoint {str(path)!r} is not a training checkpoint of hf_vit_plus (no {STATE_FILE}); "
            "to start from saved weights use --model_name_or_path."
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


def save_checkpoint(
    accelerator: Accelerator, output_dir: Path, state: dict, total_limit: int | None, processor=None
) -> Path:
    """`accelerator.save_state` into a temporary folder, then one rename: a checkpoint is complete or absent."""
    root = output_dir / CHECKPOINTS_DIR
    final = root / f"{CHECKPOINT_PREFIX}{state['global_step']}"
    tmp = root / f".tmp-{CHECKPOINT_PREFIX}{state['global_step']}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, default=str))
        if processor is not None:
            processor.save_pretrained(tmp / PROCESSOR_DIR)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        if total_limit is not None:
            for old in checkpoint_dirs(output_dir)[:-total_limit]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final
