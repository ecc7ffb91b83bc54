"""Data files on disk as `datasets` reads them: which builder reads a file or a folder of shards (parquet, arrow,
jsonl / json, csv / tsv, text, WebDataset tars, an image folder), and file patterns ("data/train-*.parquet").

Light on purpose (the standard library only): the command line checks the paths it is given before anything heavy is
imported.
"""

from __future__ import annotations

import glob
from pathlib import Path

# file suffix -> the `load_dataset` builder that reads it
FILE_BUILDERS = {
    ".txt": "text", ".text": "text", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json",
    ".parquet": "parquet", ".arrow": "arrow", ".tar": "webdataset",
}  # fmt: skip
# the builders of shards of examples (a folder of these is read as one data set, not as an image folder)
SHARD_BUILDERS = ("parquet", "arrow", "webdataset", "json", "csv")
_GLOB_CHARACTERS = set("*?[")


def is_glob(path: str | Path) -> bool:
    """Whether `path` is a pattern of files (it holds `*`, `?` or `[`).

    Args:
        path: a path or pattern.

    Returns:
        True for a pattern.
    """
    return bool(_GLOB_CHARACTERS & set(str(path)))


def matching_files(pattern: str | Path) -> list[str]:
    """The files a path or pattern names, sorted (`**` descends into sub-folders).

    Args:
        pattern: a file, or a pattern of files.

    Returns:
        The matching files (the file itself when it exists), sorted.
    """
    expanded = str(Path(pattern).expanduser())
    return sorted(path for path in glob.glob(expanded, recursive=True) if Path(path).is_file())


def file_builder(path: str | Path) -> str:
    """The `load_dataset` builder of a data file (or of the files a pattern names), from its suffix.

    Args:
        path: a file or a pattern of files ("shards/train-*.parquet").

    Returns:
        The builder's name ("parquet", "json", "webdataset", ...).

    Raises:
        ValueError: a suffix no builder reads, or a pattern whose files are of several kinds.
    """
    names = matching_files(path) if is_glob(path) else [str(path)]
    builders = set()
    for name in names or [str(path)]:
        suffix = Path(name).suffix.lower()
        if suffix not in FILE_BUILDERS:
            raise ValueError(f"Cannot read {name!r}: expected one of the extensions {sorted(FILE_BUILDERS)}.")
        builders.add(FILE_BUILDERS[suffix])
    if len(builders) > 1:
        raise ValueError(f"{str(path)!r} names files of several kinds ({', '.join(sorted(builders))}): give one kind.")
    return builders.pop()


def folder_files(folder: str | Path) -> tuple[str, list[str]]:
    """How `load_dataset` reads a folder: its shards of one kind (parquet, arrow, WebDataset tars, jsonl, csv), or
    else an image folder (one sub-folder per class).

    Args:
        folder: the folder.

    Returns:
        (the builder, its data files): the shards sorted, or ["FOLDER/**"] for an image folder.
    """
    files = sorted(str(path) for path in Path(folder).expanduser().rglob("*") if path.is_file())
    for builder in SHARD_BUILDERS:
        shards = [name for name in files if FILE_BUILDERS.get(Path(name).suffix.lower()) == builder]
        if shards:
            return builder, shards
    return "imagefolder", [str(Path(folder).expanduser() / "**")]


__all__ = ["FILE_BUILDERS", "SHARD_BUILDERS", "file_builder", "folder_files", "is_glob", "matching_files"]
