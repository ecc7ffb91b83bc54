"""Image processor of the ViTPlus family: convert to RGB (or grey), resize to the model's resolution, rescale,
normalise. A thin subclass of transformers' ViT processor so that it is saved with the checkpoint's code and
`AutoImageProcessor.from_pretrained` / `pipeline("image-classification")` work on a saved folder.

A processor for a 1-channel model (`do_convert_grayscale=True`, saved in preprocessor_config.json) turns every
input into one grey channel, whatever it arrives as: the pipeline opens image files as RGB. A processor whose
`image_mean`/`image_std` hold C values (a call's or its own, one per channel: RGB + near-infrared is 4) keeps C
channels, so multispectral images reach a `num_channels=C` model as they are; only a 3-channel processor composites
RGBA onto white.
"""

from __future__ import annotations

import os

import numpy as np
import PIL.Image
import torch
from transformers.image_utils import ChannelDimension
from transformers.models.vit.image_processing_vit import ViTImageProcessor
from transformers.processing_utils import ImagesKwargs

from .layers import LUMA_WEIGHTS

# ITU-R 601-2 luma (`layers.LUMA_WEIGHTS`), in PIL's fixed point (weights / 2**16) for 8-bit images, so that uint8
# inputs give exactly PIL's `convert("L")`.
_LUMA = LUMA_WEIGHTS
_LUMA_FIXED_POINT = (19595, 38470, 7471)


def _channel_axis(image, channels: int | None) -> ChannelDimension | None:
    """Where the channels of a (C, H, W) or (H, W, C) array are: the end holding `channels` (else 1, 3 or 4) where only
    one end can be it; None (transformers' own guess, or a 2-D image) otherwise. transformers guesses among 1 and 3
    channels only in some releases (4 too in later ones), so a 4- or C-channel array is placed here."""
    if getattr(image, "ndim", 0) != 3:
        return None
    for counts in ((channels,) if channels is not None else (), (1, 3, 4)):
        first, last = image.shape[0] in counts, image.shape[-1] in counts
        if first != last:
            return ChannelDimension.FIRST if first else ChannelDimension.LAST
        if first:
            return None
    return None


class ViTPlusImageProcessorKwargs(ImagesKwargs, total=False):
    r"""
    do_convert_grayscale (`bool`, *optional*, defaults to `self.do_convert_grayscale`):
        Convert every image to one grey channel (ITU-R 601-2 luma, as PIL's `convert("L")`; transparency is first
        composited onto white, as for RGB). Takes precedence over `do_convert_rgb`. Set for 1-channel models.
    """

    do_convert_grayscale: bool


def rgb_to_luma(image: torch.Tensor) -> torch.Tensor:
    """(3, H, W) RGB -> (1, H, W) grey, same dtype. uint8 gives exactly PIL's `Image.convert("L")`."""
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"Expected a (3, height, width) RGB image, got shape {tuple(image.shape)}.")
    if image.dtype == torch.uint8:
        r, g, b = image.to(torch.int32).unbind(0)
        wr, wg, wb = _LUMA_FIXED_POINT
        return ((r * wr + g * wg + b * wb + (1 << 15)) >> 16).to(torch.uint8).unsqueeze(0)
    if image.is_floating_point():
        weights = torch.tensor(_LUMA, dtype=image.dtype, device=image.device)
        return (image * weights[:, None, None]).sum(0, keepdim=True)
    # other integer images: luma in float64, rounded back
    weights = torch.tensor(_LUMA, dtype=torch.float64, device=image.device)
    return (image.double() * weights[:, None, None]).sum(0, keepdim=True).round().to(image.dtype)


