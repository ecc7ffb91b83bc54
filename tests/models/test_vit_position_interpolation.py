"""`interpolate_pos_encoding=True` resamples the position embeddings as the converted model's source does:
timm's antialiased bicubic or transformers' plain bicubic (`ViTPlusConfig.position_interpolation`)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification
from hf_vit_plus.conversion import vit_plus_from_timm, vit_plus_from_transformers

SIZES = [(32, 32), (48, 48), (64, 64), (24, 24), (40, 56)]  # trained at 32 px: same, up, up, down, non-square


def _pixels(height: int, width: int) -> torch.Tensor:
    return torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(height * 1000 + width))


def _transformers_vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
        num_labels=6,
        layer_norm_eps=1e-6,
    )
    model = ViTForImageClassification(config).eval()
    with torch.no_grad():  # large, varied position embeddings make the interpolation visible in the logits
        model.vit.embeddings.position_embeddings.normal_(std=1.0)
        model.classifier.weight.normal_(std=0.5)
    return model


def _timm_vit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=48,
        depth=2,
        num_heads=3,
        num_classes=6,
        dynamic_img_size=True,  # timm resamples `pos_embed` on the fly with `resample_abs_pos_embed`
    )
    with torch.no_grad():
        model.pos_embed.normal_(std=1.0)
        model.head.weight.normal_(std=0.5)
    return model.eval()


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_transformers_conversion_matches_its_source_at_other_resolutions(height, width):
    reference = _transformers_vit()
    ours = vit_plus_from_transformers(reference)
    assert ours.config.position_interpolation == "bicubic"
    x = _pixels(height, width)
    with torch.no_grad():
        expected = reference(x, interpolate_pos_encoding=True).logits
        got = ours(x, interpolate_pos_encoding=True).logits
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_timm_conversion_matches_its_source_at_other_resolutions(height, width):
    reference = _timm_vit()
    ours = vit_plus_from_timm(reference)
    assert ours.config.position_interpolation == "bicubic_antialias"
    x = _pixels(height, width)
    with torch.no_grad():
        expected = reference(x)
        got = ours(x, interpolate_pos_encoding=True).logits
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_the_two_interpolations_differ_and_the_field_is_what_decides():
    """Guards the tests above against a vacuous pass: at 48 px the two resamplings give different logits."""
    reference = _transformers_vit()
    plain = vit_plus_from_transformers(reference)
    antialiased = vit_plus_from_transformers(reference, position_interpolation="bicubic_antialias")
    x = _pixels(48, 48)
    with torch.no_grad():
        diff = plain(x, interpolate_pos_encoding=True).logits - antialiased(x, interpolate_pos_encoding=True).logits
    assert diff.abs().max() > 1e-4


def test_position_interpolation_default_validation_and_round_trip(tmp_path):
    tiny = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=32)
    assert ViTPlusConfig(**tiny).position_interpolation == "bicubic_antialias"  # as in 0.1: old checkpoints unchanged
    with pytest.raises(ValueError, match=r"Unknown `position_interpolation` 'bilinear': expected one of"):
        ViTPlusConfig(**tiny, position_interpolation="bilinear")
    model = ViTPlusForImageClassification(ViTPlusConfig(**tiny, position_interpolation="bicubic"))
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).position_interpolation == "bicubic"
