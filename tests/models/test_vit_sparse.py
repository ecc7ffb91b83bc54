"""Sparse Transformer attention (bidirectional strided / fixed patterns) as an option of the ViT."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification
from hf_vit_plus.models.attention import eager_attention_forward
from hf_vit_plus.models.sparse_layouts import mask_for_layer
from tests.utils import run_without_package

BASE = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    image_size=32,
    patch_size=4,  # an 8 x 8 grid: 65 tokens, not a multiple of the stride
    num_labels=3,
)


def sparse_vit(attention_type: str, mode: str = "merged", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = ViTPlusConfig(**{**BASE, "attention_type": attention_type, "sparse_pattern_mode": mode, **overrides})
    model = ViTPlusForImageClassification(config)
    torch.nn.init.normal_(model.classifier.weight, std=0.5)
    return model.eval()


@pytest.mark.parametrize("attention_type", ["strided", "fixed"])
@pytest.mark.parametrize("mode", ["merged", "interleaved", "heads"])
def test_fast_kernel_matches_the_masked_reference(attention_type, mode):
    fast = sparse_vit(attention_type, mode)
    assert fast.vit.layers[0].attention.sparse_pattern.causal is False
    reference = copy.deepcopy(fast)
    reference.set_attn_implementation("sparse_dense")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 2])
    fast_out, ref_out = fast(x, labels=labels), reference(x, labels=labels)
    torch.testing.assert_close(fast_out.logits, ref_out.logits, atol=1e-5, rtol=0)
    fast_out.loss.backward()
    ref_out.loss.backward()
    for (name, p), q in zip(fast.named_parameters(), reference.parameters()):
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("attention_type", ["strided", "fixed"])
def test_attention_equals_dense_attention_with_the_pattern_as_a_mask(attention_type):
    model = sparse_vit(attention_type, "interleaved")
    attention = model.vit.layers[1].attention
    hidden = torch.randn(2, 65, 32)
    got, _ = attention(hidden)
    q, k, v = (
        proj(hidden).view(2, 65, 4, 8).transpose(1, 2)
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj)
    )
    mask = mask_for_layer(attention.sparse_pattern, "interleaved", 1, 65, num_heads=4)  # (H, T, T) bool
    assert not mask.all() and mask.any(-1).all()  # sparse, and no query without keys
    expected, _ = eager_attention_forward(attention, q, k, v, mask[None], scaling=attention.scaling)
    expected = attention.o_proj(expected.reshape(2, 65, 32))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_attention_probabilities_respect_the_pattern_and_interpolation_works():
    model = sparse_vit("strided")
    x = torch.randn(1, 3, 32, 32)
    out = model(x, output_attentions=True)
    pattern = model.vit.layers[0].attention.sparse_pattern
    assert pattern.stride == 8  # default: patches per row
    mask = mask_for_layer(pattern, "merged", 0, 65, num_heads=4)
    assert out.attentions[0][0][~mask].abs().max() == 0
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(1, 4, 65))
    bigger = model(torch.randn(1, 3, 48, 48), interpolate_pos_encoding=True).logits
    assert bigger.shape == (1, 3) and torch.isfinite(bigger).all()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"attention_type": "lsh"}, "Unknown `attention_type` 'lsh'"),
        ({"attention_type": "strided", "sparse_stride": 200}, r"`sparse_stride` \(200\) is longer than the sequence"),
        ({"attention_type": "fixed", "sparse_stride": 8, "sparse_summary_size": 9}, "9"),
        ({"attention_type": "strided", "sparse_pattern_mode": "mixed"}, "mixed"),
        (
            {"attention_type": "strided", "sparse_pattern_mode": "heads", "num_attention_heads": 1, "hidden_size": 32},
            r"`num_attention_heads` \(1\) must be divisible",
        ),
    ],
)
def test_bad_sparse_configs_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        ViTPlusConfig(**{**BASE, **overrides})


def _sparse_fields(config) -> tuple:
    return config.image_size, config.patch_size, config.sparse_stride, config.sparse_summary_size


@pytest.mark.parametrize("attention_type", ["strided", "fixed"])
def test_the_sparse_defaults_are_derived_again_when_the_geometry_changes(attention_type, tmp_path):
    """`sparse_stride` (patches per row) and `sparse_summary_size` follow image_size and patch_size however they are
    given: to the config, to `from_preset`, to `from_pretrained` of a saved config, through `update`; a saved config
    loads to the values it was saved with."""
    from transformers import AutoConfig

    # 32 / 4: 8 patches per row; the summary size is the pattern's default for a stride of 8
    expected = _sparse_fields(ViTPlusConfig(image_size=32, patch_size=4, attention_type=attention_type))
    assert expected[:3] == (32, 4, 8)
    assert _sparse_fields(ViTPlusConfig.from_preset("base-patch16-224", attention_type=attention_type))[2] == 14
    preset = ViTPlusConfig.from_preset("tiny-patch16-224", attention_type=attention_type, image_size=32, patch_size=4)
    assert _sparse_fields(preset) == expected
    ViTPlusConfig.from_preset("tiny-patch16-224", attention_type=attention_type).save_pretrained(tmp_path / "saved")
    assert _sparse_fields(AutoConfig.from_pretrained(tmp_path / "saved"))[2] == 14  # as saved
    assert _sparse_fields(AutoConfig.from_pretrained(tmp_path / "saved", image_size=32, patch_size=4)) == expected
    updated = ViTPlusConfig(attention_type=attention_type)
    updated.update({"image_size": 32, "patch_size": 4})
    assert _sparse_fields(updated) == expected
    updated.save_pretrained(tmp_path / "updated")
    assert _sparse_fields(AutoConfig.from_pretrained(tmp_path / "updated")) == expected


def test_a_sparse_value_set_apart_from_its_default_is_kept_or_refused_by_name(tmp_path):
    """A stride the user set stays when the geometry changes (its summary size, left to its default, follows it);
    one the new geometry cannot hold is refused, naming it, on `from_pretrained` as on the config."""
    from transformers import AutoConfig

    config = ViTPlusConfig(attention_type="strided", sparse_stride=20)
    config.update({"image_size": 32, "patch_size": 4})
    assert _sparse_fields(config) == (
        32,
        4,
        20,
        ViTPlusConfig(attention_type="strided", sparse_stride=20).sparse_summary_size,
    )
    config.save_pretrained(tmp_path / "saved")
    assert _sparse_fields(AutoConfig.from_pretrained(tmp_path / "saved")) == _sparse_fields(config)
    with pytest.raises(ValueError, match=r"`sparse_stride` \(20\) is longer than the sequence"):
        AutoConfig.from_pretrained(tmp_path / "saved", image_size=8)  # 2 x 2 patches: 5 tokens
    fixed = ViTPlusConfig(image_size=32, patch_size=4, attention_type="fixed", sparse_stride=8, sparse_summary_size=8)
    fixed.save_pretrained(tmp_path / "fixed")
    with pytest.raises(ValueError, match=r"`sparse_summary_size`=8 and `sparse_stride`=4"):
        AutoConfig.from_pretrained(tmp_path / "fixed", sparse_stride=4)


def test_config_overrides_of_the_geometry_re_derive_the_sparse_fields(tmp_path):
    """`hf-vit-plus train vit --config_name FOLDER --config_overrides image_size=32,patch_size=4`: the run's config
    (built as the command builds it) has the sparse fields of a 32 / 4 config, not the saved 224 / 16 ones."""
    from hf_vit_plus.training.args import family_arguments
    from hf_vit_plus.training.tasks import get_task

    ViTPlusConfig.from_preset("tiny-patch16-224", attention_type="fixed").save_pretrained(tmp_path / "saved")
    args = family_arguments(
        "vit", output_dir=str(tmp_path / "run"), config_name=str(tmp_path / "saved"),
        config_overrides="image_size=32,patch_size=4",
    )  # fmt: skip
    task = get_task("vit")
    config = task.build_config(args, task.default_config(args), {})
    assert _sparse_fields(config) == _sparse_fields(ViTPlusConfig(image_size=32, patch_size=4, attention_type="fixed"))


def test_sparse_vit_loads_as_remote_code_without_the_package(tmp_path):
    model = sparse_vit("fixed", sparse_stride=16, sparse_summary_size=4)
    model.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "sparse_attention.py").exists() and (tmp_path / "ckpt" / "sparse_layouts.py").exists()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        expected = model(x).logits.tolist()
    result = run_without_package(
        f"""
        import json
        import torch
        from transformers import AutoModelForImageClassification
        model = AutoModelForImageClassification.from_pretrained({str(tmp_path / "ckpt")!r}, trust_remote_code=True)
        x = torch.load({str(tmp_path / "x.pt")!r}, weights_only=True)
        with torch.no_grad():
            logits = model.eval()(x).logits.tolist()
        kind = model.vit.layers[0].attention.sparse_pattern.kind
        print(json.dumps({{"logits": logits, "kind": kind, "module": type(model).__module__}}))
        """,
        cwd=tmp_path,
    )
    assert result["kind"] == "fixed" and result["module"].startswith("transformers_modules")
    np.testing.assert_allclose(result["logits"], expected, atol=1e-5)
