"""DeiT's hard-label distillation (Touvron et al. 2021, sec. 4): a teacher's predicted class on each training image is
the target of the student's distillation head (`train vit --teacher PATH`).

The teacher is any folder or Hub id that `AutoModelForImageClassification` opens: a CNN trained by this package's
loop (`train vit --model_type resnet`), a ViTPlus, transformers' ViT or ResNet, or a timm model through transformers'
`TimmWrapper`. It sees the student's batch, augmented and mixed as the student sees it (as in DeiT), converted to its
own input: the student's normalisation undone and the teacher's applied (from its image processor), grey and RGB
converted (ITU-R 601-2 luma, or the grey channel repeated), resized when its processor asks for another size.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch

from ..errors import UsageError

logger = logging.getLogger(__name__)

_GENERIC_LABEL = re.compile(r"^LABEL_\d+$")
_LUMA = (0.299, 0.587, 0.114)


@dataclass(frozen=True)
class PixelFormat:
    """How a model's pixel values are made from [0, 1] images: channels, per-channel mean and std, size (None: any)."""

    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    size: tuple[int, int] | None = None


def pixel_format(processor, config) -> PixelFormat:
    """The pixel format a model reads, from its image processor (transformers' processors: `image_mean`,
    `image_std`, `size`; timm's through TimmWrapper: `data_config`) and its config (`num_channels`)."""
    channels = getattr(config, "num_channels", None)
    data_config = getattr(processor, "data_config", None)  # TimmWrapperImageProcessor
    if data_config is not None:
        mean, std = tuple(data_config["mean"]), tuple(data_config["std"])
        channels = channels or int(data_config.get("input_size", (len(mean),))[0])
        size = None  # a timm CNN takes any size; the student's images are used as they are
    else:
        mean = tuple(getattr(processor, "image_mean", None) or (0.5,))
        std = tuple(getattr(processor, "image_std", None) or (0.5,))
        size = _processor_size(getattr(processor, "size", None))
    if channels is None:
        model_args = getattr(config, "model_args", None) or {}
        channels = int(model_args.get("in_chans", 3))
    if len(mean) == 1 and channels > 1:
        mean, std = mean * channels, std * channels
    return PixelFormat(channels=channels, mean=mean, std=std, size=size)


def _processor_size(size) -> tuple[int, int] | None:
    if isinstance(size, dict) and "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    return None


def convert_pixels(pixel_values: torch.Tensor, source: PixelFormat, target: PixelFormat) -> torch.Tensor:
    """Pixel values (B, C, H, W) made for `source` as `target` reads the same images."""
    if source == target:
        return pixel_values
    dtype, device = pixel_values.dtype, pixel_values.device

    def column(values):
        return torch.tensor(values, dtype=dtype, device=device)[None, :, None, None]

    images = pixel_values * column(source.std[: pixel_values.shape[1]]) + column(source.mean[: pixel_values.shape[1]])
    if images.shape[1] == 1 and target.channels == 3:
        images = images.expand(-1, 3, -1, -1)
    elif images.shape[1] == 3 and target.channels == 1:
        images = (images * column(_LUMA)).sum(1, keepdim=True)
    if target.size is not None and tuple(images.shape[-2:]) != target.size:
        images = torch.nn.functional.interpolate(images, size=target.size, mode="bilinear", antialias=True)
    return (images - column(target.mean)) / column(target.std)


class Teacher:
    """A frozen classifier in eval mode that gives hard labels (its argmax) for the student's pixel values."""

    def __init__(self, model: torch.nn.Module, student: PixelFormat, teacher: PixelFormat):
        self.model = model.eval().requires_grad_(False)
        self.student, self.teacher = student, teacher
        # a convolutional teacher runs in channels-last layout: oneDNN's convolutions without layout conversions
        # (timed in results/small_data_update_time.csv)
        self.channels_last = any(isinstance(module, torch.nn.Conv2d) for module in model.modules())
        if self.channels_last:
            self.model.to(memory_format=torch.channels_last)

    @torch.no_grad()
    def labels(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The teacher's predicted class (B,) of each image."""
        inputs = convert_pixels(pixel_values, self.student, self.teacher)
        dtype = next(self.model.parameters()).dtype
        inputs = inputs.to(dtype)
        if self.channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return self.model(pixel_values=inputs).logits.argmax(-1)


def load_teacher(location: str, student_processor, student_config, class_names: list[str], device) -> Teacher:
    """The teacher at `location` on `device`, checked against the student's classes (same names in the same order;
    a teacher with transformers' generic names LABEL_0, ... only needs as many classes). A `UsageError` names what
    does not fit."""
    from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageClassification

    try:
        config = AutoConfig.from_pretrained(location)
        model = AutoModelForImageClassification.from_pretrained(location, config=config)
    except (OSError, ValueError) as error:
        raise UsageError(
            f"--teacher {location!r} is not an image classifier that AutoModelForImageClassification opens: "
            f"{str(error).splitlines()[0]}"
        ) from error
    names = [config.id2label[i] for i in range(config.num_labels)] if config.id2label else []
    generic = all(_GENERIC_LABEL.match(str(name)) for name in names)
    if len(names) != len(class_names) or (not generic and names != list(class_names)):
        raise UsageError(
            f"--teacher {location!r} predicts {len(names)} classes ({_preview(names)}); the data has "
            f"{len(class_names)} ({_preview(class_names)}): a teacher must know the student's classes, in order."
        )
    try:
        processor = AutoImageProcessor.from_pretrained(location)
    except (OSError, ValueError):  # no processor saved: the student's pixels as they are, channels converted
        processor = None
    student = pixel_format(student_processor, student_config)
    teacher = pixel_format(processor, config) if processor is not None else PixelFormat(
        channels=getattr(config, "num_channels", None) or student.channels,
        mean=student.mean[:1] * (getattr(config, "num_channels", None) or student.channels),
        std=student.std[:1] * (getattr(config, "num_channels", None) or student.channels),
    )  # fmt: skip
    logger.info("Teacher %s (%s): %s", location, type(model).__name__, teacher)
    return Teacher(model.to(device), student, teacher)


def _preview(names) -> str:
    names = [str(name) for name in names]
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


__all__ = ["PixelFormat", "Teacher", "convert_pixels", "load_teacher", "pixel_format"]
