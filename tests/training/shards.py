"""Small data sets written by the tests as a user at scale keeps them: parquet shards, WebDataset tars, jsonl shards
and image folders, made from the digits (scikit-learn), Fashion-MNIST (Debian's package; the tests that need it skip
without it) and the number-words pairs. Every example carries an "id" so that a test can say which were read."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

DIGIT_CLASSES = [str(i) for i in range(10)]


def _encoded(array: np.ndarray, image_format: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(buffer, format=image_format)
    return buffer.getvalue()


def digit_rows(count: int, image_format: str = "PNG") -> list[dict]:
    """The first `count` digits (8x8, scaled to 0..255) as encoded images with their label and an id."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[:count] * 255 / 16).round()
    return [{"image": _encoded(image, image_format), "label": int(label), "id": index}
            for index, (image, label) in enumerate(zip(images, digits.target[:count]))]  # fmt: skip


def fashion_rows(count: int, image_format: str = "JPEG") -> list[dict]:
    """The first `count` Fashion-MNIST training images (28x28) as encoded images; skips the test without the
    package."""
    from hf_vit_plus.data.fashion_mnist import load_fashion_mnist_arrays

    try:
        images, labels = load_fashion_mnist_arrays("train")
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return [{"image": _encoded(images[i], image_format), "label": int(labels[i]), "id": i} for i in range(count)]


def pair_rows(count: int) -> list[dict]:
    """The number-words pairs ("17" -> "seventeen") of the numbers 0..count-1 in a shuffled order, with an id."""
    from hf_vit_plus.data.number_words import load_number_words_dataset

    words = load_number_words_dataset(max_number=count - 1, num_test=1, seed=0)
    rows = [dict(row) for split in ("train", "test") for row in words[split]]
    return [{"source": row["source"], "target": row["target"], "id": index} for index, row in enumerate(rows)]


def text_rows(count: int) -> list[dict]:
    """`count` texts (the lines of the Python standard library's json package, 20 at a time), with an id."""
    import json as json_module

    lines = []
    for path in sorted(Path(json_module.__file__).parent.glob("*.py")):
        lines += path.read_text().splitlines()
    rows = []
    for index in range(count):
        chunk = lines[(20 * index) % len(lines) : (20 * index) % len(lines) + 20]
        rows.append({"text": "\n".join(chunk) + f"\n# {index}\n", "id": index})
    return rows


def _split(rows: list[dict], shards: int) -> list[list[dict]]:
    size = -(-len(rows) // shards)
    return [rows[i * size : (i + 1) * size] for i in range(shards)]


def write_parquet(rows: list[dict], folder: Path, shards: int, image_column: str | None = "image",
                  classes: list[str] | None = DIGIT_CLASSES) -> Path:  # fmt: skip
    """`rows` as `shards` parquet files written by `datasets` (the image column an `Image` feature, the label a
    `ClassLabel` of `classes`), named train-00000-of-0000N.parquet as the Hub names them."""
    from datasets import ClassLabel, Dataset, Features, Value
    from datasets import Image as ImageFeature

    folder.mkdir(parents=True, exist_ok=True)
    kinds = {"id": Value("int64"), "label": ClassLabel(names=classes) if classes else Value("int64"),
             "source": Value("string"), "target": Value("string"), "text": Value("string")}  # fmt: skip
    columns = list(rows[0])
    features = Features({name: ImageFeature() if name == image_column else kinds[name] for name in columns})
    for index, part in enumerate(_split(rows, shards)):
        values = [{**row, image_column: {"bytes": row[image_column], "path": None}} if image_column in row else row
                  for row in part]  # fmt: skip
        Dataset.from_list(values, features=features).to_parquet(folder / f"train-{index:05d}-of-{shards:05d}.parquet")
    return folder


def write_webdataset(rows: list[dict], folder: Path, shards: int, extension: str = "jpg") -> Path:
    """`rows` (image, label, id) as `shards` WebDataset tars: per example KEY.EXT (the image) and KEY.cls (the
    label)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, part in enumerate(_split(rows, shards)):
        with tarfile.open(folder / f"train-{index:05d}.tar", "w") as tar:
            for row in part:
                for name, data in ((f"{row['id']:06d}.{extension}", row["image"]),
                                   (f"{row['id']:06d}.cls", str(row["label"]).encode())):  # fmt: skip
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return folder


def write_jsonl(rows: list[dict], folder: Path, shards: int) -> Path:
    """`rows` as `shards` jsonl files."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, part in enumerate(_split(rows, shards)):
        with (folder / f"train-{index:05d}.jsonl").open("w") as file:
            for row in part:
                file.write(json.dumps(row) + "\n")
    return folder


def write_image_folder(rows: list[dict], folder: Path, extension: str = "png",
                       classes: list[str] = DIGIT_CLASSES) -> Path:  # fmt: skip
    """`rows` as an image folder: one sub-folder per class, a file per image named by its id."""
    for row in rows:
        target = folder / classes[row["label"]]
        target.mkdir(parents=True, exist_ok=True)
        (target / f"{row['id']:06d}.{extension}").write_bytes(row["image"])
    return folder
