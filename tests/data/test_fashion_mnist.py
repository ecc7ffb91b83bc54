"""Fashion-MNIST from Debian's IDX files: the reader, the data set, and a clear error when the package is missing."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from hf_vit_plus.data.fashion_mnist import (
    FASHION_MNIST_DIR,
    load_fashion_mnist,
    load_fashion_mnist_arrays,
    read_idx,
)


def _write_idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def _fake_root(tmp_path, n_train=5, n_test=3):
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n, prefix in (("train", n_train, "train"), ("test", n_test, "t10k")):
        images = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", images)
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", labels)
        arrays[split] = (images, labels)
    return arrays


def test_reader_returns_the_bytes_in_the_header_shape(tmp_path):
    arrays = _fake_root(tmp_path)
    images, labels = load_fashion_mnist_arrays("train", tmp_path)
    np.testing.assert_array_equal(images, arrays["train"][0])
    np.testing.assert_array_equal(labels, arrays["train"][1])
    dataset = load_fashion_mnist(tmp_path)
    assert dataset["train"].num_rows == 5 and dataset["test"].num_rows == 3
    np.testing.assert_array_equal(np.asarray(dataset["test"][1]["image"]), arrays["test"][0][1])
    assert dataset["train"].features["label"].names[9] == "ankle boot"


def test_truncated_and_foreign_files_are_named(tmp_path):
    _write_idx(tmp_path / "ok.gz", np.zeros((2, 3), dtype=np.uint8))
    data = gzip.open(tmp_path / "ok.gz").read()
    with gzip.open(tmp_path / "short.gz", "wb") as handle:
        handle.write(data[:-1])
    with pytest.raises(ValueError, match="short.gz.*truncated"):
        read_idx(tmp_path / "short.gz")
    (tmp_path / "foreign").write_bytes(b"PK\x03\x04rest")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "foreign")


def test_a_missing_install_names_the_debian_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist_arrays("train", tmp_path / "nowhere")
    with pytest.raises(ValueError, match="'validation'"):
        load_fashion_mnist_arrays("validation", tmp_path)


@pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_the_real_files_have_the_published_sizes():
    train_images, train_labels = load_fashion_mnist_arrays("train")
    test_images, test_labels = load_fashion_mnist_arrays("test")
    assert train_images.shape == (60000, 28, 28) and test_images.shape == (10000, 28, 28)
    assert np.bincount(train_labels).tolist() == [6000] * 10 and np.bincount(test_labels).tolist() == [1000] * 10
