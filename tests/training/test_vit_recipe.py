"""The ViT's data-efficient training (issue 26) through the Accelerate loop: `--recipe deit` (augmentation, Mixup /
CutMix, label smoothing, stochastic depth, the weights' EMA), DeiT's hard distillation from a CNN teacher trained by
the same loop (`--model_type resnet`, `--teacher`), masked patch prediction (`train vit-mpp`) and its fine-tuning,
and the built-in labelled Fashion-MNIST. Tiny models, few updates: these check the wiring; the README's table the
learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_vit_plus.errors import UsageError
from hf_vit_plus.training.args import family_arguments
from hf_vit_plus.training.augment import BatchMixer, image_augmentation, soft_cross_entropy
from hf_vit_plus.training.distillation import PixelFormat, convert_pixels
from hf_vit_plus.training.ema import ModelEma
from hf_vit_plus.training.loop import train
from hf_vit_plus.training.outputs import card_hyperparameters
from hf_vit_plus.training.recipes import (
    RecipeContext,
    budget_scale,
    budget_share,
    recipe_drop_path_rate,
    recipe_mixed_precision,
    run_recipe_values,
)
from tests.utils import TINY_VIT_OVERRIDES, run_report

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


def tiny(tmp_path: Path, name: str, family: str = "vit", **overrides):
    values = dict(
        output_dir=str(tmp_path / name),
        config_overrides=TINY_VIT_OVERRIDES,
        report_to="none",
        write_card=False,
        max_train_samples=64,
        max_eval_samples=48,
        per_device_train_batch_size=16,
        save_steps="none",
        logging_steps=2,
        max_steps=4,
    )
    values.update(overrides)
    return family_arguments(family, **values)


# ------------------------------------------------------------------------------------------------ the recipe values
def plan_of(args):
    from hf_vit_plus.training.plan import preview_plan
    from hf_vit_plus.training.tasks import get_task

    return preview_plan(args, get_task(args.family))


def test_recipe_none_keeps_the_plain_training_of_release_0_1():
    args = family_arguments("vit", output_dir="unused")
    assert args.recipe == "none" and args.learning_rate is None  # the recipe decides, when the run is planned
    plan = plan_of(args)
    optimization, recipe = plan.optimization, plan.recipe
    assert (optimization.learning_rate, optimization.warmup_ratio, optimization.label_smoothing_factor) == (
        2e-3, 0.1, 0.0
    )  # fmt: skip
    assert recipe.auto_augment == "none" and recipe.mixup_alpha == 0.0 and recipe.ema_decay == 0.0
    assert not recipe.horizontal_flip and recipe.random_resized_crop_scale == 1.0
    assert plan.chosen_by["learning_rate"] == plan.chosen_by["ema_decay"] == "--recipe none"
    assert image_augmentation(recipe, (8, 8)) is None
    assert recipe_drop_path_rate("none", 12, 300) == 0.0


def test_deit_values_are_deits_at_300_epochs_and_scaled_down_for_short_runs():
    full = RecipeContext("vit", (224, 224), global_batch=1024, total_steps=300 * 1251, epochs=300,
                         mirror_symmetric=True)  # fmt: skip
    values = run_recipe_values("deit", full)
    assert values["learning_rate"] == pytest.approx(1e-3)  # 5e-4 x 1024 / 512
    assert values["label_smoothing_factor"] == 0.1 and values["mixup_alpha"] == 0.8 and values["cutmix_alpha"] == 1.0
    assert values["auto_augment"] == "randaugment" and values["auto_augment_magnitude"] == 27
    assert values["random_erasing_prob"] == pytest.approx(0.25) and values["mixup_prob"] == pytest.approx(1.0)
    assert values["random_resized_crop_scale"] == pytest.approx(0.08) and values["horizontal_flip"]
    assert values["ema_decay"] == pytest.approx(0.99996, abs=1e-6)
    assert values["auto_augment_prob"] == pytest.approx(1.0)
    assert recipe_drop_path_rate("deit", 12, 300) == pytest.approx(0.1)

    short = RecipeContext("vit", (28, 28), global_batch=128, total_steps=4690, epochs=10, mirror_symmetric=False)
    values = run_recipe_values("deit", short)
    share, scale = budget_share(10), budget_scale(10)
    assert share == pytest.approx(10 / 300) and scale == pytest.approx((10 / 300) ** 0.5)
    # DeiT's strongest regularisers grow with t, the mild ones with s (with s, RandAugment ran on every image: at 14
    # epochs it cost the Fashion-MNIST ViT a point)
    assert values["mixup_prob"] == pytest.approx(share) and values["auto_augment_prob"] == pytest.approx(share)
    assert values["auto_augment_magnitude"] == round(27 * scale)
    assert values["random_erasing_prob"] == pytest.approx(0.25 * scale)
    # the smallest crop, 16 x 16 px at 300 epochs, scaled like the other regularisers (it was (16 / 28) ** 2 = 0.33
    # here: crops that cut the sleeves and collars off Fashion-MNIST's clothes)
    assert values["random_resized_crop_scale"] == pytest.approx(1 - (1 - (16 / 28) ** 2) * scale)
    # DeiT's 5e-4 x 128 / 512 divided by t, at most plain training's 2e-3 at batch 128 (it was / s: 3.8e-4 at 32
    # epochs, where 2e-3 trained the best ViT)
    assert values["learning_rate"] == pytest.approx(2e-3)
    month = run_recipe_values("deit", RecipeContext("vit", (28, 28), 128, 15_000, 32, False))
    assert month["learning_rate"] == pytest.approx(5e-4 * 128 / 512 * 300 / 32)
    assert month["mixup_prob"] == pytest.approx(32 / 300) and month["auto_augment_prob"] == pytest.approx(32 / 300)
    tiny = run_recipe_values("deit", RecipeContext("vit", (28, 28), 128, 100, 0.2, False))
    assert tiny["learning_rate"] == pytest.approx(2e-3)
    assert not values["horizontal_flip"] and values["warmup_ratio"] == pytest.approx(0.05)
    assert 0.9 <= values["ema_decay"] < 0.99996
    # masked patch prediction has no classes to smooth or mix
    mpp = run_recipe_values("deit", RecipeContext("vit-mpp", (28, 28), 128, 4690, 10, True))
    assert mpp["mixup_alpha"] == mpp["cutmix_alpha"] == mpp["label_smoothing_factor"] == 0.0
    assert mpp["random_erasing_prob"] == 0.0


def test_explicit_flags_win_over_the_recipe(tmp_path):
    args = family_arguments("vit", output_dir="unused", recipe="deit", mixup_alpha=0.0, ema_decay=0.0,
                            learning_rate=1e-3, num_train_epochs=5)  # fmt: skip
    plan = plan_of(args)
    optimization, recipe = plan.optimization, plan.recipe
    assert optimization.learning_rate == 1e-3 and recipe.ema_decay == 0.0 and recipe.mixup_alpha == 0.0
    assert recipe.cutmix_alpha == 1.0 and optimization.label_smoothing_factor == 0.1  # the recipe's
    assert optimization.warmup_ratio == pytest.approx(0.05) and recipe.random_erasing_prob > 0
    assert plan.chosen_by["learning_rate"] == "--learning_rate" and plan.chosen_by["cutmix_alpha"] == "--recipe deit"
    assert plan.config_fields["drop_path_rate"] > 0 and plan.config_fields_from["drop_path_rate"] == "--recipe deit"
    result = train(tiny(tmp_path, "explicit", recipe="deit", ema_decay=0.0, max_steps=2))
    assert not any(key.startswith("online_") for key in result.eval_metrics)  # no EMA: one set of metrics


def test_the_card_records_the_recipe_the_run_resolved(tmp_path):
    """The card's hyperparameter table shows what `--recipe deit` decided for the run (it showed only the optimiser's
    values, and --num_train_epochs' default where --max_steps decided the length); a family without the image recipe
    shows none of it."""
    train(tiny(tmp_path, "card", recipe="deit", mixup_alpha=0.0, write_card=True, max_steps=2))
    card = (tmp_path / "card" / "README.md").read_text()
    for row in ("| recipe | deit |", "| auto_augment | randaugment |", "| mixup_alpha | 0 |", "| max_steps | 2 |"):
        assert row in card, row
    for name in ("auto_augment_prob", "random_resized_crop_scale", "random_erasing_prob", "mixup_prob", "ema_decay"):
        assert f"| {name} | " in card, name
    assert "| num_train_epochs |" not in card  # the row (the learning check may name the flag in its advice)
    seq2seq = card_hyperparameters(plan_of(family_arguments("seq2seq", output_dir="unused", max_steps=3)))
    assert "recipe" not in seq2seq and "ema_decay" not in seq2seq and seq2seq["max_steps"] == 3


def test_deit_trains_under_bf16_autocast_where_bf16_products_are_native(monkeypatch):
    """DeiT trains under automatic mixed precision; "deit" takes bf16 where the device multiplies it natively (it ran
    fp32 everywhere: 1.3-1.8x slower updates on an AVX512-BF16 CPU), fp32 where bf16 products are reference loops
    (AVX2), and leaves sharded runs and other recipes to Accelerate."""
    from hf_vit_plus.models import compat

    monkeypatch.setattr(compat, "cpu_has_native_bf16_products", lambda: True)
    assert recipe_mixed_precision("deit", "cpu", sharded=False) == "bf16"
    assert recipe_mixed_precision("deit", "cpu", sharded=True) is None  # FSDP / DeepSpeed: their own settings
    assert recipe_mixed_precision("none", "cpu", sharded=False) is None
    monkeypatch.setattr(compat, "cpu_has_native_bf16_products", lambda: False)
    assert recipe_mixed_precision("deit", "cpu", sharded=False) == "no"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert recipe_mixed_precision("deit", "cuda", sharded=False) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert recipe_mixed_precision("deit", "cuda", sharded=False) == "no"


def test_a_cnn_whose_maps_shrink_to_1x1_trains_in_fp32_on_the_cpu(monkeypatch):
    """bf16's backward of a CNN on 1 x 1 feature maps sometimes gives non-finite gradients on the CPU: fp32 there,
    native bf16 products or not; maps of 2 x 2 and more, and other devices, keep the recipe's choice."""
    from hf_vit_plus.models import compat

    monkeypatch.setattr(compat, "cpu_has_native_bf16_products", lambda: True)
    assert recipe_mixed_precision("deit", "cpu", sharded=False, smallest_feature_map=1) == "no"
    assert recipe_mixed_precision("deit", "cpu", sharded=False, smallest_feature_map=2) == "bf16"
    assert recipe_mixed_precision("deit", "cpu", sharded=True, smallest_feature_map=1) is None
    assert recipe_mixed_precision("none", "cpu", sharded=False, smallest_feature_map=1) is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert recipe_mixed_precision("deit", "cuda", sharded=False, smallest_feature_map=1) == "bf16"


