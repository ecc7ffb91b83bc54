"""Adapter folders (`PeftModel.save_pretrained`: adapter_config.json + adapter_model.safetensors, no base weights):
recognising one, and its model card, which names the base model (`base_model` in the metadata) and says how to load
the adapter onto it. `hf-vit-plus push` uploads such a folder as it uploads a model folder."""

from __future__ import annotations

import json
from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def is_adapter_folder(folder: str | Path) -> bool:
    """A folder `PeftModel.save_pretrained` wrote (an adapter, without the base model's weights)."""
    return all((Path(folder) / name).is_file() for name in ADAPTER_FILES)


def adapter_base_model(folder: str | Path) -> str | None:
    """The base model an adapter folder names (adapter_config.json's `base_model_name_or_path`)."""
    config = json.loads((Path(folder) / "adapter_config.json").read_text(encoding="utf-8"))
    return config.get("base_model_name_or_path") if isinstance(config, dict) else None


def adapter_card(
    folder: str | Path,
    *,
    family: str | None,
    base_model: str | None = None,
    repo_id: str | None = None,
    eval_results: dict[str, float] | None = None,
    dataset_name: str | None = None,
    figures: list[str | Path] = (),
    learning_warning: str | None = None,
    license: str = "apache-2.0",
):
    """The `huggingface_hub.ModelCard` of an adapter folder: `base_model` (default: what adapter_config.json names;
    in the metadata when it is a Hub id, not a local folder, which the Hub would refuse there) and
    `library_name: peft`, the adapter's rank and target modules, how to load it onto the base model (with the
    family's Auto class), the evaluation results (after `learning_warning`, the training run's learning check, when the
    adapter did not learn) and `figures` (paths inside the folder)."""
    from huggingface_hub import ModelCard, ModelCardData

    from ..families import FAMILIES
    from .card import check_license, hub_base_model

    folder = Path(folder)
    config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    base_model = base_model or config.get("base_model_name_or_path")
    repo_id = repo_id or folder.resolve().name
    targets = config.get("target_modules")
    targets = ", ".join(sorted(targets)) if isinstance(targets, list) else str(targets)
    data = ModelCardData(
        base_model=hub_base_model(base_model),
        library_name="peft",
        pipeline_tag=FAMILIES[family].card.pipeline_tag if family in FAMILIES else None,
        license=check_license(license),
        tags=["lora", "peft", "hf_vit_plus", *([family] if family else [])],
        datasets=[dataset_name] if dataset_name else None,
    )
    auto_class = FAMILIES[family].head if family in FAMILIES else "AutoModel"
    warning = f"> **This adapter did not learn its task.** {learning_warning}\n\n" if learning_warning else ""
    pictures = "".join(f"![{Path(p).stem}]({_inside(Path(p), folder)})\n" for p in figures)
    results = "".join(
        f"| {name} | {value:.4g} |\n" for name, value in (eval_results or {}).items() if isinstance(value, int | float)
    )
    content = (
        f"""---
{data.to_yaml()}
---

# {repo_id}

A LoRA adapter (rank {config.get("r")}, alpha {config.get("lora_alpha")}) of `{base_model}`, trained with
hf_vit_plus{f" ({family} family)" if family else ""}. Adapted modules: {targets}. Modules trained in full and saved
with it: {", ".join(config.get("modules_to_save") or []) or "none"}.

## Use

```python
import hf_vit_plus  # registers the model classes (or pass trust_remote_code=True)
from peft import PeftModel
from transformers import {auto_class}

base = {auto_class}.from_pretrained("{base_model}")
model = PeftModel.from_pretrained(base, "{repo_id}")
merged = model.merge_and_unload()  # a plain model of the family, adapter folded into its weights
```
"""
        + (f"\n## Evaluation results\n\n{warning}| metric | value |\n|---|---|\n{results}" if results else "")
        + (f"\n## Training\n\n{pictures}" if pictures else "")
    )
    return ModelCard(content)


def _inside(path: Path, folder: Path) -> str:
    """`path` relative to the card's folder (figures are written there), as the card links it."""
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return path.name


def write_adapter_card(folder: str | Path, **options) -> Path:
    """`adapter_card(folder, **options)` written to folder/README.md."""
    path = Path(folder) / "README.md"
    adapter_card(folder, **options).save(path)
    return path
