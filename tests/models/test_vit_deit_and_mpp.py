"""What DeiT and the ViT paper's sec. 4.6 add to the ViTPlus model: stochastic depth (`drop_path_rate`), the
distillation token and its head (`use_distillation_token`), masked patch prediction (`ViTPlusForMaskedImageModeling`,
`corrupt_patches`, `patch_colour_classes`). Defaults keep the paper's model exactly."""

from __future__ import annotations

import pytest
import torch
import transformers

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusForMaskedImageModeling, corrupt_patches
from hf_vit_plus.models.config_checks import FieldTypeError
from hf_vit_plus.models.modeling_vit_plus import DropPath, drop_path_rate, patch_colour_classes

TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, image_size=16,
            patch_size=4, num_labels=5)  # fmt: skip


def model(cls=ViTPlusForImageClassification, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    m = cls(ViTPlusConfig(**{**TINY, **overrides}))
    for name in ("classifier", "distillation_classifier"):
        head = getattr(m, name, None)
        if isinstance(head, torch.nn.Linear):
            torch.nn.init.normal_(head.weight, std=0.5)
    return m.eval()


def pixels(batch: int = 3, channels: int = 3, size: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- defaults


def test_the_defaults_add_no_weights_and_no_token():
    plain = model()
    names = set(plain.state_dict())
    assert not [n for n in names if "distillation" in n or "mask_token" in n]
    assert plain.vit.embeddings.position_embeddings.shape[1] == (16 // 4) ** 2 + 1
    assert all(isinstance(layer.drop_path, torch.nn.Identity) for layer in plain.vit.layers)
    out = plain(pixel_values=pixels())
    assert out.cls_logits is None and out.distillation_logits is None
    assert len(out.to_tuple()) == 1  # return_dict=False gives what it gave: (logits,)


@pytest.mark.parametrize("head", ["linear", "mlp_tanh"])
def test_a_fresh_classifier_head_has_the_truncated_normal_init_and_a_saved_one_loads(head, tmp_path):
    """Every linear layer, the heads included, starts from the truncated normal of `initializer_range`: a zero head
    (the paper's fine-tuning head, sec. 3.2) would pass no gradient to the encoder at the first updates and slow the
    demo's training from scratch (the heads saved by version 0.1.0, commit ded34c8, were random too)."""
    torch.manual_seed(0)
    fresh = ViTPlusForImageClassification(ViTPlusConfig(**TINY, classifier_head=head))
    weight, std = fresh.classifier.weight, fresh.config.initializer_range
    assert not fresh.classifier.bias.any()
    assert 0.5 * std < weight.std().item() < 2 * std  # neither zero nor the random init of nn.Linear
    trained = model(classifier_head=head)
    trained.save_pretrained(tmp_path)
    loaded = ViTPlusForImageClassification.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded.classifier.weight, trained.classifier.weight)


def test_transformers_trainer_finds_the_labels_of_the_classifier_alone():
    """Regression: a forward argument named `*label*` (the teacher's classes were `distillation_labels`) is taken by
    transformers' Trainer as a label it needs: evaluation without it computed no metrics (no eval_accuracy)."""
    from transformers.utils import find_labels

    assert find_labels(ViTPlusForImageClassification) == ["labels"]
    assert find_labels(ViTPlusForMaskedImageModeling) == ["labels"]


# ---------------------------------------------------------------------------------------------- stochastic depth


def test_drop_path_rates_grow_linearly_over_depth_and_vanish_in_eval():
    config = ViTPlusConfig(**TINY, drop_path_rate=0.2)
    assert [drop_path_rate(config, i) for i in range(3)] == pytest.approx([0.0, 0.1, 0.2])
    dropped = model(drop_path_rate=0.2)
    assert isinstance(dropped.vit.layers[0].drop_path, torch.nn.Identity)
    assert [layer.drop_path.rate for layer in dropped.vit.layers[1:]] == pytest.approx([0.1, 0.2])
    plain = model()
    plain.load_state_dict(dropped.state_dict())
    torch.testing.assert_close(dropped(pixel_values=pixels()).logits, plain(pixel_values=pixels()).logits)


def test_drop_path_drops_whole_examples_and_keeps_the_expectation():
    torch.manual_seed(0)
    layer = DropPath(0.5).train()
    out = layer(torch.ones(4000, 3, 2))
    per_example = out.flatten(1)
    assert set(per_example.unique().tolist()) <= {0.0, 2.0}
    assert (per_example == per_example[:, :1]).all()  # one decision per example
    assert out.mean().item() == pytest.approx(1.0, abs=0.05)
    assert torch.equal(layer.eval()(torch.ones(3, 2)), torch.ones(3, 2))


# ---------------------------------------------------------------------------------------------- distillation


def test_the_distillation_token_has_its_own_head_and_inference_averages_the_two():
    student = model(use_distillation_token=True)
    assert student.vit.embeddings.position_embeddings.shape[1] == (16 // 4) ** 2 + 2
    out = student(pixel_values=pixels(), output_hidden_states=True)
    assert out.hidden_states[0].shape[1] == 16 + 2
    last = out.hidden_states[-1]
    normed = student.vit.layernorm(last)
    torch.testing.assert_close(out.cls_logits, student.classifier(normed[:, 0]))
    torch.testing.assert_close(out.distillation_logits, student.distillation_classifier(normed[:, 1]))
    torch.testing.assert_close(out.logits, (out.cls_logits + out.distillation_logits) / 2)
    # the distillation token and head are initialised as the class token and head
    fresh = ViTPlusForImageClassification(ViTPlusConfig(**TINY, use_distillation_token=True))
    assert fresh.distillation_classifier.weight.any() and fresh.vit.embeddings.distillation_token.any()


def test_hard_distillation_loss_is_the_mean_of_the_two_heads_cross_entropies():
    student = model(use_distillation_token=True)
    labels, teacher = torch.tensor([0, 1, 2]), torch.tensor([4, 1, 0])
    out = student(pixel_values=pixels(), labels=labels, teacher_classes=teacher)
    ce = torch.nn.functional.cross_entropy
    expected = (ce(out.cls_logits, labels) + ce(out.distillation_logits, teacher)) / 2
    torch.testing.assert_close(out.loss, expected)
    # without a teacher both heads learn the labels; without a token the class head learns both targets
    no_teacher = student(pixel_values=pixels(), labels=labels)
    torch.testing.assert_close(no_teacher.loss, (ce(out.cls_logits, labels) + ce(out.distillation_logits, labels)) / 2)
    plain = model()
    one_head = plain(pixel_values=pixels(), labels=labels, teacher_classes=teacher)
    torch.testing.assert_close(one_head.loss, (ce(one_head.logits, labels) + ce(one_head.logits, teacher)) / 2)
    with pytest.raises(ValueError, match="come with `labels`"):
        student(pixel_values=pixels(), teacher_classes=teacher)


def test_a_distilled_model_resamples_its_positions_keeping_both_tokens():
    student = model(use_distillation_token=True)
    out = student(pixel_values=pixels(size=24), interpolate_pos_encoding=True, output_hidden_states=True)
    assert out.hidden_states[0].shape[1] == 36 + 2 and torch.isfinite(out.logits).all()


def test_a_distilled_model_saves_and_loads_through_the_auto_class(tmp_path):
    student = model(use_distillation_token=True, drop_path_rate=0.1)
    student.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert loaded.config.use_distillation_token and loaded.config.drop_path_rate == 0.1
    torch.testing.assert_close(loaded(pixel_values=pixels()).logits, student(pixel_values=pixels()).logits)


# ---------------------------------------------------------------------------------------------- masked patches


def test_patch_colour_classes_are_3_bit_mean_colours():
    # [-1, 1] split into 8 bins per channel: -1 -> 0, 0.99 -> 7; R most significant: class = 64 r + 8 g + b
    image = torch.full((1, 3, 8, 8), -1.0)
    image[0, 0, :4, :4] = 0.99  # patch 0: red 7, green 0, blue 0
    image[0, 2, :4, 4:] = 0.0  # patch 1: blue = bin 4
    image[0, :, 4:, :4] = torch.tensor([-0.76, -0.24, 0.26]).view(3, 1, 1)  # bins 0, 3, 5 (width 0.25)
    classes = patch_colour_classes(image, 4, 3, (-1.0, 1.0))
    assert classes.tolist() == [[7 * 64, 4, 3 * 8 + 5, 0]]
    assert ViTPlusConfig(**TINY).mpp_num_classes == 512
    # grey: 2x2 patches of constant intensity, 8 bins of width 0.25
    grey = torch.tensor([[-1.0, -0.4], [0.3, 0.9]]).repeat_interleave(2, 0).repeat_interleave(2, 1)[None, None]
    assert patch_colour_classes(grey, 2, 3, (-1.0, 1.0)).tolist() == [[0, 2, 5, 7]]
    assert ViTPlusConfig(**TINY, num_channels=1).mpp_num_classes == 8


def test_corrupt_patches_follows_the_papers_recipe():
    config = ViTPlusConfig(**TINY)
    images = pixels(batch=400)
    inputs = corrupt_patches(images, config, generator=torch.Generator().manual_seed(0))
    corrupted = inputs["labels"] != -100
    assert corrupted.sum(1).tolist() == [8] * 400  # 50% of the 16 patches, in every image
    masked = inputs["bool_masked_pos"]
    assert not (masked & ~corrupted).any()
    assert masked.sum().item() / corrupted.sum().item() == pytest.approx(0.8, abs=0.03)
    # the labels are the clean image's colours
    clean = patch_colour_classes(images, 4, 3, (-1.0, 1.0))
    assert torch.equal(inputs["labels"][corrupted], clean[corrupted])
    # patches neither masked nor changed are kept (10%); the others were replaced by another patch's pixels
    patches = images.unfold(2, 4, 4).unfold(3, 4, 4).permute(0, 2, 3, 1, 4, 5).reshape(400, 16, -1)
    new = inputs["pixel_values"].unfold(2, 4, 4).unfold(3, 4, 4).permute(0, 2, 3, 1, 4, 5).reshape(400, 16, -1)
    changed = (patches != new).any(-1)
    assert not (changed & ~corrupted).any() and not (changed & masked).any()
    share = changed.sum().item() / corrupted.sum().item()
    assert share == pytest.approx(0.1, abs=0.03)
    pool = patches.reshape(-1, patches.shape[-1])
    for row in new[changed][:20]:
        assert (pool == row).all(-1).any()  # a patch of the batch
    # the same generator seed gives the same corruption
    again = corrupt_patches(images, config, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(inputs[k], again[k]) for k in inputs)


def test_masked_patch_prediction_loss_and_mask_token():
    mpp = model(ViTPlusForMaskedImageModeling)
    images = pixels()
    inputs = corrupt_patches(images, mpp.config, generator=torch.Generator().manual_seed(3))
    out = mpp(**inputs)
    assert out.logits.shape == (3, 16, 512)
    scored = inputs["labels"] != -100
    expected = torch.nn.functional.cross_entropy(out.logits[scored], inputs["labels"][scored])
    torch.testing.assert_close(out.loss, expected)
    # the [mask] embedding replaces exactly the masked patches' embeddings
    embeddings = mpp.vit.embeddings
    masked = inputs["bool_masked_pos"]
    with torch.no_grad():
        got = embeddings(images, bool_masked_pos=masked)[:, 1:]
        plain = embeddings(images)[:, 1:]
    positions = embeddings.position_embeddings[0, 1:]
    torch.testing.assert_close(got[masked], (embeddings.mask_token[0, 0] + positions.expand(3, -1, -1)[masked]))
    torch.testing.assert_close(got[~masked], plain[~masked])
    # without labels the targets are the masked patches' own colours; with neither there is no loss
    own = mpp(pixel_values=images, bool_masked_pos=masked)
    clean = patch_colour_classes(images, 4, 3, (-1.0, 1.0))
    torch.testing.assert_close(own.loss, torch.nn.functional.cross_entropy(own.logits[masked], clean[masked]))
    assert mpp(pixel_values=images).loss is None


def test_masked_patch_prediction_refuses_bad_labels_and_masks():
    mpp = model(ViTPlusForMaskedImageModeling)
    with pytest.raises(ValueError, match=r"shape \(batch, patches\) = \(3, 16\)"):
        mpp(pixel_values=pixels(), labels=torch.zeros(3, 15, dtype=torch.long))
    with pytest.raises(ValueError, match="outside \\[0, mpp_num_classes=512\\)"):
        mpp(pixel_values=pixels(), labels=torch.full((3, 16), 600))
    with pytest.raises(ValueError, match="integer colour classes"):
        mpp(pixel_values=pixels(), labels=torch.zeros(3, 16))
    with pytest.raises(ValueError, match=r"`bool_masked_pos` must have shape \(batch, patches\)"):
        mpp(pixel_values=pixels(), bool_masked_pos=torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs the \\[mask\\] embedding"):
        model().vit(pixel_values=pixels(), bool_masked_pos=torch.zeros(3, 16, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------- configs


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("drop_path_rate", 1.0, ValueError, "`drop_path_rate` must be a probability in \\[0, 1\\)"),
        ("drop_path_rate", float("nan"), ValueError, "`drop_path_rate`"),
        ("use_distillation_token", "yes", FieldTypeError, "`use_distillation_token` must be True or False"),
        ("mpp_mask_ratio", 0.0, ValueError, "`mpp_mask_ratio` must be in \\(0, 1\\)"),
        ("mpp_num_bits", 9, ValueError, "`mpp_num_bits` must be at most 8"),
        ("mpp_num_bits", 3.0, FieldTypeError, "`mpp_num_bits` must be a positive integer"),
        ("mpp_value_range", [1.0, -1.0], FieldTypeError, "`mpp_value_range` must be two finite numbers"),
        ("mpp_value_range", 1.0, FieldTypeError, "`mpp_value_range` must be two finite numbers"),
    ],
)
def test_bad_values_of_the_new_fields_are_named(field, value, error, message):
    with pytest.raises(error, match=message):
        ViTPlusConfig(**TINY, **{field: value})


def test_too_many_colour_classes_are_refused():
    with pytest.raises(ValueError, match="at most 24"):
        ViTPlusConfig(**TINY, num_channels=4, mpp_num_bits=8)
