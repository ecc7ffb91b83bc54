"""Training recipes of the image models (`--recipe`): "none", plain training as before 0.3, and "deit", the
data-efficient recipe of DeiT (Touvron et al., ICML 2021, "Training data-efficient image transformers & distillation
through attention", Table 9 and its code's defaults), scaled to the data and the run.

A recipe gives a value to every setting the user leaves unset (None): explicit flags always win. The run's plan
(`plan.build_plan`) takes them, once, from the data, the model and the run's length (`run_recipe_values`,
`recipe_drop_path_rate`); the values that need no data are `static_recipe_values`. Each value is defined here only:
the help of the flags states them from these tables (`recipe_flag_help`).

DeiT's values and how "deit" scales them:

| setting | DeiT (ImageNet, 300 epochs, batch 1024) | "deit" here |
|---|---|---|
| optimiser, schedule | AdamW, cosine, weight decay 0.05 | the same (the family's) |
| learning rate | 5e-4 x batch / 512 | that rule on the global batch, / t (at most x 16: 2e-3 at batch 128) |
| warm-up | 5 epochs (1.7% of the run) | 5 epochs, at most 5% of the run |
| label smoothing | 0.1 | 0.1 |
| stochastic depth | 0.1 (DeiT-Ti/S, 12 blocks) | 0.1 x blocks / 12 x s |
| RandAugment | rand-m9-mstd0.5 (timm: 90% of each range) | magnitude 27 of 30 x s, 2 ops, on t of the images |
| Mixup / CutMix | alpha 0.8 / 1.0, every batch, one of the two | the same alphas, a batch mixed with probability t |
| random erasing | 0.25 | 0.25 x s |
| random resized crop | scale (0.08, 1) at 224 px | c = max(0.08, (16/size)^2) at 300 epochs: (1 - (1 - c) s, 1) |
| horizontal flip | yes | where the data allows (clothes yes, digits no; user images yes) |
| weight EMA | 0.99996 (its horizon 1/(1-d) = 25k updates, 6.7% of the run) | horizon 6.7% of the run's updates |
| precision | automatic mixed precision (fp16 autocast) | bf16 autocast where bf16 products are native, else fp32 (*) |

(*) fp32 also for a CNN whose feature maps shrink to 1 x 1 on the CPU, where bf16's backward is known to fail.

t = the run's share of DeiT's training, min(1, epochs / 300), and s = t ** 0.5: the regularisers that make the model
fit slower grow with the time it has to fit, and the step size shrinks to DeiT's as the run grows, so that a run of
300 epochs gets DeiT's values and a short run on a small data set is neither regularised into under-fitting nor
starved of updates. The mild regularisers (crops, erasing, dropped blocks) grow with s; DeiT's strongest ones
(RandAugment, Mixup / CutMix) and the step size with t, so that a run of 30 epochs gets a tenth of them and 10 x
DeiT's step size (1.25e-3 at batch 128). Both exponents are choices, not DeiT's, fitted to 45-minute Fashion-MNIST
runs of `scripts/benchmarks/bench_small_data.py` (their rows: results/small_data.csv, the docs' Results page): on
those runs full RandAugment cost accuracy and time per update, and the recipe without RandAugment or mixing did
better than one where s scaled everything. The cap of the learning rate is the ViT family's
plain 2e-3 at batch 128 (Lee et al. 2021, "Vision Transformer for Small-Size Datasets", train small ViTs with
DeiT's augmentation at 1e-3). At first the crop and the learning rate were not scaled at all: crops of a third of the
image cut away the sleeves and collars that tell shirts, pullovers and coats apart, and 1.25e-4 left both the ViT and
the CNN far below plain training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Every setting a recipe decides (the `TrainingArguments` fields, None when unset), and "none"'s value of each: plain
# training as before 0.3 (the learning rate, warm-up and smoothing the ViT family always had).
RECIPE_NONE = dict(
    learning_rate=2e-3,
    warmup_ratio=0.1,
    label_smoothing_factor=0.0,
    auto_augment="none",
    auto_augment_magnitude=9,  # torchvision's default (used only when --auto_augment randaugment is given)
    auto_augment_prob=1.0,
    random_resized_crop_scale=1.0,
    horizontal_flip=False,
    random_erasing_prob=0.0,
    mixup_alpha=0.0,
    cutmix_alpha=0.0,
    mixup_prob=1.0,
    ema_decay=0.0,
)
# DeiT's values that need no data
DEIT_STATIC = dict(label_smoothing_factor=0.1, auto_augment="randaugment", mixup_alpha=0.8, cutmix_alpha=1.0)
DEIT_EPOCHS = 300
DEIT_LEARNING_RATE_PER_512 = 5e-4
MAX_LEARNING_RATE_BOOST = 16.0  # 2e-3 at batch 128 = 16 x DeiT's rule: the ViT family's plain training
DEIT_WARMUP_EPOCHS = 5
DEIT_MAX_WARMUP_RATIO = 0.05
DEIT_DROP_PATH_RATE = 0.1  # DeiT-Ti / DeiT-S, 12 blocks
DEIT_DROP_PATH_DEPTH = 12
DEIT_RANDAUGMENT_MAGNITUDE = 27  # timm's m9 of 10 on torchvision's 0-30 scale
DEIT_RANDOM_ERASING = 0.25
DEIT_EMA_SHARE = 25_000 / (300 * 1251)  # 0.99996's horizon over DeiT's updates (300 epochs of 1,251 at batch 1024)
MIN_CROP_PIXELS = 16  # the smallest random crop keeps the area of a 16 x 16 image


@dataclass(frozen=True)
class RecipeContext:
    """What the run-time values of a recipe depend on."""

    family: str  # "vit" or "vit-mpp" (masked patch prediction learns no classes: no mixing, erasing or smoothing)
    image_size: tuple[int, int]  # (height, width) of the model's input
    global_batch: int  # images per update, all processes and micro-batches
    total_steps: int  # updates of the run
    epochs: float  # passes over the training data
    mirror_symmetric: bool  # a mirrored image keeps its class


def budget_share(epochs: float) -> float:
    """t: the share of DeiT's training that a run of `epochs` is, min(1, epochs / 300): how much of DeiT's strongest
    regularisers (RandAugment, Mixup / CutMix) it gets, and 1 / the boost of its step size."""
    return min(1.0, max(0.0, epochs) / DEIT_EPOCHS)


def budget_scale(epochs: float) -> float:
    """s = t ** 0.5: how much of DeiT's mild regularisers (crops, erasing, dropped blocks) a run of `epochs` gets."""
    return budget_share(epochs) ** 0.5


