"""The augmentation of the image models' training data (the `--recipe` flags), with `torchvision.transforms.v2`:

- per image, on uint8 pixels (C, H, W) at the model's size: random resized crop, horizontal flip, RandAugment or
  TrivialAugment (`image_augmentation`), then after normalisation random erasing (`erasing`);
- per batch, in the training step: Mixup or CutMix with soft targets (`BatchMixer`), and the loss on soft targets
  with label smoothing (`soft_cross_entropy`).

Evaluation images are never augmented.
"""

from __future__ import annotations

import torch
from torchvision.transforms import v2


def augments_images(args) -> bool:
    """Whether `args` (resolved TrainingArguments) change the training images one by one."""
    return (
        (args.auto_augment or "none") != "none"
        or (args.random_resized_crop_scale or 1.0) < 1.0
        or bool(args.horizontal_flip)
        or bool(args.random_erasing_prob)
    )


def mixes_batches(args) -> bool:
    """Whether `args` mix training batches (Mixup or CutMix)."""
    return bool(args.mixup_prob) and bool(args.mixup_alpha or args.cutmix_alpha)


def image_augmentation(args, image_size: tuple[int, int]) -> v2.Compose | None:
    """The per-image augmentation of uint8 pixels (C, H, W) at the model's `image_size`; None when there is none."""
    steps = []
    scale = args.random_resized_crop_scale or 1.0
    if scale < 1.0:
        steps.append(v2.RandomResizedCrop(image_size, scale=(scale, 1.0), antialias=True))
    if args.horizontal_flip:
        steps.append(v2.RandomHorizontalFlip())
    if args.auto_augment == "randaugment":
        steps.append(v2.RandAugment(num_ops=2, magnitude=args.auto_augment_magnitude))
    elif args.auto_augment == "trivialaugment":
        steps.append(v2.TrivialAugmentWide())
    return v2.Compose(steps) if steps else None


def erasing(args) -> v2.RandomErasing | None:
    """Random erasing of normalised pixels (a rectangle set to 0, the mean), as DeiT after normalisation."""
    if not args.random_erasing_prob:
        return None
    return v2.RandomErasing(p=args.random_erasing_prob, value=0.0)


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


__all__ = ["BatchMixer", "augments_images", "erasing", "image_augmentation", "mixes_batches", "soft_cross_entropy"]
