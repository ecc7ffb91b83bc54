"""Model-card metadata checked offline: the YAML block of a README.md read (`load_card_metadata`) and checked against
the Hub's rules (`validate_card_metadata`: required keys, the Hub's licence ids and pipeline tags, the model-index as
huggingface_hub reads it), since `ModelCard.validate()` needs the real Hub. `card.py` writes the cards.
"""

from __future__ import annotations

import math
import re
from numbers import Real
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.repocard_data import model_index_to_eval_results
from huggingface_hub.utils import validate_repo_id

# The Hub's pipeline tags (huggingface.js `PIPELINE_DATA`), for `validate_card_metadata`.
PIPELINE_TAGS = frozenset(
    """text-classification token-classification table-question-answering question-answering zero-shot-classification
    translation summarization feature-extraction text-generation text2text-generation fill-mask sentence-similarity
    text-to-speech text-to-audio automatic-speech-recognition audio-to-audio audio-classification audio-text-to-text
    voice-activity-detection depth-estimation image-classification object-detection image-segmentation text-to-image
    image-to-text image-to-image image-to-video unconditional-image-generation video-classification
    reinforcement-learning robotics tabular-classification tabular-regression tabular-to-text table-to-text
    multiple-choice text-ranking text-retrieval time-series-forecasting text-to-video image-text-to-text
    visual-question-answering document-question-answering zero-shot-image-classification graph-ml mask-generation
    zero-shot-object-detection text-to-3d image-to-3d image-feature-extraction video-text-to-text keypoint-detection
    visual-document-retrieval any-to-any video-to-video other""".split()
)
# The Hub's licence ids (https://huggingface.co/docs/hub/repositories-licenses), for `--license` and
# `validate_card_metadata`. huggingface_hub (2.x) ships no list of them (`ModelCardData` only links to that page),
# so the list lives here; "other" needs a `license_name`.
HUB_LICENSES = frozenset(
    """apache-2.0 mit openrail bigscience-openrail-m creativeml-openrail-m bigscience-bloom-rail-1.0 bigcode-openrail-m
    afl-3.0 artistic-2.0 bsl-1.0 bsd bsd-2-clause bsd-3-clause bsd-3-clause-clear c-uda cc cc0-1.0 cc-by-2.0
    cc-by-2.5 cc-by-3.0 cc-by-4.0 cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0 cc-by-nc-3.0 cc-by-nc-4.0 cc-by-nd-4.0
    cc-by-nc-nd-3.0 cc-by-nc-nd-4.0 cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0 cdla-sharing-1.0
    cdla-permissive-1.0 cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 etalab-2.0 eupl-1.1 eupl-1.2 agpl-3.0
    gfdl gpl gpl-2.0 gpl-3.0 lgpl lgpl-2.1 lgpl-3.0 isc h-research intel-research lppl-1.3c ms-pl apple-ascl
    apple-amlr mpl-2.0 odc-by odbl openmdw-1.0 openrail++ osl-3.0 postgresql ofl-1.1 ncsa unlicense zlib pddl
    lgpl-lr deepfloyd-if-license fair-noncommercial-research-license llama2 llama3 llama3.1 llama3.2 llama3.3
    llama4 grok2-community gemma unknown other""".split()
)


# Losses stay out of the model-index (as in transformers' Trainer cards): they are in the card's results table.
LOSS_METRIC = re.compile(r"(^|_)loss$")


def is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def load_card_metadata(path: str | Path) -> dict:
    """The YAML metadata block of a model card (README.md) as a dict.

    Raises:
        ValueError: no metadata block, invalid YAML, or not a mapping.
    """
    text = Path(path).read_text(encoding="utf-8")
    match = re.match(r"^---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|$)", text, re.DOTALL)
    if match is None:
        raise ValueError(f"{path} has no YAML metadata block (a first line '---', the YAML, then '---').")
    try:
        metadata = yaml.safe_load(match.group(1))
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: invalid YAML metadata: {err}") from err
    if not isinstance(metadata, dict):
        raise ValueError(f"{path}: the YAML metadata must be a mapping, got {type(metadata).__name__}.")
    return metadata