def pil_to_rgb(image: PIL.Image.Image) -> PIL.Image.Image:
    """A PIL image in any mode as RGB, transparency composited onto white (what transformers does from release 5.21
    on; 5.20 dropped the alpha channel)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        background = PIL.Image.new("RGBA", image.size, (255, 255, 255, 255))
        return PIL.Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def channels_to_rgb(image: torch.Tensor) -> torch.Tensor:
    """A channels-first image (C, H, W) with 1 (grey), 3 or 4 (RGBA, composited onto white) channels -> (3, H, W).

    transformers' processors do this for arrays and tensors only from release 5.21 on (5.20 left a grey array with
    one channel); done here, the processor gives the same pixels on every release."""
    if image.ndim != 3 or image.shape[0] not in (1, 3, 4):
        return image  # rgb_to_luma / the model's own checks name a shape that cannot be an image
    if image.shape[0] == 1:
        return image.expand(3, -1, -1).contiguous()
    if image.shape[0] == 4:
        dtype = image.dtype
        scale = 255.0 if dtype == torch.uint8 else 1.0
        rgba = image.float() / scale
        rgb = rgba[:3] * rgba[3:] + (1 - rgba[3:])  # onto white, as PIL's RGBA -> RGB conversion in transformers
        return (rgb * scale).round().to(dtype) if dtype == torch.uint8 else rgb.to(dtype)
    return image


def target_channels(
    image_mean, image_std, do_normalize: bool | None, do_convert_rgb: bool | None, do_convert_grayscale: bool | None
) -> int | None:
    """How many channels the processed images have: one for a grey processor, else as many as `image_mean` /
    `image_std` hold values (one per channel), else three for an RGB processor; None where nothing says (the images
    keep theirs). A one-value mean or std broadcasts over any channels, as a number does.

    Raises:
        ValueError: `image_mean` and `image_std` of different lengths, or a grey processor with a mean or std of
            several values.
    """
    lengths = {
        name: len(value)
        for name, value in (("image_mean", image_mean), ("image_std", image_std))
        if do_normalize and isinstance(value, (list, tuple)) and len(value) != 1
    }
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"`image_mean` has {lengths['image_mean']} values and `image_std` {lengths['image_std']}: give one value "
            "per channel, as many of each."
        )
    said = next(iter(lengths.values()), None)
    if do_convert_grayscale:
        if said is not None:
            raise ValueError(
                f"`do_convert_grayscale=True` makes one channel, but `image_mean`/`image_std` hold {said} values: "
                "give one value each (e.g. image_mean=[0.5], image_std=[0.5]) or set do_convert_grayscale=False."
            )
        return 1
    if said is not None:
        return said
    return 3 if do_convert_rgb else None


def _channels_said_by(channels: int, do_convert_rgb: bool | None, do_convert_grayscale: bool | None) -> str:
    """What made the processor want `channels` channels, for an error message."""
    if do_convert_grayscale:
        return "the processor makes one grey channel (do_convert_grayscale=True)"
    if channels == 3 and do_convert_rgb:
        return "the processor converts to RGB (do_convert_rgb=True; grey and RGBA images are converted)"
    return f"`image_mean`/`image_std` hold {channels} values (one per channel)"


def check_images(images, channels: int | None = None) -> None:
    """A `ValueError` / `TypeError` naming what is wrong with `images` before any processing: None, an empty list,
    an empty image, an array of objects, a number of channels that is not 1 (grey), 3 (RGB), 4 (RGBA) or
    `channels` (what the processor's mean and std say), or pixels that are NaN or infinite."""
    if images is None:
        raise ValueError(
            "`images` is None: pass a PIL image, an array or tensor (H x W [x C]), a file path, or a list."
        )
    batch = list(images) if isinstance(images, (list, tuple)) else [images]
    if not batch:
        raise ValueError("`images` is an empty list: pass at least one image.")
    named = []  # (where, image), the lists of a nested batch opened one level, as transformers opens them
    for index, image in enumerate(batch):
        where = "`images`" if len(batch) == 1 and not isinstance(images, (list, tuple)) else f"`images[{index}]`"
        if isinstance(image, (list, tuple)):
            named += [(f"{where[:-1]}[{inner}]`", item) for inner, item in enumerate(image)]
        else:
            named.append((where, image))
    for where, image in named:
        if not isinstance(image, (PIL.Image.Image, np.ndarray, torch.Tensor, str, os.PathLike)):
            raise TypeError(
                f"{where} is of type {type(image).__name__}: an image is a PIL image, an array or tensor "
                "(H x W [x C]), a file path or a URL (nested lists of numbers are no image: make an array with "
                "np.asarray)."
            )
        if isinstance(image, PIL.Image.Image):
            if image.width == 0 or image.height == 0:
                raise ValueError(f"{where} is an empty image ({image.width} x {image.height} pixels).")
            continue
        if not isinstance(image, (np.ndarray, torch.Tensor)):
            continue  # paths and URLs: transformers loads them (and names a bad one)
        shape = tuple(image.shape)
        if isinstance(image, np.ndarray) and not (np.issubdtype(image.dtype, np.number) or image.dtype == bool):
            raise TypeError(f"{where} is an array of {image.dtype} values: expected numbers (uint8 or float pixels).")
        if image.ndim not in (2, 3):
            raise ValueError(f"{where} has shape {shape}: expected H x W (grey), C x H x W or H x W x C.")
        if 0 in shape:
            raise ValueError(f"{where} is empty: shape {shape}.")
        allowed = (1, 3, 4) if channels is None else tuple(sorted({1, 3, 4, channels}))
        if image.ndim == 3 and shape[0] not in allowed and shape[-1] not in allowed:
            extra = "" if channels in (None, 1, 3, 4) else f" or {channels} (as many as `image_mean` holds values)"
            raise ValueError(
                f"{where} has shape {shape}: neither its first nor its last axis holds 1 (grey), 3 (RGB) or 4 "
                f"(RGBA) channels{extra}."
            )
        values = torch.as_tensor(image) if isinstance(image, np.ndarray) else image
        if values.is_floating_point() and not bool(torch.isfinite(values).all()):
            raise ValueError(f"{where} holds NaN or infinite pixel values.")


def with_channel_axis(images):
    """H x W arrays and tensors (grey images without a channel axis, also inside lists) as 1 x H x W: transformers'
    processors take only 3-D images."""
    if isinstance(images, (list, tuple)):
        return type(images)(with_channel_axis(image) for image in images)
    if isinstance(images, (np.ndarray, torch.Tensor)) and images.ndim == 2:
        return images[None]
    return images


class ViTPlusImageProcessor(ViTImageProcessor):
    """transformers' `ViTImageProcessor` for grey as well as RGB models, and images in any PIL mode.

    With `do_convert_grayscale=True` images become one luma channel (1-channel models); with `do_convert_rgb` (the
    default) three. Processors saved before 0.3 have no `do_convert_grayscale`: a one-value `image_mean` marks a
    1-channel model. `from_model_config` makes the processor that matches a config.

    Args:
        **kwargs: `ViTImageProcessor`'s settings (`size`, `image_mean`, `image_std`, `do_convert_rgb`, ...) and
            `do_convert_grayscale`.
    """

    valid_kwargs = ViTPlusImageProcessorKwargs
    model_input_names = ["pixel_values"]
    do_convert_rgb = True
    do_convert_grayscale = False

    def __init__(self, **kwargs):
        # Processors saved before 0.3 have no `do_convert_grayscale`: a one-value mean marks a 1-channel model.
        mean = kwargs.get("image_mean")
        if "do_convert_grayscale" not in kwargs and isinstance(mean, (list, tuple)) and len(mean) == 1:
            kwargs["do_convert_grayscale"] = True
        super().__init__(**kwargs)

    def preprocess(self, images, *args, **kwargs):
        """transformers' `preprocess`, after checking `images` and giving a 2-D image its channel axis.

        Args:
            images: one image or a list (PIL, numpy or torch; grey images with or without a channel axis).
            *args: `ViTImageProcessor.preprocess`'s positional options.
            **kwargs: `ViTImageProcessor.preprocess`'s options (`return_tensors`, ...).

        Returns:
            A `BatchFeature` with `pixel_values`.

        Raises:
            ValueError: no images, or images the processor cannot read.
        """
        settings = {
            name: kwargs.get(name, getattr(self, name, None))
            for name in ("image_mean", "image_std", "do_normalize", "do_convert_rgb", "do_convert_grayscale")
        }
        check_images(images, channels=target_channels(**settings))
        return super().preprocess(with_channel_axis(images), *args, **kwargs)

    def process_image(
        self,
        image,
        do_convert_rgb: bool | None = None,
        input_data_format: str | ChannelDimension | None = None,
        device: torch.device | None = None,
        do_convert_grayscale: bool | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """One raw image (PIL in any mode, numpy or torch, with or without a channel axis) as a channels-first tensor.

        Args:
            image: the image.
            do_convert_rgb: convert to RGB.
            input_data_format: where the channel axis of a numpy or torch image is.
            device: the device of the tensor.
            do_convert_grayscale: convert to grey (via RGB, so every PIL mode is handled).
            **kwargs: passed to `ViTImageProcessor.process_image`.

        Returns:
            (C, H, W): grey (one channel), as many channels as `image_mean`/`image_std` hold values, RGB, or the
            image's own channels when nothing asks for a number.

        Raises:
            ValueError: an image whose channels are not the number the processor makes and cannot be converted to it
                (only grey and RGBA images become RGB, and RGB becomes grey).
        """
        channels = target_channels(
            kwargs.get("image_mean"),
            kwargs.get("image_std"),
            kwargs.get("do_normalize"),
            do_convert_rgb,
            do_convert_grayscale,
        )
        if do_convert_grayscale:
            if isinstance(image, PIL.Image.Image):
                image = pil_to_rgb(image)
            elif input_data_format is None:
                input_data_format = _channel_axis(image, None)
            rgb = super().process_image(
                image, do_convert_rgb=True, input_data_format=input_data_format, device=device, **kwargs
            )
            return rgb_to_luma(channels_to_rgb(rgb))
        # RGB conversion only for a 3-channel processor: a 4-value mean means four channels (RGB + near-infrared,
        # say), not RGBA
        to_rgb = bool(do_convert_rgb) and channels == 3
        if isinstance(image, PIL.Image.Image) and to_rgb:
            image = pil_to_rgb(image)
        if isinstance(image, PIL.Image.Image) and not to_rgb:
            image = np.array(image)  # (H, W) or (H, W, C): its channels kept as they are (a writable copy)
        if input_data_format is None:
            input_data_format = _channel_axis(image, channels)
        image = super().process_image(
            image, do_convert_rgb=to_rgb, input_data_format=input_data_format, device=device, **kwargs
        )
        if to_rgb:
            image = channels_to_rgb(image)
        if channels is not None and image.shape[0] != channels:
            raise ValueError(
                f"An image has {image.shape[0]} channels (shape {tuple(image.shape)}, channels first), but "
                f"{_channels_said_by(channels, do_convert_rgb, do_convert_grayscale)}: give images with {channels} "
                f"channels, or image_mean/image_std with {image.shape[0]} values for a {image.shape[0]}-channel model."
            )
        return image

    @classmethod
    def from_model_config(cls, config, **kwargs) -> ViTPlusImageProcessor:
        """A processor whose output matches `config` (resolution and channels).

        Args:
            config: a `ViTPlusConfig` (its `image_size` and `num_channels`).
            **kwargs: settings that override the derived ones.

        Returns:
            The processor.

        Raises:
            ValueError: a config whose `num_channels` is not a positive number.
        """
        size = {"height": config.image_size, "width": config.image_size}
        channels = config.num_channels
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise ValueError(f"The config's num_channels must be a positive integer, got {channels!r}.")
        if channels == 1:
            kwargs.setdefault("do_convert_grayscale", True)
        if channels != 3:
            # one mean and std per channel: the processor keeps that many (4: RGB + near-infrared, not RGBA)
            kwargs.setdefault("do_convert_rgb", False)
            kwargs.setdefault("image_mean", [0.5] * channels)
            kwargs.setdefault("image_std", [0.5] * channels)
        return cls(size=size, **kwargs)


class ViTPlusVideoProcessor:
    """There is none: ViTPlus classifies single images. `AutoVideoProcessor.from_pretrained` derives this name from
    the image processor's (and the pipelines ask for a video processor), so this class is registered for the family
    and answers with an error that says so, installed or as remote code, instead of transformers' generic "Could not
    load any video processor class". Pipelines go on without a video processor, as before."""

    @classmethod
    def _refuse(cls):
        raise ValueError(
            "The ViTPlus family (model type 'vit_plus') has no video processor: it classifies single images. Load its "
            "image processor with AutoImageProcessor.from_pretrained(...) and give it the frames of a video one by "
            "one (or as a batch of images)."
        )

    def __init__(self, *args, **kwargs):
        self._refuse()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        cls._refuse()

    @classmethod
    def from_dict(cls, *args, **kwargs):
        """What `AutoVideoProcessor.from_pretrained` calls from transformers 5.25 on (before: `from_pretrained`)."""
        cls._refuse()

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoVideoProcessor") -> None:
        """Nothing to save with a checkpoint (transformers calls this on a class it loads as remote code)."""


__all__ = [
    "ViTPlusImageProcessor",
    "ViTPlusVideoProcessor",
    "channels_to_rgb",
    "check_images",
    "rgb_to_luma",
    "target_channels",
]
