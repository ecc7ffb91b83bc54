"""The paper's hybrid ViT (sec. 3.1) with a convolutional stem (config `conv_stem_layers`, Xiao et al. 2021): parity
with timm's `VisionTransformer` + `HybridEmbed` on copied weights, the geometry checks, and what refuses it."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusForMaskedImageModeling
from hf_vit_plus.conversion.vit import state_dict_from_timm
from hf_vit_plus.models.configuration_vit_plus import conv_stem_grid

HYBRID = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=28,
              patch_size=7, num_channels=1, num_labels=4, conv_stem_layers=3, conv_stem_channels=8)  # fmt: skip


def hybrid(seed: int = 0, **overrides) -> ViTPlusForImageClassification:
    torch.manual_seed(seed)
    return ViTPlusForImageClassification(ViTPlusConfig(**{**HYBRID, **overrides}))


def test_the_stem_brings_the_image_to_the_patch_grid_and_the_default_has_none():
    model = hybrid().eval()
    embeddings = model.vit.embeddings.patch_embeddings
    convs = [m for m in embeddings.stem if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [8, 16, 32] and all(c.stride == (2, 2) for c in convs)
    assert embeddings.projection.kernel_size == (1, 1) and embeddings.projection.in_channels == 32
    assert model.vit.embeddings.position_embeddings.shape[1] == 16 + 1  # 28 px in 7 px patches: 4 x 4 tokens
    out = model(pixel_values=torch.randn(2, 1, 28, 28), output_hidden_states=True)
    assert out.hidden_states[0].shape == (2, 17, 32)
    plain = ViTPlusForImageClassification(ViTPlusConfig(**{**HYBRID, "conv_stem_layers": 0}))
    assert plain.vit.embeddings.patch_embeddings.stem is None
    assert not [name for name in plain.state_dict() if "stem" in name]
    assert [conv_stem_grid(28, n) for n in range(4)] == [28, 14, 7, 4]
    assert [conv_stem_grid(224, n) for n in (4, 5)] == [14, 7]


def test_the_hybrid_matches_timm_hybrid_embed_on_copied_weights():
    """The reference: timm's VisionTransformer whose patch embedding is its `HybridEmbed` (a CNN backbone, then a
    1 x 1 projection of its feature map), with the same stem as backbone; its weights, trained BatchNorm statistics
    included, copied by the project's timm converter (`state_dict_from_timm`) and the stem's keys."""
    timm_vit = pytest.importorskip("timm.models.vision_transformer")
    from timm.models.vision_transformer_hybrid import HybridEmbed

    ours = hybrid()
    backbone = nn.Sequential()
    for i, module in enumerate(ours.vit.embeddings.patch_embeddings.stem):
        backbone.add_module(str(i), type(module)(**_constructor_args(module)))
    torch.manual_seed(3)
    reference = timm_vit.VisionTransformer(
        img_size=28, patch_size=1, in_chans=1, num_classes=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0,
        embed_layer=partial(HybridEmbed, backbone=backbone),
    )  # fmt: skip
    nn.init.normal_(reference.head.weight, std=0.5)  # timm starts its head at zero: the logits would all agree
    with torch.no_grad():  # move the BatchNorm statistics away from their initial values
        reference.train()(torch.randn(16, 1, 28, 28) * 2 + 1)
    reference.eval()
    timm_state = reference.state_dict()
    state = state_dict_from_timm(timm_state, num_layers=2)
    prefix = "patch_embed.backbone."
    state.update({
        "vit.embeddings.patch_embeddings.stem." + key[len(prefix):]: value
        for key, value in timm_state.items()
        if key.startswith(prefix)
    })  # fmt: skip
    ours.load_state_dict(state, strict=True)
    ours.eval()
    pixels = torch.randn(3, 1, 28, 28)
    expected = reference(pixels)
    assert expected.std() > 0.1
    torch.testing.assert_close(ours(pixel_values=pixels).logits, expected, atol=1e-5, rtol=1e-4)


def _constructor_args(module: nn.Module) -> dict:
    if isinstance(module, nn.Conv2d):
        return dict(in_channels=module.in_channels, out_channels=module.out_channels, kernel_size=module.kernel_size,
                    stride=module.stride, padding=module.padding, bias=module.bias is not None)  # fmt: skip
    if isinstance(module, nn.BatchNorm2d):
        return dict(num_features=module.num_features)
    return {}


def test_interpolated_positions_follow_the_stem_grid():
    model = hybrid().eval()
    out = model(pixel_values=torch.randn(1, 1, 56, 56), interpolate_pos_encoding=True, output_hidden_states=True)
    assert out.hidden_states[0].shape[1] == 7 * 7 + 1  # 56 -> 28 -> 14 -> 7


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (dict(conv_stem_layers=2), r"conv_stem_layers`=2 brings the 28 x 28 image to a 7 x 7 feature map.*4 x 4 grid"),
        (dict(conv_stem_layers=4), r"conv_stem_layers=3 does"),
        (dict(conv_stem_layers=-1), r"conv_stem_layers"),
        (dict(conv_stem_channels=0), r"conv_stem_channels"),
    ],
)
def test_a_stem_that_misses_the_patch_grid_is_named(overrides, expected):
    with pytest.raises((ValueError, TypeError), match=expected):
        ViTPlusConfig(**{**HYBRID, **overrides})


def test_masked_patch_prediction_refuses_the_stem():
    with pytest.raises(ValueError, match="conv_stem_layers=3.*receptive fields"):
        ViTPlusForMaskedImageModeling(ViTPlusConfig(**HYBRID))


def test_a_saved_hybrid_loads_with_its_batchnorm_statistics(tmp_path):
    model = hybrid()
    model.train()
    with torch.no_grad():
        model(pixel_values=torch.randn(8, 1, 28, 28) + 3)
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = ViTPlusForImageClassification.from_pretrained(tmp_path).eval()
    stem, loaded_stem = model.vit.embeddings.patch_embeddings.stem, loaded.vit.embeddings.patch_embeddings.stem
    assert stem[1].num_batches_tracked.item() == 1
    torch.testing.assert_close(loaded_stem[1].running_mean, stem[1].running_mean)
    pixels = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(loaded(pixel_values=pixels).logits, model(pixel_values=pixels).logits)


def test_the_card_shows_the_stem_only_where_the_model_has_one(tmp_path):
    from hf_vit_plus.hub import write_model_card

    cards = {}
    for name, layers in (("hybrid", 3), ("plain", 0)):
        (tmp_path / name).mkdir()
        config = ViTPlusConfig(**{**HYBRID, "conv_stem_layers": layers})
        path = write_model_card(tmp_path / name, family="vit", model_config=config, training_args={"seed": 0},
                                eval_results={"accuracy": 0.9}, dataset_name="fashion-mnist")  # fmt: skip
        cards[name] = path.read_text()
    assert "| conv_stem_layers | 3 |" in cards["hybrid"] and "| conv_stem_channels | 8 |" in cards["hybrid"]
    assert "conv_stem" not in cards["plain"] and "| patch_size | 7 |" in cards["plain"]
