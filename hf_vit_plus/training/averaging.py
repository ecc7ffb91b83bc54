"""Checkpoint averaging (Vaswani et al., 2017, section 6.1: "for the base models, we used a single model obtained
by averaging the last 5 checkpoints").

Reads only safetensors files (`model.safetensors`, or the shards listed in `model.safetensors.index.json`) as
`Trainer`, `save_pretrained` and the Accelerate loop write them; nothing is unpickled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

__all__ = ["average_checkpoints", "average_state_dicts", "last_checkpoints", "load_safetensors_state_dict"]

_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoints(folder: str | Path, count: int) -> list[Path]:
    """The `count` newest `checkpoint-<step>` folders in `folder`, oldest first (by step, not by name)."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{str(folder)!r} is not a folder of checkpoints")
    found = sorted(
        (int(m.group(1)), path)
        for path in folder.iterdir()
        if path.is_dir() and (m := _CHECKPOINT_NAME.match(path.name))
    )
    return [path for _, path in found[-count:]]


def load_safetensors_state_dict(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint folder (single file or sharded) or of one `.safetensors` file."""
    path = Path(checkpoint)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise ValueError(f"only safetensors files are read, got {str(path)!r}")
        return load_file(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    single = path / "model.safetensors"
    if single.is_file():
        return load_file(single)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as error:
            raise ValueError(f"{str(index)!r} is not a safetensors index (no weight_map): {error}") from error
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(path / shard))
        return state
    raise FileNotFoundError(
        f"{str(path)!r} holds no model.safetensors or model.safetensors.index.json (pickled weights are not read)"
    )


def average_state_dicts(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of floating-point tensors (accumulated in float64, returned in the original dtype);
    other tensors (integer buffers, step counters) are taken from the last state. All states must hold the same
    names with the same shapes and dtypes."""
    if not states:
        raise ValueError("no state dicts to average")
    reference = states[-1]
    for i, state in enumerate(states):
        if state.keys() != reference.keys():
            missing = sorted(reference.keys() - state.keys())[:5]
            extra = sorted(state.keys() - reference.keys())[:5]
            raise ValueError(f"state {i} has other tensors than the last one: missing {missing}, extra {extra}")
        for name, tensor in state.items():
            if tensor.shape != reference[name].shape or tensor.dtype != reference[name].dtype:
                raise ValueError(
                    f"state {i}: {name} is {tuple(tensor.shape)} {tensor.dtype}, the last state has "
                    f"{tuple(reference[name].shape)} {reference[name].dtype}"
                )
    averaged = {}
    for name, tensor in reference.items():
        if tensor.is_floating_point():
            total = torch.zeros(tensor.shape, dtype=torch.float64)
            for state in states:
                total += state[name].to(torch.float64)
            averaged[name] = (total / len(states)).to(tensor.dtype)
        else:
            averaged[name] = tensor.clone()
    return averaged


@torch.no_grad()
def average_checkpoints(model: torch.nn.Module, checkpoints: Sequence[str | Path]) -> torch.nn.Module:
    """Load the mean of the checkpoints' weights into `model` (in place) and return it.

    Every tensor of the model must come from the files, except tied copies (`model._tied_weights_keys`, e.g. the
    output projection tied to the shared embedding) and the other names of a module the model holds twice (the
    stacks' embedding that is the shared one, never saved: `_keys_to_ignore_on_save`), which follow their source; a
    file tensor the model lacks is an error, so a checkpoint of another architecture is refused rather than half
    loaded.
    """
    if not checkpoints:
        raise ValueError("no checkpoints to average")
    averaged = average_state_dicts([load_safetensors_state_dict(c) for c in checkpoints])
    own = model.state_dict()
    unexpected = sorted(averaged.keys() - own.keys())
    if unexpected:
        raise ValueError(f"the checkpoints hold tensors this {type(model).__name__} lacks: {unexpected[:5]}")
    for name, tensor in averaged.items():
        if own[name].shape != tensor.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, model shape {tuple(own[name].shape)}")
    result = model.load_state_dict(averaged, strict=False)
    tied = set(_tied_targets(model))
    missing = [k for k in result.missing_keys if k not in tied]
    if missing:
        raise ValueError(f"the checkpoints lack tensors of this {type(model).__name__}: {missing[:5]}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


def _tied_targets(model: torch.nn.Module) -> list[str]:
    targets = []
    for module_name, module in model.named_modules():
        keys = getattr(module, "_tied_weights_keys", None) or {}
        prefix = f"{module_name}." if module_name else ""
        targets += [prefix + key for key in (keys if isinstance(keys, dict) else keys)]
    return targets + list(getattr(model, "_keys_to_ignore_on_save", None) or ())
