"""`pipeline("image-classification")` on saved ViTPlus folders: grey (1-channel) models take any image, RGB models
take grey images, and an installed package never makes transformers ask to run custom code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, pipeline

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusImageProcessor
from tests.utils import REPO_ROOT

NUM_LABELS = 4


def _save_checkpoint(folder, num_channels: int, image_size: int = 8, patch_size: int = 4) -> ViTPlusImageProcessor:
    torch.manual_seed(0)
    config = ViTPlusConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=image_size,
        patch_size=patch_size,
        num_channels=num_channels,
        num_labels=NUM_LABELS,
    )
    model = ViTPlusForImageClassification(config).eval()
    torch.nn.init.normal_(model.classifier.weight, std=1.0)  # the paper's zero-initialised head scores all alike
    processor = ViTPlusImageProcessor.from_model_config(config)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return processor


def _rgb_image(height: int = 20, width: int = 24, seed: int = 0) -> Image.Image:
    return Image.fromarray((np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8))


def _scores(predictions: list[dict]) -> dict[str, float]:
    return {p["label"]: p["score"] for p in predictions}


@pytest.fixture(scope="module")
def grey_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grey")
    _save_checkpoint(folder, num_channels=1)
    return folder


@pytest.fixture(scope="module")
def rgb_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rgb")
    _save_checkpoint(folder, num_channels=3, image_size=16, patch_size=8)
    return folder


# ----------------------------------------------------------------------------------------------- grey models


def test_grey_processor_is_saved_as_grey(grey_folder, rgb_folder):
    saved = json.loads((grey_folder / "preprocessor_config.json").read_text())
    assert saved["do_convert_grayscale"] is True and saved["do_convert_rgb"] is False
    assert json.loads((rgb_folder / "preprocessor_config.json").read_text())["do_convert_grayscale"] is False
    processor = AutoImageProcessor.from_pretrained(grey_folder)
    assert type(processor) is ViTPlusImageProcessor and processor.do_convert_grayscale
    assert processor(images=_rgb_image(), return_tensors="pt")["pixel_values"].shape == (1, 1, 8, 8)


def test_a_grey_processor_saved_by_release_0_1_still_makes_grey_input(grey_folder, tmp_path):
    """0.1 saved no `do_convert_grayscale`; its one-value image_mean marks the processor of a 1-channel model."""
    saved = json.loads((grey_folder / "preprocessor_config.json").read_text())
    del saved["do_convert_grayscale"]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(saved))
    processor = AutoImageProcessor.from_pretrained(tmp_path)
    assert processor.do_convert_grayscale
    assert processor(images=_rgb_image(), return_tensors="pt")["pixel_values"].shape == (1, 1, 8, 8)


def test_grey_pipeline_takes_any_image_and_scores_it_as_its_grey_version(grey_folder, tmp_path):
    classifier = pipeline("image-classification", model=str(grey_folder))
    rgb = _rgb_image()
    rgba = rgb.convert("RGBA")  # opaque
    palette = rgb.convert("P")
    rgb.save(tmp_path / "image.png")
    cases = {
        "RGB": (rgb, rgb),
        "RGBA": (rgba, rgb),
        "P": (palette, palette.convert("RGB")),
        "L": (rgb.convert("L"), rgb),
        "numpy HxWx3 uint8": (np.array(rgb), rgb),
        "numpy HxW uint8": (np.array(rgb.convert("L")), rgb),
        "file path": (str(tmp_path / "image.png"), rgb),
    }
    for name, (image, colour) in cases.items():
        got = _scores(classifier(image, top_k=NUM_LABELS))
        expected = _scores(classifier(colour.convert("L"), top_k=NUM_LABELS))
        assert set(got) == set(expected) and len(got) == NUM_LABELS, name
        for label, score in expected.items():
            assert got[label] == pytest.approx(score, abs=1e-6), name
    # a different image gives different scores: the comparison above is not vacuous
    other = _scores(classifier(_rgb_image(seed=5).convert("L"), top_k=NUM_LABELS))
    assert max(abs(other[k] - expected[k]) for k in other) > 1e-4


def test_grey_values_are_pils_luma_after_rescale_and_normalise():
    processor = ViTPlusImageProcessor(
        do_convert_grayscale=True, do_convert_rgb=False, image_mean=[0.5], image_std=[0.5]
    )
    rgb = _rgb_image(9, 7)
    expected = (np.asarray(rgb.convert("L"), dtype=np.float32) / 255 - 0.5) / 0.5  # (H, W)
    inputs = {
        "PIL RGB": rgb,
        "PIL L": rgb.convert("L"),
        "numpy HxWx3 uint8": np.array(rgb),
        "numpy HxW uint8": np.array(rgb.convert("L")),
        "torch 3xHxW uint8": torch.from_numpy(np.array(rgb)).permute(2, 0, 1),
        "torch HxW uint8": torch.from_numpy(np.array(rgb.convert("L"))),
        "list of one PIL image": [rgb],
    }
    for name, image in inputs.items():
        pixels = processor(images=image, do_resize=False, return_tensors="pt")["pixel_values"]
        assert pixels.shape == (1, 1, 9, 7), name
        np.testing.assert_allclose(pixels[0, 0].numpy(), expected, atol=1e-6, rtol=0, err_msg=name)
    # float tensors in [0, 1]: the same luma, up to the 8-bit rounding PIL does
    float_image = torch.from_numpy(np.array(rgb)).permute(2, 0, 1).float() / 255
    pixels = processor(images=float_image, do_resize=False, do_rescale=False, return_tensors="pt")["pixel_values"]
    np.testing.assert_allclose(pixels[0, 0].numpy(), expected, atol=2 / 255 + 1e-6, rtol=0)
    # transparency is composited onto white before the luma, as the RGB conversion does
    clear = Image.new("RGBA", (7, 9), (10, 200, 30, 0))
    pixels = processor(images=clear, do_resize=False, return_tensors="pt")["pixel_values"]
    np.testing.assert_allclose(pixels.numpy(), 1.0, atol=1e-6)


# ----------------------------------------------------------------------------------------------- RGB models


def test_rgb_pipeline_takes_grey_images(rgb_folder):
    classifier = pipeline("image-classification", model=str(rgb_folder))
    grey = _rgb_image(seed=3).convert("L")
    expected = _scores(classifier(grey.convert("RGB"), top_k=NUM_LABELS))
    for image in (grey, np.array(grey), grey.convert("P"), grey.convert("RGBA")):
        got = _scores(classifier(image, top_k=NUM_LABELS))
        for label, score in expected.items():
            assert got[label] == pytest.approx(score, abs=1e-6), type(image)
    processor = AutoImageProcessor.from_pretrained(rgb_folder)
    for image in (grey, np.array(grey), torch.from_numpy(np.array(grey))[None], grey.convert("RGBA")):
        assert processor(images=image, return_tensors="pt")["pixel_values"].shape == (1, 3, 16, 16)


# ----------------------------------------------------------------------------------------------- no prompt


@pytest.mark.parametrize("num_channels", [1, 3], ids=["grey", "rgb"])
def test_pipeline_never_asks_to_run_custom_code_when_the_package_is_installed(num_channels, tmp_path):
    """transformers' video-processor lookup used to find the image processor's remote-code entry and prompt
    "Do you wish to run the custom code? [y/N]" (a hang in a terminal, an error swallowed without one)."""
    folder = tmp_path / "checkpoint"
    _save_checkpoint(folder, num_channels=num_channels)
    _rgb_image().save(tmp_path / "image.png")
    code = f"""
        import json
        import hf_vit_plus  # noqa: F401
        from transformers import AutoVideoProcessor, pipeline

        classifier = pipeline("image-classification", model={str(folder)!r})
        predictions = classifier({str(tmp_path / "image.png")!r}, top_k={NUM_LABELS})
        try:  # the lookup the pipeline does: answered locally, no remote code
            AutoVideoProcessor.from_pretrained({str(folder)!r})
            video = "loaded"
        except ValueError as err:
            video = str(err)
        print(json.dumps(dict(predictions=predictions, video=video)))
        """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update({"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "OMP_NUM_THREADS": "1"})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "custom code" not in output and "trust_remote_code" not in output, output[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["predictions"]) == NUM_LABELS
    assert sum(p["score"] for p in result["predictions"]) == pytest.approx(1.0, abs=1e-5)
    assert "trust_remote_code" not in result["video"] and "custom code" not in result["video"]
    assert not (tmp_path / "modules").exists(), "remote code was loaded although the package is installed"


def test_auto_video_processor_says_the_family_has_none(grey_folder):
    """transformers answered "Could not load any video processor class for ... with torchvision backend. Please
    install the backend dependencies": the family has no video processor, and the error says so."""
    from transformers import AutoVideoProcessor

    with pytest.raises(ValueError, match="The ViTPlus family .* has no video processor: it classifies single images"):
        AutoVideoProcessor.from_pretrained(grey_folder)