def _check_str_list(metadata: dict, key: str, errors: list[str], required: bool) -> None:
    value = metadata.get(key)
    if value is None:
        if required:
            errors.append(f"missing required key '{key}'")
        return
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        errors.append(f"'{key}' must be a non-empty list of non-empty strings, got {metadata[key]!r}")


def _items(value, where: str, errors: list[str], name: str | None = None) -> list[tuple[str, Any]]:
    """(location, item) for each item of `value`, which must be a non-empty list (else an error naming it)."""
    if not isinstance(value, list) or not value:
        errors.append(f"{name or where} must be a non-empty list")
        return []
    return [(f"{where}[{i}]", item) for i, item in enumerate(value)]


def _check_model_index(model_index, errors: list[str]) -> None:
    for where, model in _items(model_index, "model-index", errors, name="'model-index'"):
        if not isinstance(model, dict):
            errors.append(f"{where} must be a mapping")
            continue
        if not isinstance(model.get("name"), str) or not model["name"]:
            errors.append(f"{where}.name must be a non-empty string")
        for result_where, result in _items(model.get("results"), f"{where}.results", errors):
            if isinstance(result, dict):
                _check_result(result, result_where, errors)
            else:
                errors.append(f"{result_where} must be a mapping")


def _check_result(result: dict, where: str, errors: list[str]) -> None:
    """One entry of a model-index's results: a Hub task, a named dataset, finite metric values."""
    task = result.get("task")
    if not isinstance(task, dict) or not isinstance(task.get("type"), str):
        errors.append(f"{where}.task.type must be a string")
    elif task["type"] not in PIPELINE_TAGS:
        errors.append(f"{where}.task.type {task['type']!r} is not a Hub task")
    dataset = result.get("dataset")
    if not isinstance(dataset, dict) or not all(isinstance(dataset.get(k), str) for k in ("name", "type")):
        errors.append(f"{where}.dataset must have string 'name' and 'type'")
    elif repo_id_problem(dataset["type"]):
        errors.append(f"{where}.dataset.type {dataset['type']!r} is not a Hub data set id")
    for metric_where, metric in _items(result.get("metrics"), f"{where}.metrics", errors):
        if not isinstance(metric, dict) or not isinstance(metric.get("type"), str) or not metric["type"]:
            errors.append(f"{metric_where}.type must be a non-empty string")
            continue
        value = metric.get("value")
        if not is_number(value) or not math.isfinite(value):
            errors.append(f"{metric_where}.value must be a finite number, got {value!r}")


def validate_card_metadata(path: str | Path, *, require_datasets: bool = True) -> list[str]:
    """Check a model card's metadata offline.

    Checks: a YAML mapping; the keys license, library_name, pipeline_tag, tags, datasets present and well typed;
    pipeline_tag one of the Hub's tasks; metrics a list of strings; base_model a string or list of strings; a
    model-index (when present) with a name and results whose task type is a Hub task, whose dataset has a name
    and type, and whose metric values are finite numbers.

    Args:
        path: the card (a README.md with YAML front matter).
        require_datasets: whether `datasets` must be present; False for a card rendered by `model_card_from_config`,
            whose training data was not recorded.

    Returns:
        The problems found, one line each; an empty list when the metadata is valid.
    """
    path = Path(path)
    if not path.is_file():
        return [f"{path} does not exist"]
    try:
        metadata = load_card_metadata(path)
    except (ValueError, UnicodeDecodeError) as err:
        return [str(err)]
    return metadata_problems(metadata, require_datasets=require_datasets)


