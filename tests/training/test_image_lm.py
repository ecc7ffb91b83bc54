"""`hf-vit-plus train image-lm`: the Sparse Transformer on images through the library loop (bits per dim on the test
split beside the uniform and per-pixel-histogram floors, card, curves), the floors themselves, and bad input."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch

from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM, SparseTransformerForImageGeneration
from hf_vit_plus.cli import main
from hf_vit_plus.data.pixel_baselines import pixel_floors, pixel_histogram_bits_per_dim, uniform_bits_per_dim
from hf_vit_plus.errors import UsageError
from hf_vit_plus.hub.card import load_card_metadata, validate_card_metadata
from hf_vit_plus.training.args import family_arguments
from hf_vit_plus.training.loop import train
from hf_vit_plus.training.tasks.image_lm import ImageLMTask, load_image_arrays

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py

TINY = "hidden_size=16,num_hidden_layers=1,num_attention_heads=2,intermediate_size=32"


def fashion_mnist_installed() -> bool:
    from hf_vit_plus.data import fashion_mnist

    return all((fashion_mnist.FASHION_MNIST_DIR / name).is_file() for pair in fashion_mnist._FILES.values()
               for name in pair)  # fmt: skip


needs_fashion_mnist = pytest.mark.skipif(
    not fashion_mnist_installed(), reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
)


def cli(capsys, *argv: str) -> tuple[int, str]:
    status = main(["train", "image-lm", *argv, "--report_to", "none", "--save_steps", "none"])
    return status, capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------- learning
def test_a_small_image_model_learns_digits_below_the_histogram_floor(tmp_path):
    """The family's default model (4 blocks of width 64, strided, stride one row) trained for 300 updates of 32
    digits. Observed (one thread): 2.01 bits/dim on the 360 test digits against a per-pixel-histogram floor of 2.66
    and a uniform floor of 8, in about 25 s of training (at 100 updates: 2.33, at 200: 2.08)."""
    args = family_arguments(
        "image-lm", output_dir=str(tmp_path), max_steps=300, report_to="none", save_steps="none", write_card=False
    )
    start = time.perf_counter()
    result = train(args)
    seconds = time.perf_counter() - start
    metrics = result.eval_metrics
    floors = json.loads((tmp_path / "eval_results.json").read_text())
    histogram = floors["eval_baseline_pixel_histogram_bits_per_dim"]
    assert metrics["samples"] == 360 and floors["eval_baseline_uniform_bits_per_dim"] == 8.0
    assert histogram == pytest.approx(2.656, abs=1e-3)
    # the loop's bits/dim is the trained model's own loss (nats per dim, its forward) on the 360 test digits
    _, test_images = load_image_arrays("digits")
    with torch.no_grad():
        own_loss = result.model.eval()(pixel_values=torch.from_numpy(test_images.copy())).loss.item()
    assert metrics["bits_per_dim"] == pytest.approx(own_loss / math.log(2), rel=1e-5)
    assert metrics["bits_per_dim"] < histogram - 0.35, (metrics, histogram, seconds)
    first_eval = next(e["eval_bits_per_dim"] for e in result.log_history if "eval_bits_per_dim" in e)
    assert metrics["bits_per_dim"] < first_eval


# ------------------------------------------------------------------------------------------------------------- CLI
@pytest.mark.parametrize(
    "attention",
    ["attention_type=dense", "attention_type=strided,sparse_pattern_mode=interleaved", "attention_type=fixed"],
)
def test_cli_writes_weights_bits_per_dim_a_valid_card_and_the_curves(tmp_path, capsys, attention):
    out = tmp_path / "run"
    status, err = cli(
        capsys, "--output_dir", str(out), "--max_steps", "3", "--max_train_samples", "64", "--max_eval_samples", "32",
        "--per_device_train_batch_size", "16", "--config_overrides", f"{TINY},{attention}",
    )  # fmt: skip
    assert status == 0, err
    assert (out / "model.safetensors").is_file() and (out / "training_curves.png").stat().st_size > 5000
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results) == {
        "eval_loss", "eval_bits_per_dim", "eval_samples", "eval_baseline_uniform_bits_per_dim",
        "eval_baseline_pixel_histogram_bits_per_dim",
    }  # fmt: skip
    assert results["eval_samples"] == 32 and results["eval_baseline_uniform_bits_per_dim"] == 8.0
    # the floor is that of exactly the images trained and evaluated on: the first 64 training and 32 test digits
    # give 4.598 bits/dim (all 1,437 / 360 give 2.656, see the learning test above)
    assert results["eval_baseline_pixel_histogram_bits_per_dim"] == pytest.approx(4.59787, abs=1e-5)
    _, test_images = load_image_arrays("digits")

    card = out / "README.md"
    assert validate_card_metadata(card, require_datasets=False) == []
    meta = load_card_metadata(card)
    assert meta["pipeline_tag"] == "unconditional-image-generation"
    assert {"sparse-transformer", "image-generation"} <= set(meta["tags"])
    # scikit-learn's digits are not on the Hub: no `datasets`, and no model-index (whose data set must be a Hub id);
    # the results are in the card's table, the data and its split in "Training data"
    assert "datasets" not in meta and "model-index" not in meta
    text = card.read_text()
    bits = f"{results['eval_bits_per_dim']:.6g}"
    assert f"| eval_bits_per_dim | {bits} | test |" in text and "The data set is not on the Hub" in text
    data_section = text.split("## Training data")[1].split("\n## ")[0]
    assert "load_digits_dataset(seed=0)" in data_section
    assert "| train | 64 |" in data_section and "| test (evaluation) | 32 |" in data_section
    text = card.read_text()
    assert "| pixel_histogram_bits_per_dim |" in text and "| uniform_bits_per_dim | 8 | test |" in text
    assert "arXiv:1904.10509" in text and "Optical Recognition of Handwritten Digits" in text
    assert "![training_curves.png](training_curves.png)" in text
    assert "| scheduler | cosine |" in text  # --lr_scheduler_type auto: the family's schedule, as the run used
    sparse = "dense" not in attention
    assert (out / "sparse_attention_pattern.png").is_file() == sparse
    assert ("![sparse_attention_pattern.png](sparse_attention_pattern.png)" in text) == sparse

    # the saved model is the image head, and its own loss gives the bits/dim of the evaluation
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model) is SparseTransformerForImageGeneration
    assert model.config.image_size == [8, 8] and model.config.sparse_stride == 8
    assert model.config.attention_type == attention.split(",")[0].split("=")[1]
    with torch.no_grad():
        loss = model(pixel_values=torch.from_numpy(test_images[:32].copy())).loss.item()
    assert loss / math.log(2) == pytest.approx(results["eval_bits_per_dim"], rel=1e-5)


def test_the_default_model_is_for_images_sized_from_the_data():
    args = family_arguments("image-lm", output_dir="unused", max_train_samples=8, max_eval_samples=4,
                            per_device_train_batch_size=4)  # fmt: skip
    from hf_vit_plus.training.plan import preview_plan

    family = ImageLMTask()
    data = family.load_data(args)
    model, processor = family.build(preview_plan(args, family, data), data)
    assert processor is None and type(model) is SparseTransformerForImageGeneration
    config = model.config
    # what 8 x 8 grey images fix (the paper's image layout, sec. 7.1): 256 intensities and a start token, one position
    # per pixel on a row/column grid, a stride of one row and summaries of a quarter row
    assert (config.image_size, config.num_channels, config.vocab_size, config.bos_token_id) == ([8, 8], 1, 257, 256)
    assert (config.max_position_embeddings, config.position_embedding_type, config.factorized_shape) == (
        64, "factorized", [8, 8],
    )  # fmt: skip
    assert (config.sparse_stride, config.sparse_summary_size) == (8, 2)
    # the family's small default: 4 blocks of width 64, untied embeddings, strided with one part per head
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.intermediate_size) == (
        64, 4, 4, 256,
    )  # fmt: skip
    assert config.attention_type == "strided" and config.sparse_pattern_mode == "heads"
    assert config.tie_word_embeddings is False
    assert data.eval_split == "test" and len(data.raw["validation"]) == 4


def test_stop_resume_and_fine_tune_without_a_processor(tmp_path, capsys):
    """The image family has no processor to save: a stopped run resumes, and a saved model is fine-tuned."""
    common = ["--max_steps", "4", "--max_train_samples", "64", "--max_eval_samples", "16", "--config_overrides", TINY,
              "--per_device_train_batch_size", "16"]  # fmt: skip
    out = tmp_path / "run"
    status, err = cli(capsys, "--output_dir", str(out), *common, "--stop_after_steps", "2")
    assert status == 0, err
    status, err = cli(capsys, "--output_dir", str(out), *common, "--resume_from_checkpoint", "latest")
    assert status == 0, err
    history = json.loads((out / "log_history.json").read_text())
    assert history[-1]["step"] == 4 and not (out / "processor").exists()

    status, err = main(["train", "image-lm", "--output_dir", str(tmp_path / "tuned"), "--model_name_or_path",
                        str(out), "--max_steps", "2", "--max_train_samples", "32", "--max_eval_samples", "16",
                        "--report_to", "none", "--save_steps", "none"]), capsys.readouterr().err  # fmt: skip
    assert status == 0, err
    assert validate_card_metadata(tmp_path / "tuned" / "README.md", require_datasets=False) == []


@needs_fashion_mnist
def test_fashion_mnist_run_is_28_by_28_with_a_stride_of_one_row(tmp_path, capsys):
    out = tmp_path / "fashion"
    status, err = cli(
        capsys, "--dataset", "fashion-mnist", "--output_dir", str(out), "--max_steps", "2", "--max_train_samples",
        "64", "--max_eval_samples", "8", "--per_device_train_batch_size", "8", "--config_overrides", TINY,
    )  # fmt: skip
    assert status == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["image_size"] == [28, 28] and config["sparse_stride"] == 28
    assert config["factorized_shape"] == [28, 28] and config["max_position_embeddings"] == 784
    assert load_card_metadata(out / "README.md")["datasets"] == ["zalando-datasets/fashion_mnist"]
    assert "Fashion-MNIST: a Novel Image Dataset" in (out / "README.md").read_text()
    results = json.loads((out / "eval_results.json").read_text())
    assert 0 < results["eval_baseline_pixel_histogram_bits_per_dim"] < 8


# ---------------------------------------------------------------------------------------------------------- floors
def test_uniform_floor_is_eight_bits():
    assert uniform_bits_per_dim() == 8.0
    assert uniform_bits_per_dim(4) == 2.0
    with pytest.raises(ValueError, match="`levels` must be an integer >= 2, got 1"):
        uniform_bits_per_dim(1)


def test_histogram_floor_of_a_hand_made_example():
    # two training images of two pixels: pixel 0 is 0 both times, pixel 1 is 1 then 3.
    train_images = np.array([[[0, 1]], [[0, 3]]], dtype=np.uint8)  # (N=2, H=1, W=2)
    # with 4 levels and add-one smoothing: pixel 0 ~ (3, 1, 1, 1) / 6, pixel 1 ~ (1, 2, 1, 2) / 6
    test_images = np.array([[[0, 1]]], dtype=np.uint8)
    expected = (-math.log2(3 / 6) - math.log2(2 / 6)) / 2  # = (1 + log2 3) / 2
    assert pixel_histogram_bits_per_dim(train_images, test_images, levels=4) == pytest.approx(expected)
    assert expected == pytest.approx(1.2924812503605781)
    # 8-bit levels: 256 pseudo-counts; a value never seen (2 at pixel 0) keeps probability 1 / 258, and 3 at pixel 1,
    # seen once, 2 / 258: (log2 258 + log2 129) / 2 = (8.0112273 + 7.0112273) / 2
    test_images = np.array([[[2, 3]]], dtype=np.uint8)
    expected = 7.5112273
    assert pixel_histogram_bits_per_dim(train_images, test_images) == pytest.approx(expected)
    assert pixel_floors(train_images, test_images) == {
        "uniform_bits_per_dim": 8.0,
        "pixel_histogram_bits_per_dim": pytest.approx(expected),
    }


@pytest.mark.parametrize(
    "train_images, test_images, error, match",
    [
        (np.zeros((2, 2, 2)), np.zeros((1, 2, 2), np.uint8), TypeError, "integer pixel values 0..255, got dtype "
         "float"),
        (np.full((2, 2, 2), 256), np.zeros((1, 2, 2), np.uint8), ValueError, "values must lie in 0..255, got values "
         "from 256 to 256"),
        (np.zeros((2, 2, 2), np.uint8), np.zeros((1, 2, 3), np.uint8), ValueError, "must have the same shape"),
        (np.zeros((0, 2, 2), np.uint8), np.zeros((1, 2, 2), np.uint8), ValueError, "non-empty batch of images"),
    ],
)  # fmt: skip
def test_bad_images_for_the_floors_are_named(train_images, test_images, error, match):
    with pytest.raises(error, match=match):
        pixel_histogram_bits_per_dim(train_images, test_images)


# ----------------------------------------------------------------------------------------------------- bad input
def test_an_unknown_dataset_is_one_line_listing_the_choices(tmp_path, capsys):
    status, err = cli(capsys, "--dataset", "cifar10", "--output_dir", str(tmp_path / "x"))
    assert status == 2
    assert err == (
        "hf-vit-plus train image-lm: error: Unknown --dataset 'cifar10'; expected one of digits, fashion-mnist.\n"
    )
    assert not (tmp_path / "x").exists()
    with pytest.raises(UsageError, match="Unknown --dataset 'cifar10'; expected one of digits, fashion-mnist"):
        family_arguments("image-lm", dataset="cifar10")


def test_missing_fashion_mnist_is_one_line_naming_the_package(tmp_path, capsys, monkeypatch):
    from hf_vit_plus.data import fashion_mnist

    monkeypatch.setattr(fashion_mnist, "FASHION_MNIST_DIR", tmp_path / "absent")
    status, err = cli(capsys, "--dataset", "fashion-mnist", "--output_dir", str(tmp_path / "x"))
    assert status == 2
    assert err.startswith("hf-vit-plus train image-lm: error: --dataset fashion-mnist: Fashion-MNIST is not installed")
    assert "apt-get install dataset-fashion-mnist" in err and err.count("\n") == 1 and "Traceback" not in err


def test_data_options_belong_to_their_families(capsys):
    # the image model reads the user's images (--dataset_name, --train_dir: issue 58), never text
    for flag in ("--train_file", "--tokenizer_name", "--block_size", "--text_column"):
        with pytest.raises(SystemExit):
            main(["train", "image-lm", flag, "x"])
        assert "unrecognized arguments" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "vit", "--dataset", "digits"])
    assert (
        "hf-vit-plus train vit: error: unrecognized arguments: --dataset digits (--dataset: did you mean "
        "--dataset_name?)" in capsys.readouterr().err
    )
    with pytest.raises(UsageError, match="Give either --dataset .built-in images. or your own data"):
        family_arguments("image-lm", dataset="fashion-mnist", dataset_name="mnist")
    with pytest.raises(UsageError, match=r"--dataset \('digits'\) chooses the images of the image-lm family"):
        family_arguments("vit", dataset="digits")
    from hf_vit_plus.training.plan import default_choices

    # the data set's own epochs, chosen by the plan (the arguments leave them unset)
    assert family_arguments("image-lm").num_train_epochs is None
    assert default_choices(family_arguments("image-lm"))["num_train_epochs"] == (30.0, "--dataset digits")
    fashion = default_choices(family_arguments("image-lm", dataset="fashion-mnist"))
    assert fashion["num_train_epochs"] == (1.0, "--dataset fashion-mnist")
    assert family_arguments("image-lm", dataset="fashion-mnist", num_train_epochs=2.0).num_train_epochs == 2.0


def test_a_saved_model_that_does_not_fit_the_images_is_named(tmp_path, capsys):
    tiny = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    SparseTransformerForImageGeneration(SparseTransformerConfig.for_images(4, 4, **tiny)).save_pretrained(
        tmp_path / "small"
    )
    SparseTransformerForCausalLM(
        SparseTransformerConfig(vocab_size=40, max_position_embeddings=64, attention_type="dense", **tiny)
    ).save_pretrained(tmp_path / "text")
    status, err = cli(capsys, "--model_name_or_path", str(tmp_path / "small"), "--output_dir", str(tmp_path / "x"))
    assert status == 2 and "is made for images of 4x4 with 1 channel(s); the data has 8x8 grey images" in err
    status, err = cli(capsys, "--model_name_or_path", str(tmp_path / "text"), "--output_dir", str(tmp_path / "x"))
    assert status == 2 and "is not an image model (its config has no image_size)" in err
    # a config folder is a fresh model's: the images set its size
    status, err = cli(
        capsys, "--config_name", str(tmp_path / "small"), "--output_dir", str(tmp_path / "y"), "--max_steps", "1",
        "--max_train_samples", "32", "--max_eval_samples", "8", "--write_card", "false",
    )  # fmt: skip
    assert status == 0, err
    assert json.loads((tmp_path / "y" / "config.json").read_text())["image_size"] == [8, 8]
