"""The augmentation of the image models' training data (the `--recipe` flags):

- per batch of uint8 pixels (B, C, H, W) at the model's size (`image_augmentation`, an `ImageAugmentation`): random
  resized crop and horizontal flip of every image at once (each image's box resampled as torchvision's
  `resized_crop` + `hflip` resample it, by two batched products with its interpolation matrices), then
  RandAugment or TrivialAugment (`torchvision.transforms.v2`'s, each operation drawn run once on the images that drew
  it: `BatchAutoAugment`); after normalisation random erasing
  of every image at once (`erasing`, a `BatchErasing`, torchvision's `RandomErasing` drawn for the whole batch);
- per batch, in the training step: Mixup or CutMix with soft targets (`BatchMixer`, `transforms.v2.MixUp` /
  `CutMix`), and the loss on soft targets with label smoothing (`soft_cross_entropy`).

Crop, flip and erasing run on the batch because image by image they cost a large share of a small model's update
(`scripts/benchmarks/bench_small_data.py --time_augmentation` times both; results/small_data_augmentation.csv holds
the rows). Evaluation images are never augmented.

Images read from files (an image folder, WebDataset shards, a Hub data set) have sizes of their own: each is decoded
and cropped to the model's size alone, in a DataLoader worker (`example_augmentation`, an `ExampleAugmentation`:
random resized crop, flip and RandAugment / TrivialAugment, torchvision's transforms on the PIL image, whose kernels
are several times faster than its tensor kernels on a CPU), and the batches reach the device as uint8 (a quarter of
the bytes of float32), where they are normalised and erased (`PixelNormalizer`): per batch, where that is cheaper.
`scripts/benchmarks/bench_input_pipeline.py` measures the loader against timm's.
"""

from __future__ import annotations

import math

import torch
from torchvision.transforms import v2


def mixes_batches(args) -> bool:
    """Whether `args` mix training batches (Mixup or CutMix)."""
    return bool(args.mixup_prob) and bool(args.mixup_alpha or args.cutmix_alpha)


def image_augmentation(args, image_size: tuple[int, int]) -> ImageAugmentation | None:
    """The augmentation of uint8 batches (B, C, H, W) at the model's `image_size`; None when there is none."""
    augmentation = ImageAugmentation.from_args(args, image_size)
    return augmentation if augmentation.active else None


def example_augmentation(args, image_size: tuple[int, int]) -> ExampleAugmentation:
    """The augmentation of one decoded image (C, H, W) uint8 of any size, to the model's `image_size` (a plain resize
    when the recipe crops nothing)."""
    return ExampleAugmentation.from_args(args, image_size)


def erasing(args) -> BatchErasing | None:
    """Random erasing of normalised pixels (a rectangle set to 0, the mean), as DeiT after normalisation."""
    if not args.random_erasing_prob:
        return None
    return BatchErasing(args.random_erasing_prob)


_CROP_RATIO = (3 / 4, 4 / 3)  # torchvision's RandomResizedCrop
_ERASE_SCALE, _ERASE_RATIO = (0.02, 0.33), (0.3, 3.3)  # torchvision's RandomErasing
_ATTEMPTS = 10  # torchvision's tries at a box that fits, for both


def _auto_augment_policy(crop_scale: float, auto_augment: str | None, magnitude: int, prob: float):
    """The checked settings' torchvision policy (RandAugment of 2 operations, TrivialAugmentWide), or None where
    there is none or it never applies (`prob` 0)."""
    if not 0.0 < crop_scale <= 1.0:
        raise ValueError(f"crop_scale must be in (0, 1], got {crop_scale!r}")
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"auto_augment_prob must be in [0, 1], got {prob!r}")
    if auto_augment == "randaugment":
        policy = v2.RandAugment(num_ops=2, magnitude=magnitude)
    elif auto_augment == "trivialaugment":
        policy = v2.TrivialAugmentWide()
    elif auto_augment in (None, "none"):
        return None
    else:
        raise ValueError(f"auto_augment must be 'none', 'randaugment' or 'trivialaugment', got {auto_augment!r}")
    return policy if prob > 0.0 else None