@pytest.mark.parametrize(
    "flags, environ, native, expected",
    [
        (dict(recipe="deit"), {}, True, "bf16"),
        (dict(recipe="deit"), {}, False, "no"),
        (dict(recipe="deit", mixed_precision="no"), {}, True, "no"),  # the flag wins
        (dict(recipe="deit"), {"ACCELERATE_MIXED_PRECISION": "no"}, True, "no"),  # so does the launcher's config
        (dict(recipe="none"), {}, True, "no"),  # Accelerate's default
    ],
)
def test_the_run_trains_and_records_the_recipes_precision(tmp_path, monkeypatch, flags, environ, native, expected):
    from hf_vit_plus.models import compat

    monkeypatch.setattr(compat, "cpu_has_native_bf16_products", lambda: native)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with run_report() as report:
        train(tiny(tmp_path, "precision", write_card=True, max_steps=1, use_cpu=True, **flags))
    said = report.getvalue()  # the run's first lines say what is in effect
    assert ("bf16 autocast" in said) == (expected == "bf16")
    card = (tmp_path / "precision" / "README.md").read_text()
    assert f"| mixed_precision | {expected} |" in card  # the precision the run trained in, whoever chose it


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("recipe", "mae", "--recipe"),
        ("auto_augment", "autoaugment", "--auto_augment"),
        ("ema_decay", 1.5, "--ema_decay"),
        ("mixup_prob", -0.1, "--mixup_prob"),
        ("auto_augment_prob", 1.5, "--auto_augment_prob"),
        ("random_resized_crop_scale", 0.0, "--random_resized_crop_scale"),
    ],
)
def test_bad_recipe_values_are_named(flag, value, message):
    with pytest.raises(UsageError, match=message):
        family_arguments("vit", output_dir="unused", **{flag: value})


