"""User data for the training scripts: a Hub data set (`--dataset_name`), an image folder or a folder of shards
(`--train_dir`), or data files (`--train_file`: text / csv / json(l) / parquet / arrow / WebDataset tars, or a
pattern of shards), returned as a `DatasetDict` with "train" and "validation" splits (`load_user_dataset`), or with
`--streaming` as a stream of training examples and a validation split read whole (`load_user_stream`).

Columns are checked up front so that a typo fails with the names that do exist, not deep inside a collator.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import ClassLabel, Dataset, DatasetDict, IterableDataset, load_dataset
from datasets.exceptions import DatasetGenerationError

from .files import file_builder, folder_files, is_glob, matching_files

logger = logging.getLogger(__name__)

VALIDATION_SPLIT_NAMES = ("validation", "valid", "val", "test", "dev")


@dataclass(frozen=True)
class DataSource:
    """What `load_dataset` is called with for the user's data.

    Attributes:
        option: the option that named the data ("--dataset_name", "--train_dir", "--train_file").
        value: its value.
        path: `load_dataset`'s first argument: a Hub id or folder (--dataset_name), else the builder of the files.
        name: the data set's configuration (--dataset_config_name).
        data_files: split -> files, for local files; None for --dataset_name.
        validation_option: the option that named the validation files, if any.
        validation_value: its value.
        kwargs: further keywords of `load_dataset` (a .tsv file's delimiter).
    """

    option: str
    value: str
    path: str
    name: str | None = None
    data_files: dict[str, list[str]] | None = None
    validation_option: str | None = None
    validation_value: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


def user_data_source(
    *,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_dir: str | None = None,
    validation_dir: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
) -> DataSource:
    """How `load_dataset` reads the user's data: checked (the paths exist and hold files of one kind), not read.

    Args:
        dataset_name: a Hub id or a local folder that `load_dataset` reads.
        dataset_config_name: its configuration.
        train_dir: an image folder (one sub-folder per class), or a folder of shards (parquet, arrow, WebDataset
            tars, jsonl, csv).
        validation_dir: the same for the evaluation data.
        train_file: a data file, or a pattern of shards.
        validation_file: the same for the evaluation data.

    Returns:
        The source.

    Raises:
        ValueError: no data, a path that does not exist or holds nothing readable, files of several kinds.
    """
    if dataset_name:
        if _looks_like_a_path(dataset_name) and not Path(dataset_name).exists():
            raise ValueError(f"--dataset_name {dataset_name!r} does not exist (neither a local folder nor a Hub id).")
        return DataSource("--dataset_name", dataset_name, dataset_name, name=dataset_config_name)
    if train_dir:
        builders = {}
        for option, folder in (("--train_dir", train_dir), ("--validation_dir", validation_dir)):
            if folder:
                _require_exists(folder, option)
                if not any(path.is_file() for path in Path(folder).rglob("*")):
                    raise ValueError(
                        f"{option} {folder!r} holds no files: expected one sub-folder of images per class, or shards."
                    )
                builders[option] = folder_files(folder)
        builder, files = builders["--train_dir"]
        data_files = {"train": files}
        if validation_dir:
            if builders["--validation_dir"][0] != builder:
                raise ValueError(
                    f"--train_dir {train_dir!r} ({builder}) and --validation_dir {validation_dir!r} "
                    f"({builders['--validation_dir'][0]}) hold different kinds of data."
                )
            data_files["validation"] = builders["--validation_dir"][1]
        return DataSource("--train_dir", train_dir, builder, data_files=data_files,
                          validation_option="--validation_dir" if validation_dir else None,
                          validation_value=validation_dir or None)  # fmt: skip
    if train_file:
        builder = file_builder(train_file)
        data_files = {}
        for split, option, file in (("train", "--train_file", train_file),
                                    ("validation", "--validation_file", validation_file)):  # fmt: skip
            if not file:
                continue
            if is_glob(file):
                files = matching_files(file)
                if not files:
                    raise FileNotFoundError(f"{option} {file!r} matches no file.")
            else:
                _require_exists(file, option)
                files = [file]
            for name in files:
                if Path(name).stat().st_size == 0:
                    raise ValueError(f"{option} {name!r} is empty.")
            data_files[split] = files
        if validation_file and file_builder(validation_file) != builder:
            raise ValueError(
                f"--train_file {train_file!r} and --validation_file {validation_file!r} have different formats."
            )
        kwargs = {"delimiter": "\t"} if Path(train_file).suffix.lower() == ".tsv" else {}
        validation_option = "--validation_file" if validation_file else None
        return DataSource("--train_file", train_file, builder, data_files=data_files,
                          validation_option=validation_option, validation_value=validation_file or None,
                          kwargs=kwargs)  # fmt: skip
    raise ValueError("No data given: pass --dataset_name, --train_dir or --train_file.")


def load_user_dataset(source: DataSource, validation_split_percentage: float = 10.0, seed: int = 42) -> DatasetDict:
    """Load the user's data (`source`: `user_data_source`) as a `DatasetDict` with "train" and "validation".

    A missing validation split is carved out of "train" (`validation_split_percentage`, stratified when the
    data has a `ClassLabel` column).
    """
    with _data_errors(source.option, source.value):
        raw = load_dataset(source.path, source.name, data_files=source.data_files, **source.kwargs)
    return ensure_validation_split(raw, validation_split_percentage, seed)


@dataclass(frozen=True)
class UserStream:
    """The user's training data as a stream, and the evaluation data when the source has some.

    Attributes:
        train: the training examples, a `datasets.IterableDataset` (nothing read yet).
        validation: the evaluation split read whole (a memory-mapped `Dataset`), or None when the source has none.
        validation_from: where the evaluation split comes from, in words ("the validation split", "--validation_file
            X"); "" without one.
    """

    train: IterableDataset
    validation: Dataset | None
    validation_from: str = ""


def load_user_stream(source: DataSource) -> UserStream:
    """The user's training data as a stream (`load_dataset(..., streaming=True)`): Hub data sets, local folders and
    files of any format `user_data_source` reads. The evaluation data, from a validation split of the source or from
    --validation_file / --validation_dir, is read whole (`load_dataset(..., split=...)`: Arrow, memory-mapped), since
    every evaluation reads all of it.

    Args:
        source: the user's data, as `user_data_source` describes it.

    Returns:
        The stream and the evaluation split (None when the source has none).

    Raises:
        ValueError: data that cannot be read, naming the option.
    """
    with _data_errors(source.option, source.value):
        streams = load_dataset(source.path, source.name, data_files=source.data_files, streaming=True, **source.kwargs)
    if "train" not in streams:
        raise ValueError(f"{source.option} {source.value!r}: the data set has no 'train' split (splits: "
                         f"{sorted(streams)}).")  # fmt: skip
    split = next((name for name in VALIDATION_SPLIT_NAMES if name in streams), None)
    if split is None:
        return UserStream(streams["train"], None)
    with _data_errors(source.validation_option or source.option, source.value):
        validation = load_dataset(source.path, source.name, data_files=source.data_files, split=split,
                                  **source.kwargs)  # fmt: skip
    where = f"the {split!r} split"
    if source.validation_option:
        where = f"{source.validation_option} {source.validation_value}"
    return UserStream(streams["train"], validation, where)


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
