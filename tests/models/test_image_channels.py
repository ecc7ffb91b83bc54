"""Images of any channel count through `ViTPlusImageProcessor`: a processor keeps C channels where its mean and std (a
call's or its own) hold C values or the model it was made for has C channels; only a 3-channel processor turns grey
and RGBA images into RGB; counts that cannot agree are one ValueError. The calls of transformers' image-processor
mixin (`test_call_numpy_4_channels` and its neighbours) are made here on ours, with our own expectations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hf_vit_plus import ViTPlusConfig
from hf_vit_plus.models.image_processing_vit_plus import ViTPlusImageProcessor

SIZE = 6
SETTINGS = {"size": {"height": SIZE, "width": SIZE}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
RNG = np.random.default_rng(0)
PIXELS = {c: RNG.integers(0, 256, size=(SIZE, SIZE + 2, c), dtype=np.uint8) for c in (1, 3, 4)}  # H x W x C


def _as(kind: str, pixels: np.ndarray):
    """One H x W x C uint8 image as a numpy (H x W x C), PIL or torch (C x H x W) input."""
    if kind == "numpy":
        return pixels
    if kind == "torch":
        return torch.from_numpy(pixels).permute(2, 0, 1)
    return Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)


def _expected(pixels: np.ndarray, mean: float, std: float) -> np.ndarray:
    """C x H x W after rescale and normalise (no resize: the processor keeps the size)."""
    return (np.moveaxis(pixels, -1, 0).astype(np.float32) / 255 - mean) / std


def _run(processor, image, **kwargs) -> torch.Tensor:
    return processor(image, do_resize=False, return_tensors="pt", **kwargs)["pixel_values"]


@pytest.mark.parametrize("kind", ["numpy", "PIL", "torch"])
def test_a_mean_of_c_values_keeps_c_channels_untouched(kind):
    processor = ViTPlusImageProcessor(**SETTINGS)
    for channels in (3, 4):
        got = _run(processor, _as(kind, PIXELS[channels]), image_mean=[0.25] * channels, image_std=[0.5] * channels)
        np.testing.assert_allclose(got[0].numpy(), _expected(PIXELS[channels], 0.25, 0.5), atol=1e-6)
    # a 4-channel model's processor keeps its 4 channels (near-infrared is no alpha: nothing is composited)
    four = ViTPlusImageProcessor.from_model_config(ViTPlusConfig(image_size=SIZE, patch_size=2, num_channels=4))
    assert not four.do_convert_rgb and len(four.image_mean) == 4
    got = processor.__class__(**four.to_dict())(_as(kind, PIXELS[4]), return_tensors="pt")["pixel_values"]
    assert got.shape == (1, 4, SIZE, SIZE)


@pytest.mark.parametrize("kind", ["numpy", "PIL", "torch"])
def test_an_rgb_processor_without_a_matching_mean_makes_three_channels(kind):
    processor = ViTPlusImageProcessor(**SETTINGS)
    grey = _run(processor, _as(kind, PIXELS[1]))
    np.testing.assert_allclose(grey[0].numpy(), _expected(np.repeat(PIXELS[1], 3, axis=-1), 0.5, 0.5), atol=1e-6)
    np.testing.assert_allclose(
        _run(processor, _as(kind, PIXELS[3]))[0].numpy(), _expected(PIXELS[3], 0.5, 0.5), atol=1e-6
    )
    # RGBA: composited onto white, as PIL's RGBA -> RGB conversion in transformers
    rgba = PIXELS[4].astype(np.float32) / 255
    white = rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:])
    got = _run(processor, _as(kind, PIXELS[4]))
    np.testing.assert_allclose(got[0].numpy(), (np.moveaxis(white, -1, 0) - 0.5) / 0.5, atol=2 / 255 * 2 + 1e-6)
    # one value broadcasts over any channels, as a number does
    assert _run(processor, _as(kind, PIXELS[4]), image_mean=[0.5], image_std=[0.5]).shape == (1, 3, SIZE, SIZE + 2)


@pytest.mark.parametrize("kind", ["numpy", "PIL", "torch"])
def test_a_grey_processor_makes_one_channel_of_anything(kind):
    config = ViTPlusConfig(image_size=SIZE, patch_size=2, num_channels=1)
    processor = ViTPlusImageProcessor.from_model_config(config)
    for channels in (1, 3, 4):
        assert _run(processor, _as(kind, PIXELS[channels])).shape == (1, 1, SIZE, SIZE + 2), channels
    with pytest.raises(ValueError, match=r"do_convert_grayscale=True` makes one channel.*hold 3 values"):
        _run(processor, _as(kind, PIXELS[3]), image_mean=[0.5] * 3, image_std=[0.5] * 3)


@pytest.mark.parametrize("kind", ["numpy", "PIL", "torch"])
def test_counts_that_cannot_agree_are_one_value_error(kind):
    processor = ViTPlusImageProcessor(**SETTINGS)
    four = {"image_mean": [0.0] * 4, "image_std": [1.0] * 4}
    for channels in (1, 3):
        with pytest.raises(ValueError, match=rf"has {channels} channels .* hold 4 values \(one per channel\)"):
            _run(processor, _as(kind, PIXELS[channels]), **four)
    # an RGB processor told not to convert: a 4-channel image meets three means
    with pytest.raises(ValueError, match=r"has 4 channels .* hold 3 values"):
        _run(processor, _as(kind, PIXELS[4]), do_convert_rgb=False)
    with pytest.raises(ValueError, match=r"`image_mean` has 4 values and `image_std` 3"):
        _run(processor, _as(kind, PIXELS[4]), image_mean=[0.0] * 4, image_std=[1.0] * 3)


def test_more_channels_than_rgba_where_the_mean_says_so():
    processor = ViTPlusImageProcessor(**SETTINGS)
    pixels = RNG.integers(0, 256, size=(SIZE, SIZE, 5), dtype=np.uint8)
    for image in (pixels, torch.from_numpy(pixels).permute(2, 0, 1)):
        got = _run(processor, image, image_mean=[0.0] * 5, image_std=[1.0] * 5)
        np.testing.assert_allclose(got[0].numpy(), _expected(pixels, 0.0, 1.0), atol=1e-6)
    with pytest.raises(ValueError, match=r"neither its first nor its last axis holds 1 \(grey\), 3 \(RGB\) or 4"):
        _run(processor, pixels)


def test_transformers_mixin_channel_calls():
    """The calls transformers' `ImageProcessingTestMixin` makes (ViT's tester settings: 18 x 18, a batch of
    differently sized images), with the shapes it expects."""
    processor = ViTPlusImageProcessor(**{**SETTINGS, "do_resize": True, "size": {"height": 18, "width": 18}})
    sizes = [(30, 41), (33, 30), (45, 37)]
    for channels in (3, 4):
        images = [RNG.integers(0, 255, size=(h, w, channels), dtype=np.uint8) for h, w in sizes]
        kwargs = {"image_mean": [0.0] * channels, "image_std": [1.0] * channels, "input_data_format": "channels_last"}
        assert processor(images[0], return_tensors="pt", **kwargs).pixel_values.shape == (1, channels, 18, 18)
        assert processor(images, return_tensors="pt", **kwargs).pixel_values.shape == (3, channels, 18, 18)
    for kind in ("numpy", "PIL", "torch"):
        images = [_as(kind, RNG.integers(0, 255, size=(h, w, 3), dtype=np.uint8)) for h, w in sizes]
        assert processor(images, return_tensors="pt").pixel_values.shape == (3, 3, 18, 18)