# ------------------------------------------------------------------------------------------------ the pieces
def test_mixing_gives_soft_targets_that_sum_to_one_and_the_loss_reads_them():
    torch.manual_seed(0)
    pixels, labels = torch.randn(8, 1, 8, 8), torch.arange(8) % 4
    mixed, targets = BatchMixer(4, mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0)(pixels, labels)
    assert targets.shape == (8, 4) and torch.allclose(targets.sum(-1), torch.ones(8))
    assert not torch.equal(mixed, pixels)
    same, one_hot = BatchMixer(4, mixup_alpha=0.8, prob=0.0)(pixels, labels)
    assert torch.equal(same, pixels) and torch.equal(one_hot.argmax(-1), labels)
    logits = torch.randn(8, 4)
    torch.testing.assert_close(soft_cross_entropy(logits, one_hot), torch.nn.functional.cross_entropy(logits, labels))


def test_the_ema_averages_after_each_update_and_round_trips_its_state():
    model = torch.nn.Linear(2, 2)
    ema = ModelEma(model, 0.9)
    before = ema.module.weight.clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    torch.testing.assert_close(ema.module.weight, before + 0.1)
    other = ModelEma(torch.nn.Linear(2, 2), 0.9)
    other.load_state_dict(ema.state_dict())
    torch.testing.assert_close(other.module.weight, ema.module.weight)
    with pytest.raises(ValueError, match="decay must be in \\(0, 1\\), got 1.0"):
        ModelEma(model, 1.0)