# Masked patch prediction learns no classes: nothing to smooth or mix, and erasing would hide the patches to predict.
NO_CLASSES = dict(label_smoothing_factor=0.0, mixup_alpha=0.0, cutmix_alpha=0.0, random_erasing_prob=0.0)


def static_recipe_values(recipe: str, family: str = "vit") -> dict[str, Any]:
    """The values of `recipe` that need no data: all of "none"'s, DeiT's fixed ones (for `family`)."""
    if recipe == "none":
        return dict(RECIPE_NONE)
    if recipe == "deit":
        return {**DEIT_STATIC, **(NO_CLASSES if family == "vit-mpp" else {})}
    raise ValueError(f"Unknown recipe {recipe!r}; expected 'none' or 'deit'.")


def run_recipe_values(recipe: str, context: RecipeContext) -> dict[str, Any]:
    """Every setting of `recipe` for this run (see the module's table)."""
    values = static_recipe_values(recipe, context.family)
    if recipe == "none":
        return values
    share, scale = budget_share(context.epochs), budget_scale(context.epochs)
    crop = max(0.08, (MIN_CROP_PIXELS / min(context.image_size)) ** 2)
    horizon = max(1.0, DEIT_EMA_SHARE * context.total_steps)
    boost = min(MAX_LEARNING_RATE_BOOST, 1.0 / max(share, 1e-9))
    values.update(
        learning_rate=DEIT_LEARNING_RATE_PER_512 * context.global_batch / 512 * boost,
        warmup_ratio=min(DEIT_WARMUP_EPOCHS / max(context.epochs, 1e-9), DEIT_MAX_WARMUP_RATIO),
        auto_augment_magnitude=max(1, round(DEIT_RANDAUGMENT_MAGNITUDE * scale)),
        auto_augment_prob=share,
        random_resized_crop_scale=min(1.0, 1.0 - (1.0 - crop) * scale),
        horizontal_flip=context.mirror_symmetric,
        random_erasing_prob=DEIT_RANDOM_ERASING * scale,
        mixup_prob=share,
        ema_decay=min(0.99996, max(0.9, 1.0 - 1.0 / horizon)),
    )
    if context.family == "vit-mpp":
        values.update(NO_CLASSES)
    return values