class _RecipeAugmentation:
    """The settings both augmentations take from a recipe, checked (`_auto_augment_policy`), and how they are read
    from the run's arguments (`from_args`); each augmentation builds its transforms from them (`_build`)."""

    def __init__(
        self,
        image_size: tuple[int, int],
        crop_scale: float = 1.0,
        horizontal_flip: bool = False,
        auto_augment: str = "none",
        auto_augment_magnitude: int = 9,
        auto_augment_prob: float = 1.0,
    ):
        policy = _auto_augment_policy(crop_scale, auto_augment, auto_augment_magnitude, auto_augment_prob)
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.crop_scale, self.horizontal_flip = float(crop_scale), bool(horizontal_flip)
        self.auto_augment_prob = float(auto_augment_prob)
        self._build(policy)

    @classmethod
    def from_args(cls, args, image_size: tuple[int, int]):
        """The augmentation that the run's arguments (--random_resized_crop_scale, --horizontal_flip, --auto_augment,
        --auto_augment_magnitude, --auto_augment_prob) describe at the model's `image_size`."""
        return cls(
            image_size,
            crop_scale=args.random_resized_crop_scale or 1.0,
            horizontal_flip=bool(args.horizontal_flip),
            auto_augment=args.auto_augment or "none",
            auto_augment_magnitude=args.auto_augment_magnitude,
            auto_augment_prob=1.0 if args.auto_augment_prob is None else args.auto_augment_prob,
        )

    def _build(self, policy) -> None:
        """Build the transforms; `policy`: the torchvision auto-augment policy, or None."""
        raise NotImplementedError