def test_a_teacher_reads_the_students_images_in_its_own_format():
    grey = PixelFormat(channels=1, mean=(0.5,), std=(0.5,))
    rgb = PixelFormat(channels=3, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), size=(16, 16))
    images = torch.rand(2, 1, 8, 8)
    converted = convert_pixels((images - 0.5) / 0.5, grey, rgb)
    assert converted.shape == (2, 3, 16, 16)
    back = converted * torch.tensor(rgb.std)[:, None, None] + torch.tensor(rgb.mean)[:, None, None]
    torch.testing.assert_close(back[:, 0], back[:, 2])  # the grey channel repeated
    assert convert_pixels(images, grey, grey) is images


# ------------------------------------------------------------------------------------------------ runs
def test_deit_recipe_trains_with_stochastic_depth_and_saves_the_ema_it_evaluated(tmp_path):
    result = train(tiny(tmp_path, "deit", recipe="deit", max_steps=6))
    config = json.loads((tmp_path / "deit" / "config.json").read_text())
    assert config["drop_path_rate"] > 0  # the recipe's, scaled to the depth and the run
    metrics = result.eval_metrics
    assert "online_accuracy" in metrics and "accuracy" in metrics  # the average, and the last weights beside it
    from transformers import AutoModelForImageClassification

    saved = AutoModelForImageClassification.from_pretrained(tmp_path / "deit")
    for name, value in saved.state_dict().items():  # the saved weights are the average's, not the last weights'
        torch.testing.assert_close(value, result.model.state_dict()[name], msg=name)
    losses = [entry["loss"] for entry in result.log_history if "loss" in entry]
    assert losses and all(torch.isfinite(torch.tensor(losses)))


def test_a_second_run_in_one_process_keeps_the_first_runs_precision(tmp_path, monkeypatch):
    """Accelerate's state is process-wide and refuses another precision once set: a `--recipe deit` run after a
    plain one in the same Python process (a teacher, then its student) stopped with "AcceleratorState has already
    been initialized" where the recipe chose bf16; it now trains in the first run's precision."""
    from hf_vit_plus.models import compat

    monkeypatch.setattr(compat, "cpu_has_native_bf16_products", lambda: True)
    train(tiny(tmp_path, "first", max_steps=1, use_cpu=True))  # --recipe none: Accelerate's default, fp32
    result = train(tiny(tmp_path, "second", recipe="deit", max_steps=1, use_cpu=True))
    assert result.global_step == 1


def test_distillation_from_a_cnn_trained_by_the_same_loop(tmp_path):
    teacher = train(tiny(tmp_path, "cnn", model_type="resnet", config_overrides="", max_steps=3))
    assert type(teacher.model).__name__ == "ResNetForImageClassification"
    result = train(tiny(tmp_path, "student", recipe="deit", teacher=str(tmp_path / "cnn"), max_steps=3))
    assert result.model.config.use_distillation_token
    assert {"cls_head_accuracy", "distillation_head_accuracy"} <= set(result.eval_metrics)
    # a teacher of other classes is refused by name
    (tmp_path / "wrong").mkdir()
    wrong = teacher.model.config
    wrong.num_labels, wrong.id2label = 3, {0: "a", 1: "b", 2: "c"}
    teacher.model.__class__(wrong).save_pretrained(tmp_path / "wrong")
    with pytest.raises(UsageError, match="--teacher .* predicts 3 classes"):
        train(tiny(tmp_path, "refused", teacher=str(tmp_path / "wrong"), max_steps=1))


def test_distillation_from_a_timm_teacher(tmp_path):
    """A timm CNN as the teacher: a `TimmWrapperForImageClassification` folder (here trained by the same loop with
    `--model_type timm_wrapper`, timm's resnet18 with one input channel, which `AutoModelForImageClassification`
    reopens) distils into a fresh student with the distillation token and both heads' accuracies."""
    from transformers import AutoModelForImageClassification

    teacher = train(tiny(tmp_path, "timm", model_type="timm_wrapper", config_overrides="", max_steps=2))
    assert type(teacher.model).__name__ == "TimmWrapperForImageClassification"
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path / "timm").eval()
    assert type(reloaded).__name__ == "TimmWrapperForImageClassification" and reloaded.config.num_labels == 10
    result = train(tiny(tmp_path, "student", recipe="deit", teacher=str(tmp_path / "timm"), max_steps=2))
    assert result.model.config.use_distillation_token
    assert {"cls_head_accuracy", "distillation_head_accuracy"} <= set(result.eval_metrics)