def recipe_flag_help(name: str, family: str = "vit") -> str | None:
    """The help of the flag of a setting whose default the recipes decide and state here (the learning rate, the
    warm-up, the label smoothing), worded from the recipes' own values; None for the other flags (whose help says
    "default: the recipe's")."""
    none, deit = RECIPE_NONE, static_recipe_values("deit", family)
    if name == "learning_rate":
        return (
            f"peak learning rate (default: the --recipe's: {none['learning_rate']:g} with none; deit: "
            f"{DEIT_LEARNING_RATE_PER_512:g} x global batch / 512 / the run's share of DeiT's {DEIT_EPOCHS} "
            f"epochs, at most {MAX_LEARNING_RATE_BOOST:g}x)"
        )
    if name == "warmup_ratio":
        return (
            f"share of the updates spent warming up (default: the --recipe's: {none['warmup_ratio']:g} with none; "
            f"deit: {DEIT_WARMUP_EPOCHS} of {DEIT_EPOCHS} epochs, at most {DEIT_MAX_WARMUP_RATIO:g} of the run)"
        )
    if name == "label_smoothing_factor":
        return (
            f"label smoothing of the training loss (default: the --recipe's: {none['label_smoothing_factor']:g} with "
            f"none, {deit['label_smoothing_factor']:g} with deit)"
        )
    return None


# The smallest feature map (side, in pixels) on which the recipe trains a convolutional network in bf16 on the CPU:
# torch's bf16 backward of transformers' ResNet sometimes gives non-finite gradients where its maps shrink to 1 x 1
# (BatchNorm over one value per image), e.g. on the 8 x 8 digits.
BF16_CPU_MIN_FEATURE_MAP = 2


def recipe_mixed_precision(
    recipe: str, device_type: str, sharded: bool, smallest_feature_map: int | None = None
) -> str | None:
    """The --mixed_precision of `recipe` on a `device_type` ("cpu", "cuda", ...) device, or None to leave it to
    Accelerate. DeiT trains under automatic mixed precision (fp16 autocast in its training engine); "deit" takes bf16
    autocast (no loss scaling) where the device multiplies bf16 natively, which shortens a training update on CPUs
    with AVX512-BF16 or AMX (`bench_small_data.py --time_precision` measures it; results/small_data_update_time.csv
    holds the rows). On CPUs without native bf16 products (AVX2) they are slow reference
    loops (`cpu_precision`): fp32 there. A convolutional network whose feature maps shrink below
    `BF16_CPU_MIN_FEATURE_MAP` (`smallest_feature_map`, the side in pixels) trains in fp32 on the CPU too, where bf16's
    backward is known to fail. Runs sharded by FSDP or DeepSpeed keep their own precision settings (None)."""
    if recipe != "deit" or sharded:
        return None
    if device_type == "cpu":
        from ..models.compat import cpu_has_native_bf16_products

        if smallest_feature_map is not None and smallest_feature_map < BF16_CPU_MIN_FEATURE_MAP:
            return "no"
        return "bf16" if cpu_has_native_bf16_products() else "no"
    if device_type == "cuda":
        import torch  # this module holds values only: torch where a device is asked about

        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    return None


def recipe_drop_path_rate(recipe: str, num_hidden_layers: int, epochs: float) -> float:
    """The stochastic-depth rate of `recipe` for a model of `num_hidden_layers` blocks: DeiT's 0.1 at 12 blocks,
    linear in depth, times the budget scale s ("none": 0)."""
    if recipe != "deit":
        return 0.0
    rate = DEIT_DROP_PATH_RATE * num_hidden_layers / DEIT_DROP_PATH_DEPTH * budget_scale(epochs)
    return round(min(rate, 0.5), 4)


def epochs_of_run(total_steps: int, steps_per_epoch: int) -> float:
    """Passes over the training data that `total_steps` updates make."""
    return total_steps / max(1, steps_per_epoch)


def updates_per_epoch(num_examples: int, per_device_batch: int, num_processes: int, accumulation: int) -> int:
    """Updates per pass over `num_examples` (full batches only, as the loop's loader)."""
    batches = num_examples // (per_device_batch * num_processes)
    return max(1, math.ceil(batches / accumulation))


__all__ = [
    "BF16_CPU_MIN_FEATURE_MAP",
    "RECIPE_NONE",
    "RecipeContext",
    "budget_scale",
    "budget_share",
    "epochs_of_run",
    "recipe_drop_path_rate",
    "recipe_flag_help",
    "recipe_mixed_precision",
    "run_recipe_values",
    "static_recipe_values",
    "updates_per_epoch",
]