class ImageAugmentation(_RecipeAugmentation):
    """Random resized crop (area share in (`crop_scale`, 1), aspect ratio in (3/4, 4/3), torchvision's sampling and
    its fallback to the whole image) and horizontal flip (probability 0.5) of a batch of uint8 images (B, C, H, W),
    back to `image_size`, then RandAugment (2 operations, `auto_augment_magnitude`) or TrivialAugment
    (`BatchAutoAugment`), on each image with probability `auto_augment_prob` (the others skip it, and its cost).

    The crop and flip are exact batched equivalents of `v2.functional.resized_crop(..., antialias=True)` and
    `hflip` on each image (a crop is never larger than the image, so resizing it is plain bilinear interpolation
    with clamped edges; the float result is rounded to uint8 as torchvision's is, +-1 where its fixed-point uint8
    kernel rounds the other way): each image's box becomes an (H, H_in) and a (W, W_in) interpolation matrix and the
    batch two batched products, instead of one torchvision call per image. Random numbers come from torch's global
    generator, as torchvision's."""

    def _build(self, policy) -> None:
        self.auto = None if policy is None else BatchAutoAugment(policy)

    @property
    def active(self) -> bool:
        return self.crop_scale < 1.0 or self.horizontal_flip or self.auto is not None

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        if pixels.dtype != torch.uint8 or pixels.dim() != 4:
            raise TypeError(f"expected uint8 images (B, C, H, W), got {pixels.dtype} of shape {tuple(pixels.shape)}")
        if self.crop_scale < 1.0 or self.horizontal_flip:
            boxes = self.crop_boxes(pixels.shape[0], pixels.shape[-2:]) if self.crop_scale < 1.0 else None
            flips = torch.rand(pixels.shape[0]) < 0.5 if self.horizontal_flip else None
            pixels = resized_crops(pixels, boxes, self.image_size, flips)
        if self.auto is not None and self.auto_augment_prob < 1.0:
            chosen = (torch.rand(pixels.shape[0]) < self.auto_augment_prob).nonzero()[:, 0]
            pixels = pixels.clone()
            if len(chosen):
                pixels[chosen] = self.auto(pixels[chosen])
        elif self.auto is not None:
            pixels = self.auto(pixels)
        return pixels

    def crop_boxes(self, batch: int, input_size) -> torch.Tensor:
        """(B, 4) boxes (top, left, height, width) drawn as `v2.RandomResizedCrop` draws one per image."""
        height, width = int(input_size[0]), int(input_size[1])
        area = height * width
        target = area * torch.empty(batch, _ATTEMPTS).uniform_(self.crop_scale, 1.0)
        log_ratio = torch.empty(batch, _ATTEMPTS).uniform_(math.log(_CROP_RATIO[0]), math.log(_CROP_RATIO[1]))
        aspect = torch.exp(log_ratio)
        w = torch.round(torch.sqrt(target * aspect))
        h = torch.round(torch.sqrt(target / aspect))
        fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        first = fits.to(torch.int8).argmax(1, keepdim=True)
        h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
        # torchvision's fallback: the central crop of the whole image at the nearest allowed aspect ratio
        fallback_w, fallback_h = float(width), float(height)
        if width / height < _CROP_RATIO[0]:
            fallback_h = float(round(width / _CROP_RATIO[0]))
        elif width / height > _CROP_RATIO[1]:
            fallback_w = float(round(height * _CROP_RATIO[1]))
        found = fits.any(1)
        h = torch.where(found, h, torch.full_like(h, fallback_h))
        w = torch.where(found, w, torch.full_like(w, fallback_w))
        top = torch.floor(torch.rand(batch) * (height - h + 1))
        left = torch.floor(torch.rand(batch) * (width - w + 1))
        top = torch.where(found, top, (height - h) // 2)
        left = torch.where(found, left, (width - w) // 2)
        return torch.stack([top, left, h, w], 1).long()


class ExampleAugmentation(_RecipeAugmentation):
    """One image of any size (a PIL image, or a uint8 tensor (C, H, W)) to the model's `image_size`, as uint8 (C, H,
    W): a random resized crop (area share in (`crop_scale`, 1), aspect ratio in (3/4, 4/3): `v2.RandomResizedCrop`)
    or, with `crop_scale` 1, a resize of the whole image; a horizontal flip (probability 0.5); then, with probability
    `auto_augment_prob`, RandAugment (2 operations, `auto_augment_magnitude`) or TrivialAugment. torchvision's
    transforms, run on the PIL image (their PIL kernels: several times faster than their tensor kernels on a CPU).
    Random numbers come from torch's global generator (the loader seeds it per unit of work:
    `hf_vit_plus.data.pipeline`)."""

    def _build(self, policy) -> None:
        if self.crop_scale < 1.0:
            self.resize = v2.RandomResizedCrop(self.image_size, scale=(self.crop_scale, 1.0), antialias=True)
        else:
            self.resize = v2.Resize(self.image_size, antialias=True)
        self.flip = v2.RandomHorizontalFlip() if self.horizontal_flip else None
        self.auto = policy
        if self.auto is None:
            self.auto_augment_prob = 0.0

    def __call__(self, image) -> torch.Tensor:
        from ..data.image_files import pil_to_tensor

        if isinstance(image, torch.Tensor):
            if image.dtype != torch.uint8 or image.dim() != 3:
                raise TypeError(f"expected a uint8 image (C, H, W), got {image.dtype} of shape {tuple(image.shape)}")
            image = v2.functional.to_pil_image(image)
        image = self.resize(image)
        if self.flip is not None:
            image = self.flip(image)
        if self.auto_augment_prob and (self.auto_augment_prob == 1.0 or torch.rand(()) < self.auto_augment_prob):
            image = self.auto(image)
        return pil_to_tensor(image)


class PixelNormalizer:
    """A batch of uint8 images (B, C, H, W), on the device: normalised as the image processor does ((x / 255 - mean)
    / std, in float32) and randomly erased (`BatchErasing`, in place), the whole batch at once.

    Args:
        mean: the processor's mean per channel, (C, 1, 1).
        std: its standard deviation per channel, (C, 1, 1).
        erase: the random erasing, or None.
    """

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, erase: BatchErasing | None = None):
        self.scale = (1.0 / (255.0 * std)).view(1, -1, 1, 1)
        self.shift = (mean / std).view(1, -1, 1, 1)
        self.erase = erase

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        if pixels.dtype != torch.uint8:
            raise TypeError(f"expected uint8 images (B, C, H, W), got {pixels.dtype}")
        scale, shift = self.scale.to(pixels.device), self.shift.to(pixels.device)
        values = pixels.float().mul_(scale).sub_(shift)
        if self.erase is not None:
            self.erase.erase_(values)
        return values


class BatchAutoAugment:
    """torchvision's `v2.RandAugment` or `v2.TrivialAugmentWide` of a batch of uint8 images (B, C, H, W): the same
    images as the transform gives called image by image after the same seed. Each image draws its operations and
    magnitudes from torch's global generator as the transform's `forward` draws them (the same numbers in the same
    order: the operation, the magnitude's bin for TrivialAugment, its sign), then each operation and magnitude drawn
    runs once, through the transform's own code, on all the images that drew it: at most 23 calls per operation slot of
    RandAugment (14 operations, 9 of them with either sign), where image by image a batch of 128 makes 256
    (`bench_small_data.py --time_augmentation` times both ways; results/small_data_augmentation.csv). A transform
    without the torchvision internals this reads (`_AUGMENTATION_SPACE`, `_apply_image_or_video_transform`: the
    project's torchvision 0.29 has them, and the tests check the result against the public transform) runs image by
    image."""

    def __init__(self, transform: v2.RandAugment | v2.TrivialAugmentWide):
        if not isinstance(transform, (v2.RandAugment, v2.TrivialAugmentWide)):
            raise TypeError(f"expected v2.RandAugment or v2.TrivialAugmentWide, got {type(transform).__name__}")
        self.transform = transform
        internals = ("_AUGMENTATION_SPACE", "_apply_image_or_video_transform", "_fill", "interpolation")
        self.batched = all(hasattr(transform, name) for name in internals)
        self.space = list(transform._AUGMENTATION_SPACE.items()) if self.batched else []
        self._magnitudes: dict[tuple[str, int, int], list[float] | None] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if not self.batched:
            return torch.stack([self.transform(image) for image in images]) if len(images) else images
        height, width = images.shape[-2:]
        draws = [self.draw(height, width) for _ in range(images.shape[0])]
        for slot in range(len(draws[0]) if draws else 0):
            groups: dict[tuple[str, float], list[int]] = {}
            for index, ops in enumerate(draws):
                groups.setdefault(ops[slot], []).append(index)
            out = images.clone()
            for (name, magnitude), members in groups.items():
                if name == "Identity":
                    continue
                index = torch.tensor(members)
                out[index] = self.transform._apply_image_or_video_transform(
                    images[index], name, magnitude, interpolation=self.transform.interpolation,
                    fill=self.transform._fill,
                )  # fmt: skip
            images = out
        return images

    def draw(self, height: int, width: int) -> list[tuple[str, float]]:
        """One image's (operation, magnitude) of each slot, drawn as the transform's `forward` draws them."""
        transform = self.transform
        randaugment = isinstance(transform, v2.RandAugment)
        ops = []
        for _ in range(transform.num_ops if randaugment else 1):
            name, (magnitudes_fn, signed) = self.space[int(torch.randint(len(self.space), ()))]
            key = (name, height, width)
            if key not in self._magnitudes:
                values = magnitudes_fn(transform.num_magnitude_bins, height, width)
                self._magnitudes[key] = None if values is None else [float(value) for value in values]
            magnitudes = self._magnitudes[key]
            magnitude = 0.0
            if magnitudes is not None:
                bin_ = transform.magnitude if randaugment else int(torch.randint(transform.num_magnitude_bins, ()))
                magnitude = magnitudes[bin_]
                if signed and torch.rand(()) <= 0.5:
                    magnitude *= -1
            ops.append((name, magnitude))
        return ops


def interpolation_matrix(start: torch.Tensor, length: torch.Tensor, size: int, input_size: int) -> torch.Tensor:
    """(B, size, input_size): row y of matrix b holds the bilinear weights (align_corners=False, edges clamped to
    the box) of output pixel y when the span [start_b, start_b + length_b) of the input is resized to `size`."""
    start, length = start.double()[:, None], length.double()[:, None]
    y = torch.arange(size, dtype=torch.float64)[None]
    source = (y + 0.5) * length / size - 0.5
    source = source.clamp(min=0.0)
    low = torch.floor(source)
    fraction = source - low
    low = torch.minimum(low, length - 1)
    high = torch.minimum(low + 1, length - 1)
    matrix = torch.zeros(start.shape[0], size, input_size, dtype=torch.float64)
    matrix.scatter_add_(2, (start + low).long()[..., None], (1 - fraction)[..., None])
    matrix.scatter_add_(2, (start + high).long()[..., None], fraction[..., None])
    return matrix.float()


def resized_crops(
    pixels: torch.Tensor, boxes: torch.Tensor | None, size: tuple[int, int], flips: torch.Tensor | None = None
) -> torch.Tensor:
    """Images (B, C, H, W): the box (top, left, height, width) of each (the whole image when `boxes` is None)
    resized to `size`, mirrored where `flips` is True: what `v2.functional.resized_crop` (antialiased) and `hflip`
    give image by image, for the whole batch (uint8 images rounded back to uint8, float ones kept float)."""
    batch, _, height, width = pixels.shape
    if boxes is None:
        boxes = torch.tensor([[0, 0, height, width]]).expand(batch, 4)
    rows = interpolation_matrix(boxes[:, 0], boxes[:, 2], size[0], height)
    columns = interpolation_matrix(boxes[:, 1], boxes[:, 3], size[1], width)
    if flips is not None:
        columns = torch.where(flips[:, None, None], columns.flip(1), columns)
    images = rows[:, None] @ pixels.float() @ columns[:, None].transpose(-1, -2)
    if pixels.dtype != torch.uint8:
        return images.to(pixels.dtype)
    return images.round_().clamp_(0, 255).to(torch.uint8)


class BatchErasing:
    """`v2.RandomErasing(p, value=0)` of a batch of normalised images (B, C, H, W): each image, with probability
    `p`, gets a rectangle of area share in (0.02, 0.33) and aspect ratio in (0.3, 3.3) set to 0 (torchvision's
    sampling: ten tries at a rectangle smaller than the image, none erased when all fail), all images at once
    (`erase_`: the same rectangles, written in place, touching only them)."""

    def __init__(self, p: float):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"the erasing probability must be in [0, 1], got {p!r}")
        self.p = float(p)

    def draw(self, batch: int, height: int, width: int) -> tuple[torch.Tensor, ...]:
        """(top, left, height, width, erased) of each image's rectangle, drawn for the whole batch."""
        area = height * width
        erase_area = area * torch.empty(batch, _ATTEMPTS).uniform_(*_ERASE_SCALE)
        log_ratio = torch.empty(batch, _ATTEMPTS).uniform_(math.log(_ERASE_RATIO[0]), math.log(_ERASE_RATIO[1]))
        aspect = torch.exp(log_ratio)
        h = torch.round(torch.sqrt(erase_area * aspect))
        w = torch.round(torch.sqrt(erase_area / aspect))
        fits = (h < height) & (w < width)
        first = fits.to(torch.int8).argmax(1, keepdim=True)
        h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
        top = torch.floor(torch.rand(batch) * (height - h + 1))
        left = torch.floor(torch.rand(batch) * (width - w + 1))
        erase = fits.any(1) & (torch.rand(batch) < self.p)
        return top, left, h, w, erase

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        batch, _, height, width = pixel_values.shape
        top, left, h, w, erase = self.draw(batch, height, width)
        y = torch.arange(height)[None]
        x = torch.arange(width)[None]
        in_rows = (y >= top[:, None]) & (y < (top + h)[:, None])
        in_columns = (x >= left[:, None]) & (x < (left + w)[:, None])
        mask = (in_rows[:, :, None] & in_columns[:, None, :]) & erase[:, None, None]
        return pixel_values.masked_fill(mask.to(pixel_values.device)[:, None], 0.0)

    def erase_(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The same as calling it (the same random numbers, the same rectangles), written into `pixel_values`."""
        batch, _, height, width = pixel_values.shape
        top, left, h, w, erase = self.draw(batch, height, width)
        for index in erase.nonzero()[:, 0].tolist():
            t, lf = int(top[index]), int(left[index])
            pixel_values[index, :, t : t + int(h[index]), lf : lf + int(w[index])] = 0.0
        return pixel_values


class BatchMixer:
    """Mixup (Zhang et al. 2018) or CutMix (Yun et al. 2019) of a batch with probability `prob`; with both alphas > 0,
    one of the two, chosen at random per batch (DeiT's switch probability 0.5). Returns the pixels and soft targets
    (B, num_classes): one-hot rows for a batch left as it is."""

    def __init__(self, num_classes: int, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0, prob: float = 1.0):
        self.num_classes = num_classes
        self.prob = prob
        mixers = []
        if mixup_alpha:
            mixers.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
        if cutmix_alpha:
            mixers.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
        self.mix = v2.RandomChoice(mixers) if len(mixers) > 1 else (mixers[0] if mixers else None)

    def __call__(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mix is not None and torch.rand(()).item() < self.prob:
            return self.mix(pixel_values, labels)
        return pixel_values, torch.nn.functional.one_hot(labels, self.num_classes).to(pixel_values.dtype)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy of `logits` (B, K) against class indices (B,) or soft targets (B, K), with label smoothing
    (the targets mixed with the uniform distribution), in float32."""
    return torch.nn.functional.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)


__all__ = [
    "BatchAutoAugment",
    "BatchErasing",
    "BatchMixer",
    "ExampleAugmentation",
    "ImageAugmentation",
    "PixelNormalizer",
    "erasing",
    "example_augmentation",
    "image_augmentation",
    "interpolation_matrix",
    "mixes_batches",
    "resized_crops",
    "soft_cross_entropy",
]