def test_masked_patch_prediction_then_fine_tuning(tmp_path):
    pre = train(tiny(tmp_path, "mpp", family="vit-mpp", max_steps=4))
    assert type(pre.model).__name__ == "ViTPlusForMaskedImageModeling"
    metrics = pre.eval_metrics
    assert 0.0 <= metrics["mpp_accuracy"] <= 1.0 and metrics["baseline_commonest_colour_accuracy"] > 0
    config = json.loads((tmp_path / "mpp" / "config.json").read_text())
    assert config["architectures"] == ["ViTPlusForMaskedImageModeling"]
    tuned = train(tiny(tmp_path, "tuned", model_name_or_path=str(tmp_path / "mpp"), config_overrides=None,
                       max_steps=2))  # fmt: skip
    assert type(tuned.model).__name__ == "ViTPlusForImageClassification"
    for name, value in pre.model.vit.state_dict().items():  # started from the pre-trained encoder
        if "mask_token" not in name:
            assert value.shape == tuned.model.vit.state_dict()[name].shape, name


def test_transformers_vit_trains_with_the_recipe(tmp_path):
    result = train(tiny(tmp_path, "hf-vit", model_type="vit", recipe="deit", max_steps=2))
    assert type(result.model).__name__ == "ViTForImageClassification"
    assert result.model.config.layer_norm_eps == 1e-6 and result.model.config.hidden_size == 32


def test_an_unknown_model_type_is_named(tmp_path):
    with pytest.raises(UsageError, match="--model_type 'bert' is not a transformers image classifier"):
        train(tiny(tmp_path, "bad", model_type="bert", config_overrides=""))


def test_fashion_mnist_is_built_in_labelled_data(tmp_path):
    from hf_vit_plus.data.images import labelled_image_datasets

    dataset = labelled_image_datasets()["fashion-mnist"]
    try:
        labels = dataset.load_labels("test")
    except FileNotFoundError:
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    assert labels.shape == (10_000,) and set(labels.tolist()) == set(range(10))
    result = train(tiny(tmp_path, "fashion", dataset_name="fashion-mnist", max_steps=2))
    assert result.model.config.image_size == 28 and result.model.config.num_labels == 10
    assert result.model.config.id2label[0] == dataset.class_names[0]
    assert result.eval_metrics["samples"] == 48


def test_a_run_with_the_ema_resumes_to_the_same_average(tmp_path):
    """The average is registered for checkpointing: a run stopped after 2 updates and resumed saves the same averaged
    weights as the uninterrupted run (recipe none: no random augmentation to replay)."""
    from safetensors.torch import load_file

    common = dict(ema_decay=0.9, max_steps=4, save_steps="100")
    full = train(tiny(tmp_path, "full", **common))
    stopped = train(tiny(tmp_path, "split", stop_after_steps=2, **common))
    assert stopped.interrupted and stopped.global_step == 2
    resumed = train(tiny(tmp_path, "split", resume_from_checkpoint="latest", **common))
    assert resumed.global_step == full.global_step == 4
    expected = load_file(tmp_path / "full" / "model.safetensors")
    got = load_file(tmp_path / "split" / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)
    assert resumed.eval_metrics["accuracy"] == full.eval_metrics["accuracy"]
    assert "online_accuracy" in resumed.eval_metrics


def test_a_convolutional_teacher_runs_channels_last_with_the_same_labels():
    """The teacher's CNN runs in channels-last layout (faster oneDNN convolutions); its labels are the model's own
    argmax on the converted pixels, whatever the layout."""
    from transformers import ResNetConfig, ResNetForImageClassification

    from hf_vit_plus.training.distillation import Teacher

    torch.manual_seed(0)
    config = ResNetConfig(num_channels=1, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10)
    model = ResNetForImageClassification(config).eval()
    images = torch.randn(32, 1, 28, 28)
    with torch.no_grad():
        expected = model(pixel_values=images).logits.argmax(-1)
    grey = PixelFormat(channels=1, mean=(0.5,), std=(0.5,))
    teacher = Teacher(model, grey, grey)
    assert teacher.channels_last
    assert model.resnet.embedder.embedder.convolution.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(teacher.labels(images), expected)
