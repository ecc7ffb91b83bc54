"""The Sparse Transformer as an image model: pixels as tokens, the shifted input, the loss per dimension, the Auto
classes with and without the package, and the errors for images the model cannot read."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM, SparseTransformerForImageGeneration
from hf_vit_plus.models.compat import enable_activation_checkpointing
from tests.utils import TINY_IMAGE_MODEL, random_pixels, run_without_package, tiny_image_model


def test_for_images_follows_the_paper_layout():
    config = SparseTransformerConfig.for_images(28, 28, hidden_size=64)
    assert config.vocab_size == 257 and config.bos_token_id == 256
    assert config.max_position_embeddings == 784 == config.pixels_per_image
    assert config.factorized_shape == [28, 28] and config.position_embedding_type == "factorized"
    assert config.attention_type == "strided" and config.sparse_stride == 28  # one row
    rgb = SparseTransformerConfig.for_images(4, 5, 3)
    assert rgb.factorized_shape == [4, 5, 3] and rgb.sparse_stride == 15 and rgb.max_position_embeddings == 60


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(image_size=[28, 28], num_channels=1, max_position_embeddings=700), "784"),
        (dict(image_size=[28], num_channels=1, max_position_embeddings=28), "image_size"),
        (dict(image_size=[2, 2], num_channels=0, max_position_embeddings=4), "num_channels"),
        (dict(image_size=[2, 2], num_channels=1, max_position_embeddings=4, bos_token_id=7), "bos_token_id"),
        (dict(num_channels=3), "image_size"),
    ],
)
def test_inconsistent_image_configs_are_refused(fields, message):
    base = dict(vocab_size=257, bos_token_id=256, eos_token_id=None, attention_type="dense")
    with pytest.raises(ValueError, match=message):
        SparseTransformerConfig(**{**base, **fields})


def _image_fields(config) -> tuple:
    return (config.image_size, config.num_channels, config.max_position_embeddings, config.factorized_shape,
            config.sparse_stride, config.sparse_summary_size)  # fmt: skip


def test_an_image_config_derives_its_positions_and_stride_again_when_its_size_changes(tmp_path):
    """The fields `for_images` derives from the size follow a size given to `from_pretrained` of a saved image
    config or to `update` (a saved config loads as saved); a stride set apart is kept, and refused by name where the
    new size cannot hold it."""
    from transformers import AutoConfig

    SparseTransformerConfig.for_images(8, 8, **TINY_IMAGE_MODEL).save_pretrained(tmp_path / "saved")
    assert _image_fields(AutoConfig.from_pretrained(tmp_path / "saved")) == ([8, 8], 1, 64, [8, 8], 8, 2)
    bigger = _image_fields(SparseTransformerConfig.for_images(16, 16, 3, **TINY_IMAGE_MODEL))
    assert _image_fields(AutoConfig.from_pretrained(tmp_path / "saved", image_size=[16, 16], num_channels=3)) == bigger
    updated = SparseTransformerConfig.for_images(8, 8, **TINY_IMAGE_MODEL)
    updated.update({"image_size": [16, 16], "num_channels": 3})
    assert _image_fields(updated) == bigger

    SparseTransformerConfig.for_images(8, 8, sparse_stride=4, **TINY_IMAGE_MODEL).save_pretrained(tmp_path / "own")
    assert _image_fields(AutoConfig.from_pretrained(tmp_path / "own", image_size=[16, 16]))[2:5] == (256, [16, 16], 4)
    with pytest.raises(ValueError, match=r"`sparse_stride` \(4\) is longer than the sequence"):
        AutoConfig.from_pretrained(tmp_path / "own", image_size=[1, 2])


def test_the_head_needs_an_image_config():
    with pytest.raises(ValueError, match="image_size"):
        SparseTransformerForImageGeneration(SparseTransformerConfig(attention_type="dense", **TINY_IMAGE_MODEL))


@pytest.mark.parametrize("attention_type", ["dense", "strided", "fixed"])
def test_pixel_loss_is_the_shifted_next_token_loss(attention_type):
    model = tiny_image_model(attention_type)
    pixels = random_pixels(3, 1, 6, 5)
    out = model(pixel_values=pixels)
    tokens = pixels.reshape(3, -1).long()
    # the same numbers through the causal LM's own interface: start token + all pixels, labels shifted inside
    full = torch.cat([torch.full((3, 1), 256), tokens], dim=1)
    lm = SparseTransformerForCausalLM(model.config).eval()
    lm.load_state_dict(model.state_dict())
    logits = lm(input_ids=full[:, :-1]).logits  # position t predicts pixel t
    reference = torch.nn.functional.cross_entropy(logits[..., :256].reshape(-1, 256), tokens.reshape(-1))
    torch.testing.assert_close(out.loss, reference, rtol=1e-5, atol=1e-6)
    assert out.logits.shape == (3, 30, 257)
    assert torch.isneginf(out.logits[..., 256]).all()  # the start token is never predicted
    assert abs(out.loss.item() - math.log(256)) < 0.1  # untrained: about uniform over 256 values


def test_colour_images_interleave_the_channels():
    model = tiny_image_model("dense", 2, 3, 3)
    pixels = random_pixels(2, 3, 2, 3)
    tokens = model.pixels_to_tokens(pixels)
    assert tokens[0, :3].tolist() == pixels[0, :, 0, 0].tolist()  # R, G, B of the first pixel
    assert tokens[0, 3:6].tolist() == pixels[0, :, 0, 1].tolist()
    assert torch.equal(model.tokens_to_pixels(tokens), pixels)


@pytest.mark.parametrize(
    "pixels, error, message",
    [
        (torch.rand(2, 1, 6, 5), TypeError, "integer intensities"),
        (torch.zeros(2, 1, 5, 6, dtype=torch.long), ValueError, r"\(batch, 1, 6, 5\)"),
        (torch.zeros(2, 3, 6, 5, dtype=torch.long), ValueError, "num_channels=1"),
        (torch.full((2, 6, 5), 300), ValueError, "300"),
        (torch.zeros(0, 6, 5, dtype=torch.long), ValueError, "empty"),
    ],
)
def test_bad_images_are_named(pixels, error, message):
    with pytest.raises(error, match=message):
        tiny_image_model("dense")(pixel_values=pixels)


def test_grey_images_may_omit_the_channel_axis():
    model = tiny_image_model("fixed")
    pixels = random_pixels(2, 1, 6, 5)
    torch.testing.assert_close(model(pixel_values=pixels[:, 0]).loss, model(pixel_values=pixels).loss)


@pytest.mark.parametrize("attention_type", ["dense", "strided", "fixed"])
def test_sampling_with_the_cache_equals_sampling_without(attention_type):
    model = tiny_image_model(attention_type)
    start = torch.full((3, 1), model.config.bos_token_id)
    drawn = {}
    for use_cache in (True, False):
        torch.manual_seed(7)
        drawn[use_cache] = model.generate(
            input_ids=start, max_new_tokens=30, do_sample=True, top_k=0, temperature=1.0, use_cache=use_cache
        )
    assert torch.equal(drawn[True], drawn[False])
    assert drawn[True].shape == (3, 31) and int(drawn[True][:, 1:].max()) < 256
    assert model.tokens_to_pixels(drawn[True][:, 1:]).shape == (3, 1, 6, 5)


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        model = tiny_image_model("strided").train()
        if checkpointing:
            enable_activation_checkpointing(model)
        model(pixel_values=random_pixels(2, 1, 6, 5)).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


def test_auto_class_loads_the_image_head_with_and_without_the_package(tmp_path):
    model = tiny_image_model("strided")
    pixels = random_pixels(2, 1, 6, 5)
    expected = model(pixel_values=pixels).loss.item()
    model.save_pretrained(tmp_path / "image")
    text = SparseTransformerForCausalLM(SparseTransformerConfig(attention_type="dense", **TINY_IMAGE_MODEL))
    text.save_pretrained(tmp_path / "text")
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "image")) is SparseTransformerForImageGeneration
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "text")) is SparseTransformerForCausalLM
    torch.save(pixels, tmp_path / "pixels.pt")
    code = f"""
    import json, torch
    from transformers import AutoModelForCausalLM
    try:
        AutoModelForCausalLM.from_pretrained({str(tmp_path / "image")!r})
        refused = False
    except ValueError:
        refused = True
    print()  # transformers' refusal leaves its "[y/N]" prompt without a newline
    model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "image")!r}, trust_remote_code=True)
    pixels = torch.load({str(tmp_path / "pixels.pt")!r}, weights_only=True)
    print(json.dumps(dict(refused=refused, cls=type(model).__name__, module=type(model).__module__,
                          loss=model(pixel_values=pixels).loss.item())))
    """
    result = run_without_package(code, cwd=tmp_path)
    assert result["refused"] and result["cls"] == "SparseTransformerForImageGeneration"
    assert not result["module"].startswith("hf_vit_plus")
    assert result["loss"] == pytest.approx(expected, abs=1e-6)
    saved = json.loads((tmp_path / "image" / "config.json").read_text())
    assert saved["image_size"] == [6, 5] and saved["num_channels"] == 1
