"""User data for the training scripts: a Hub data set (`--dataset_name`), an image folder (`--train_dir`) or
text/csv/json files (`--train_file`), always returned as a `DatasetDict` with "train" and "validation" splits.

Columns are checked up front so that a typo fails with the names that do exist, not deep inside a collator.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from pathlib import Path

from datasets import ClassLabel, DatasetDict, load_dataset
from datasets.exceptions import DatasetGenerationError

logger = logging.getLogger(__name__)

_FILE_BUILDERS = {".txt": "text", ".text": "text", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json"}
VALIDATION_SPLIT_NAMES = ("validation", "valid", "val", "test", "dev")


def file_builder(path: str | Path) -> str:
    """The `load_dataset` builder of a data file, from its extension."""
    suffix = Path(path).suffix.lower()
    if suffix not in _FILE_BUILDERS:
        raise ValueError(f"Cannot read {str(path)!r}: expected one of the extensions {sorted(_FILE_BUILDERS)}.")
    return _FILE_BUILDERS[suffix]


def load_user_dataset(
    *,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_dir: str | None = None,
    validation_dir: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    validation_split_percentage: float = 10.0,
    seed: int = 42,
) -> DatasetDict:
    """Load user data as a `DatasetDict` with "train" and "validation".

    A missing validation split is carved out of "train" (`validation_split_percentage`, stratified when the
    data has a `ClassLabel` column).
    """
    if dataset_name:
        if _looks_like_a_path(dataset_name) and not Path(dataset_name).exists():
            raise ValueError(f"--dataset_name {dataset_name!r} does not exist (neither a local folder nor a Hub id).")
        with _data_errors("--dataset_name", dataset_name):
            raw = load_dataset(dataset_name, dataset_config_name)
    elif train_dir:
        for option, folder in (("--train_dir", train_dir), ("--validation_dir", validation_dir)):
            if folder:
                _require_exists(folder, option)
                if not any(path.is_file() for path in Path(folder).rglob("*")):
                    raise ValueError(
                        f"{option} {folder!r} holds no files: expected one sub-folder of images per class."
                    )
        data_files = {"train": str(Path(train_dir) / "**")}
        if validation_dir:
            data_files["validation"] = str(Path(validation_dir) / "**")
        with _data_errors("--train_dir", train_dir):
            raw = load_dataset("imagefolder", data_files=data_files)
    elif train_file:
        builder = file_builder(train_file)
        data_files = {"train": train_file}
        for option, file in (("--train_file", train_file), ("--validation_file", validation_file)):
            if file:
                _require_exists(file, option)
                if Path(file).stat().st_size == 0:
                    raise ValueError(f"{option} {file!r} is empty.")
        if validation_file:
            if file_builder(validation_file) != builder:
                raise ValueError(
                    f"--train_file {train_file!r} and --validation_file {validation_file!r} have different formats."
                )
            data_files["validation"] = validation_file
        kwargs = {"delimiter": "\t"} if Path(train_file).suffix.lower() == ".tsv" else {}
        with _data_errors("--train_file", train_file):
            raw = load_dataset(builder, data_files=data_files, **kwargs)
    else:
        raise ValueError("No data given: pass --dataset_name, --train_dir or --train_file.")
    return ensure_validation_split(raw, validation_split_percentage, seed)


def ensure_validation_split(raw: DatasetDict, validation_split_percentage: float, seed: int) -> DatasetDict:
    if "train" not in raw:
        raise ValueError(f"The data set has no 'train' split (splits: {sorted(raw)}).")
    for name in VALIDATION_SPLIT_NAMES:
        if name in raw:
            return DatasetDict(train=raw["train"], validation=raw[name])
    train = raw["train"]
    if len(train) < 2:
        raise ValueError(
            f"The training data has {len(train)} example(s): a validation split needs at least 2 (or give a "
            "validation file or folder)."
        )
    held_out = math.ceil(len(train) * validation_split_percentage / 100.0)  # as `train_test_split` rounds
    if held_out >= len(train):
        raise ValueError(
            f"--validation_split_percentage {validation_split_percentage:g} of {len(train)} training examples holds "
            f"out {held_out}, leaving none to train on (or give a validation file or folder)."
        )
    stratify = next((k for k, v in train.features.items() if isinstance(v, ClassLabel)), None)
    test_size = validation_split_percentage / 100.0
    try:
        split = train.train_test_split(test_size=test_size, seed=seed, stratify_by_column=stratify)
    except ValueError:  # too few examples of a class to stratify
        split = train.train_test_split(test_size=test_size, seed=seed)
    logger.info("No validation split: using %.1f%% of the training data.", validation_split_percentage)
    return DatasetDict(train=split["train"], validation=split["test"])


def pick_column(column_names: Sequence[str], requested: str | None, candidates: Sequence[str], role: str) -> str:
    """The column to use for `role`: the requested one (checked) or the first of `candidates` present."""
    if requested is not None:
        if requested not in column_names:
            raise ValueError(f"Unknown column {role}={requested!r}. Available columns: {list(column_names)}.")
        return requested
    for name in candidates:
        if name in column_names:
            return name
    raise ValueError(
        f"Cannot guess the {role}: none of {list(candidates)} is a column ({list(column_names)}); pass {role}."
    )


def label_names(dataset: DatasetDict, label_column: str) -> list[str]:
    """Class names of `label_column`: the ClassLabel's names, else the sorted distinct values."""
    feature = dataset["train"].features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    values = set()
    for split in dataset.values():
        values.update(split.unique(label_column))
    if all(isinstance(v, int) for v in values):
        if min(values) < 0:
            raise ValueError(f"Label column {label_column!r} has negative labels ({min(values)}).")
        return [str(i) for i in range(max(values) + 1)]
    return sorted(str(v) for v in values)


def check_labels(names: Sequence[str], num_labels: int, *, model: str, label_column: str) -> None:
    if len(names) != num_labels:
        raise ValueError(
            f"The data set's label column {label_column!r} has {len(names)} classes but the model {model!r} "
            f"has num_labels={num_labels}. Use a data set with {num_labels} classes, or pass "
            "--ignore_mismatched_sizes to train a new head."
        )


def _looks_like_a_path(name: str) -> bool:
    """A --dataset_name that can only be a local path (a Hub id is 'name' or 'namespace/name')."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).exists()


@contextlib.contextmanager
def _data_errors(option: str, value: str):
    """What the datasets library raises for data it cannot read (no files, a format it cannot parse, an unknown
    Hub data set offline), as a `ValueError` naming the option."""
    try:
        yield
    except (ValueError, FileNotFoundError, ConnectionError, DatasetGenerationError) as error:
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{option} {value!r} could not be read: {cause}") from error


def _require_exists(path: str, option: str) -> None:
    if not Path(path).exists():
        raise FileNotFoundError(f"{option} {path!r} does not exist.")