def metadata_problems(metadata: dict, *, require_datasets: bool) -> list[str]:
    errors: list[str] = []
    for key in ("license", "library_name", "pipeline_tag"):
        value = metadata.get(key)
        if value is None:
            errors.append(f"missing required key '{key}'")
        elif not isinstance(value, str) or not value.strip():
            errors.append(f"'{key}' must be a non-empty string, got {value!r}")
    license_id = metadata.get("license")
    if isinstance(license_id, str) and not re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", license_id):
        errors.append(f"'license' must be a Hub license id (lowercase, e.g. 'apache-2.0'), got {license_id!r}")
    elif isinstance(license_id, str) and license_id not in HUB_LICENSES:
        errors.append(f"'license' {license_id!r} is not one of the Hub's licence ids")
    if license_id == "other" and not metadata.get("license_name"):
        errors.append("'license: other' needs a 'license_name'")
    pipeline_tag = metadata.get("pipeline_tag")
    if isinstance(pipeline_tag, str) and pipeline_tag not in PIPELINE_TAGS:
        errors.append(f"'pipeline_tag' {pipeline_tag!r} is not a Hub task")
    _check_str_list(metadata, "tags", errors, required=True)
    _check_str_list(metadata, "datasets", errors, required=require_datasets)
    _check_str_list(metadata, "metrics", errors, required=False)
    _check_str_list(metadata, "base_model", errors, required=False)
    _check_str_list(metadata, "language", errors, required=False)
    base_models = metadata.get("base_model")
    for base in [base_models] if isinstance(base_models, str) else base_models or []:
        if isinstance(base, str) and repo_id_problem(base):
            errors.append(f"'base_model' {base!r} is not a Hub model id ({repo_id_problem(base)})")
    if "model_name" in metadata:  # huggingface_hub writes it into the model-index; alone it is a stray key
        errors.append("'model_name' outside a model-index is not a Hub metadata key")
    if "model-index" in metadata:
        _check_model_index(metadata["model-index"], errors)
        listed = metadata.get("datasets") or []
        for model in metadata["model-index"] if isinstance(metadata["model-index"], list) else []:
            for result in (model.get("results") or []) if isinstance(model, dict) else []:
                kind = result.get("dataset", {}).get("type") if isinstance(result, dict) else None
                if isinstance(kind, str) and kind not in listed:
                    errors.append(f"model-index data set {kind!r} is not in 'datasets' {listed!r}")
        if not errors:
            _check_with_huggingface_hub(metadata, errors)
    return errors


def repo_id_problem(repo_id: str) -> str | None:
    """Why `repo_id` is not a Hub repository id ("namespace/name" or "name"), or None."""
    if repo_id.startswith((".", "/", "~")) or "\\" in repo_id:
        return "a local path"
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        return str(err).splitlines()[0]
    return None


def _check_with_huggingface_hub(metadata: dict, errors: list[str]) -> None:
    """The model-index as huggingface_hub reads it (`model_index_to_eval_results`, then `ModelCardData`, the way
    `ModelCard.load` does): every metric kept, a readable metric name, no loss."""
    try:
        _, results = model_index_to_eval_results(metadata["model-index"])
        data = ModelCardData(**{k: v for k, v in metadata.items()})
    except (KeyError, TypeError, ValueError) as err:
        errors.append(f"huggingface_hub cannot read the model-index: {type(err).__name__}: {err}")
        return
    count = sum(len(r.get("metrics") or []) for m in metadata["model-index"] for r in m.get("results") or [])
    if len(results) != count or len(data.eval_results or []) != count:
        errors.append(f"huggingface_hub reads {len(results)} of the model-index's {count} metrics")
    for result in results:
        if LOSS_METRIC.search(result.metric_type):
            errors.append(f"model-index metric {result.metric_type!r} is a loss (the results table holds it)")
        name = result.metric_name
        if name is None or re.match(r"(eval|test|predict)_", name) or (name == result.metric_type and "_" in name):
            errors.append(f"model-index metric name {name!r} of {result.metric_type!r} is not a readable name")


__all__ = [
    "HUB_LICENSES",
    "LOSS_METRIC",
    "PIPELINE_TAGS",
    "is_number",
    "load_card_metadata",
    "metadata_problems",
    "repo_id_problem",
    "validate_card_metadata",
]
