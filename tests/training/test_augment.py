"""The batched augmentation of the image recipe (`hf_vit_plus.training.augment`) against torchvision's per-image
transforms: the same pixels for the same boxes and flips, the same distribution of boxes and erased rectangles, and
one call per batch from the built-in data sets (image by image it cost more than a small model's update)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Array2D, ClassLabel, Dataset, Features
from torchvision.transforms import RandomResizedCrop, v2
from torchvision.transforms.v2 import functional as F

from hf_vit_plus.training.augment import BatchAutoAugment, BatchErasing, ImageAugmentation, resized_crops
from hf_vit_plus.training.tasks import vit as vit_family


def torchvision_crops(pixels, boxes, size, flips):
    out = []
    for image, box, flip in zip(pixels, boxes.tolist(), flips.tolist()):
        image = F.resized_crop(image, *box, list(size), antialias=True)
        out.append(F.hflip(image) if flip else image)
    return torch.stack(out)


@pytest.mark.parametrize("shape", [(64, 1, 28, 28), (16, 3, 20, 30)])
def test_batched_crops_and_flips_are_torchvisions_image_by_image(shape):
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    size = shape[-2:]
    torch.manual_seed(1)
    augmentation = ImageAugmentation(size, crop_scale=0.2, horizontal_flip=True)
    boxes = augmentation.crop_boxes(shape[0], size)
    boxes[0] = torch.tensor([0, 0, size[0], size[1]])  # the whole image: resizing is the identity
    flips = torch.arange(shape[0]) % 2 == 0
    ours = resized_crops(pixels, boxes, size, flips)
    # float pixels: the same interpolation, to float rounding
    reference_float = torchvision_crops(pixels.float(), boxes, size, flips)
    assert torch.allclose(resized_crops(pixels.float(), boxes, size, flips), reference_float, atol=1e-3)
    # uint8: torchvision's fixed-point kernel rounds some pixels the other way, never by more than 1
    reference = torchvision_crops(pixels, boxes, size, flips)
    difference = (ours.int() - reference.int()).abs()
    assert difference.max() <= 1 and difference.float().mean() < 0.3
    assert torch.equal(ours[0], F.hflip(pixels[0]))
    assert ours.dtype == torch.uint8 and ours.shape == pixels.shape


def test_crop_boxes_are_drawn_as_torchvision_draws_them():
    torch.manual_seed(0)
    ours = ImageAugmentation((28, 28), crop_scale=0.3).crop_boxes(20_000, (28, 28)).double()
    image = torch.zeros(1, 28, 28)
    theirs = torch.tensor(
        [RandomResizedCrop.get_params(image, (0.3, 1.0), (3 / 4, 4 / 3)) for _ in range(5_000)], dtype=torch.float64
    )
    for boxes in (ours, theirs):
        top, left, height, width = boxes.unbind(1)
        assert bool(((top >= 0) & (left >= 0) & (top + height <= 28) & (left + width <= 28)).all())
    area = [(b[:, 2] * b[:, 3] / 784).mean().item() for b in (ours, theirs)]
    aspect = [torch.log(b[:, 3] / b[:, 2]).mean().item() for b in (ours, theirs)]
    centre = [(b[:, 0] + b[:, 2] / 2).mean().item() for b in (ours, theirs)]
    assert area[0] == pytest.approx(area[1], abs=0.01)
    assert aspect[0] == pytest.approx(aspect[1], abs=0.02)
    assert centre[0] == pytest.approx(centre[1], abs=0.2) and centre[0] == pytest.approx(14, abs=0.2)


def test_a_crop_that_cannot_fit_falls_back_to_torchvisions_central_crop():
    # a 10 x 40 image: no box of at least 90% of its area has an aspect ratio within (3/4, 4/3)
    boxes = ImageAugmentation((10, 40), crop_scale=0.9).crop_boxes(8, (10, 40))
    assert boxes.tolist() == [[0, 13, 10, 13]] * 8
    assert RandomResizedCrop.get_params(torch.zeros(1, 10, 40), (0.9, 1.0), (3 / 4, 4 / 3)) == (0, 13, 10, 13)


def test_batched_erasing_draws_torchvisions_rectangles():
    torch.manual_seed(0)
    ones = torch.ones(20_000, 1, 28, 28)
    erased = BatchErasing(1.0)(ones)
    share = (erased == 0).double().mean((1, 2, 3))
    reference = v2.RandomErasing(p=1.0, value=0.0)
    theirs = torch.stack([(reference(torch.ones(1, 28, 28)) == 0).double().mean() for _ in range(4_000)])
    assert share.mean().item() == pytest.approx(theirs.mean().item(), abs=0.01)
    assert (share > 0).double().mean().item() == pytest.approx((theirs > 0).double().mean().item(), abs=0.01)
    # each erased region is one rectangle
    for image in erased[:50, 0]:
        rows, columns = (image == 0).any(1), (image == 0).any(0)
        assert int((image == 0).sum()) == int(rows.sum()) * int(columns.sum())
    half = (BatchErasing(0.5)(ones) == 0).flatten(1).any(1).double().mean().item()
    assert half == pytest.approx(0.5, abs=0.02)
    assert torch.equal(BatchErasing(0.0)(ones), ones)


@pytest.mark.parametrize("bad", [0.0, 1.5])
def test_bad_crop_scales_are_named(bad):
    with pytest.raises(ValueError, match=f"crop_scale must be in \\(0, 1\\], got {bad}"):
        ImageAugmentation((28, 28), crop_scale=bad)


def test_the_automatic_augmentation_takes_a_share_of_the_images():
    """`auto_augment_prob` (the recipe's t on short runs): RandAugment on that share of the images, the others as they
    came (and at no cost); 1 augments every image, 0 none."""
    images = torch.randint(0, 256, (400, 1, 12, 12), dtype=torch.uint8)
    before, calls = images.clone(), []

    def mark(batch):  # a stand-in for RandAugment that leaves a visible mark
        calls.append(batch.shape[0])
        return 255 - batch

    torch.manual_seed(0)
    some = ImageAugmentation((12, 12), auto_augment="randaugment", auto_augment_prob=0.25)
    some.auto = mark
    out = some(images)
    changed = (out != images).flatten(1).any(1)
    assert torch.equal(out[changed], 255 - images[changed]) and torch.equal(out[~changed], images[~changed])
    assert calls == [int(changed.sum())] and 0.18 < changed.float().mean() < 0.32  # 100 of 400, in one call
    assert torch.equal(images, before)  # the input batch itself is untouched
    every = ImageAugmentation((12, 12), auto_augment="randaugment", auto_augment_prob=1.0)
    every.auto = mark
    assert torch.equal(every(images), 255 - images)
    none = ImageAugmentation((12, 12), auto_augment="randaugment", auto_augment_prob=0.0)
    assert not none.active and torch.equal(none(images), images)
    with pytest.raises(ValueError, match="auto_augment_prob must be in \\[0, 1\\], got 1.5"):
        ImageAugmentation((12, 12), auto_augment="randaugment", auto_augment_prob=1.5)


AUTO_AUGMENTS = {
    "randaugment-0": lambda: v2.RandAugment(num_ops=2, magnitude=0),
    "randaugment-9": lambda: v2.RandAugment(num_ops=2, magnitude=9),
    "randaugment-27": lambda: v2.RandAugment(num_ops=2, magnitude=27),
    "randaugment-3-ops": lambda: v2.RandAugment(num_ops=3, magnitude=30),
    "trivialaugment": lambda: v2.TrivialAugmentWide(),
}


@pytest.mark.parametrize("shape", [(300, 1, 28, 28), (60, 3, 20, 30)])
@pytest.mark.parametrize("name", list(AUTO_AUGMENTS))
def test_batched_auto_augment_is_torchvisions_image_by_image(shape, name):
    """The same seed, the same images as torchvision's transform called on each image in turn (every operation and
    both signs occur in a batch this size), and the generator left where torchvision leaves it."""
    pixels = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    transform = AUTO_AUGMENTS[name]()
    torch.manual_seed(1)
    expected = torch.stack([transform(image) for image in pixels])
    after_expected = torch.rand(4)
    torch.manual_seed(1)
    batched = BatchAutoAugment(transform)
    got = batched(pixels)
    assert batched.batched and torch.equal(got, expected)
    assert torch.equal(torch.rand(4), after_expected)
    assert not torch.equal(got, pixels)


def test_batched_auto_augment_runs_each_drawn_operation_once(monkeypatch):
    transform = v2.RandAugment(num_ops=2, magnitude=9)
    calls = []
    apply = transform._apply_image_or_video_transform

    def counting(images, name, magnitude, **kwargs):
        calls.append(images.shape[0])
        return apply(images, name, magnitude, **kwargs)

    monkeypatch.setattr(transform, "_apply_image_or_video_transform", counting)
    torch.manual_seed(0)
    pixels = torch.randint(0, 256, (128, 1, 28, 28), dtype=torch.uint8)
    BatchAutoAugment(transform)(pixels)
    # 2 slots of at most 22 groups each (14 operations, 9 with either sign, Identity not run): 256 calls image by image
    assert len(calls) <= 44 and 128 * 2 * 13 / 14 * 0.8 < sum(calls) <= 256


def test_batched_auto_augment_without_torchvisions_internals_runs_image_by_image(monkeypatch):
    with monkeypatch.context() as patch:  # a torchvision that renamed what `BatchAutoAugment` reads
        patch.delattr(v2.RandAugment, "_AUGMENTATION_SPACE")
        assert not BatchAutoAugment(v2.RandAugment()).batched
    pixels = torch.randint(0, 256, (20, 1, 12, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    transform = v2.RandAugment(num_ops=2, magnitude=9)
    image_by_image = BatchAutoAugment(transform)
    image_by_image.batched = False
    torch.manual_seed(3)
    expected = torch.stack([transform(image) for image in pixels])
    torch.manual_seed(3)
    assert torch.equal(image_by_image(pixels), expected)
    with pytest.raises(TypeError, match="expected v2.RandAugment or v2.TrivialAugmentWide, got AutoAugment"):
        BatchAutoAugment(v2.AutoAugment())


def test_the_recipe_augmentation_is_the_image_by_image_one_for_the_same_seed():
    """Crop, flip and RandAugment on a share of the images: the batch that the image-by-image RandAugment of the
    chosen images gave (the rows measured before it was batched train on the same images)."""
    pixels = torch.randint(0, 256, (128, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    augmentation = ImageAugmentation(
        (28, 28), crop_scale=0.8, horizontal_flip=True, auto_augment="randaugment", auto_augment_magnitude=12,
        auto_augment_prob=0.3,
    )  # fmt: skip
    torch.manual_seed(5)
    got = augmentation(pixels)
    torch.manual_seed(5)
    boxes = augmentation.crop_boxes(128, (28, 28))
    flips = torch.rand(128) < 0.5
    expected = resized_crops(pixels, boxes, (28, 28), flips)
    chosen = (torch.rand(128) < 0.3).nonzero()[:, 0]
    randaugment = v2.RandAugment(num_ops=2, magnitude=12)
    expected[chosen] = torch.stack([randaugment(expected[i]) for i in chosen.tolist()])
    assert 20 < len(chosen) < 60 and torch.equal(got, expected)


def test_augmentation_takes_uint8_batches():
    with pytest.raises(TypeError, match=r"expected uint8 images \(B, C, H, W\), got torch.float32"):
        ImageAugmentation((8, 8), horizontal_flip=True)(torch.zeros(2, 1, 8, 8))


def _array_split(count: int) -> Dataset:
    rng = np.random.default_rng(0)
    features = Features({"image": Array2D((28, 28), "uint8"), "label": ClassLabel(num_classes=10)})
    images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
    return Dataset.from_dict({"image": images, "label": rng.integers(0, 10, count)}, features=features)


def test_the_built_in_images_are_augmented_one_batch_at_a_time(monkeypatch):
    calls = []
    batched = vit_family.augmented_pixels

    def counting(pixels, *args):
        calls.append(pixels.shape[0])
        return batched(pixels, *args)

    monkeypatch.setattr(vit_family, "augmented_pixels", counting)
    mean, std = torch.tensor([0.5]).view(1, 1, 1), torch.tensor([0.5]).view(1, 1, 1)
    augmentation = ImageAugmentation((28, 28), crop_scale=0.8, horizontal_flip=True)
    data = vit_family.ArrayImages(
        _array_split(64), 1, (28, 28), mean, std, ("pixel_values", "labels"), augmentation, BatchErasing(0.25)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=16, collate_fn=vit_family.collate_images)
    batches = list(loader)
    assert calls == [16, 16, 16, 16]  # one call per batch (it was one per image)
    assert batches[0]["pixel_values"].shape == (16, 1, 28, 28) and batches[0]["labels"].shape == (16,)
    assert batches[0]["pixel_values"].abs().max() <= 1.0


def test_unaugmented_batches_equal_the_images_one_by_one():
    mean, std = torch.tensor([0.5]).view(1, 1, 1), torch.tensor([0.5]).view(1, 1, 1)
    split = _array_split(10)
    data = vit_family.ArrayImages(split, 1, (28, 28), mean, std, ("pixel_values", "labels"))
    batch = data.__getitems__([3, 7])
    for example, index in zip(batch, (3, 7)):
        image = torch.from_numpy(np.asarray(split[index]["image"], dtype=np.float32))[None]
        assert torch.allclose(example["pixel_values"], (image / 255 - 0.5) / 0.5)
        assert int(example["labels"]) == split[index]["label"]
    assert torch.equal(data[3]["pixel_values"], batch[0]["pixel_values"])
