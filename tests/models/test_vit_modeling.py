"""ViTPlus model tests in the style of transformers' ModelTesterMixin, plus parity with timm and transformers."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModel, AutoModelForImageClassification

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusModel
from hf_vit_plus.conversion import vit_plus_from_timm, vit_plus_from_transformers
from hf_vit_plus.models.compat import enable_activation_checkpointing

TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    image_size=32,
    patch_size=8,
    num_labels=5,
)


def tiny_config(**overrides) -> ViTPlusConfig:
    return ViTPlusConfig(**{**TINY, **overrides})


def tiny_model(attn_implementation: str = "eager", seed: int = 0, **overrides) -> ViTPlusForImageClassification:
    torch.manual_seed(seed)
    model = ViTPlusForImageClassification(tiny_config(**overrides))
    model.set_attn_implementation(attn_implementation)
    # The paper zero-initialises the fine-tuning head; give it weights so the logits carry information.
    torch.nn.init.normal_(model.classifier.weight, std=0.5)
    return model.eval()


def pixels(batch: int = 3, size: int = 32, channels: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------- parity


def _timm_vit(**kwargs):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=48,
        depth=3,
        num_heads=3,
        num_classes=7,
        **kwargs,
    )
    # timm zero-initialises its head; random weights make the comparison meaningful
    torch.nn.init.normal_(model.head.weight, std=0.5)
    return model.eval()


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_parity_with_timm(attn_implementation):
    reference = _timm_vit()
    ours = vit_plus_from_timm(reference)
    ours.set_attn_implementation(attn_implementation)
    x = pixels(4)
    with torch.no_grad():
        expected, got = reference(x), ours(x).logits
    assert ours.config.layer_norm_eps == 1e-6
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_parity_with_timm_at_higher_resolution(attn_implementation):
    reference = _timm_vit(dynamic_img_size=True)
    ours = vit_plus_from_timm(reference)
    ours.set_attn_implementation(attn_implementation)
    x = pixels(2, size=48)  # a 6x6 patch grid from the 4x4 the position embeddings were trained for
    with torch.no_grad():
        expected = reference(x)
        got = ours(x, interpolate_pos_encoding=True).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    with torch.no_grad():  # a non-square image too
        x = torch.randn(2, 3, 40, 56)
        torch.testing.assert_close(ours(x, interpolate_pos_encoding=True).logits, reference(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_parity_with_transformers_vit(attn_implementation):
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    reference_config = ViTConfig(
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
        num_labels=6,
        hidden_act="gelu",
    )
    reference = ViTForImageClassification(reference_config).eval()
    reference.set_attn_implementation(attn_implementation)
    ours = vit_plus_from_transformers(reference)
    ours.set_attn_implementation(attn_implementation)
    assert ours.config.layer_norm_eps == reference_config.layer_norm_eps
    assert ours.config.id2label == reference.config.id2label
    x = pixels(4)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).logits, reference(x).logits, atol=1e-5, rtol=0)


def test_converters_refuse_foreign_variants():
    with pytest.raises(ValueError, match="register tokens"):
        vit_plus_from_timm(_timm_vit(reg_tokens=4))
    with pytest.raises(ValueError, match="global_pool"):
        vit_plus_from_timm(_timm_vit(global_pool="avg", fc_norm=False))
    with pytest.raises(ValueError, match="ViTForImageClassification"):
        vit_plus_from_transformers(torch.nn.Linear(2, 2))


def test_base_patch16_parameter_count_matches_the_paper():
    config = ViTPlusConfig.from_preset("base-patch16-224", num_labels=1000)
    with torch.device("meta"):
        model = ViTPlusForImageClassification(config)
    assert sum(p.numel() for p in model.parameters()) == 86_567_656


def test_presets_follow_table_1():
    large = ViTPlusConfig.from_preset("large-patch16-384")
    assert (large.num_hidden_layers, large.hidden_size, large.intermediate_size, large.num_attention_heads) == (
        24,
        1024,
        4096,
        16,
    )
    assert large.image_size == 384 and large.num_patches == 576
    huge = ViTPlusConfig.from_preset("huge-patch14-224")
    assert (huge.num_hidden_layers, huge.hidden_size, huge.patch_size) == (32, 1280, 14)
    with pytest.raises(ValueError, match="Unknown ViT preset"):
        ViTPlusConfig.from_preset("gigantic-patch16-224")


# ----------------------------------------------------------------------------------------------- model tests


def test_save_load_round_trip_and_auto_classes(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    for name in ("modeling_vit_plus.py", "configuration_vit_plus.py", "attention.py", "positional.py"):
        assert (tmp_path / name).exists(), name
    x = pixels()
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(reloaded) is ViTPlusForImageClassification
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x).logits, model(x).logits, atol=0, rtol=0)
    base = AutoModel.from_pretrained(tmp_path).eval()  # the body of a head checkpoint (base_model_prefix "vit")
    assert type(base) is ViTPlusModel
    with torch.no_grad():
        torch.testing.assert_close(base(x).pooler_output, model.vit(x).pooler_output, atol=1e-6, rtol=0)


def test_determinism_and_batching_equivalence():
    model = tiny_model()
    x = pixels(4)
    with torch.no_grad():
        first, second = model(x).logits, model(x).logits
        singles = torch.cat([model(x[i : i + 1]).logits for i in range(4)])
    torch.testing.assert_close(first, second, atol=0, rtol=0)
    torch.testing.assert_close(singles, first, atol=1e-5, rtol=0)


def _count_sdpa_calls(monkeypatch) -> list:
    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    return calls


# (image size, patch size): 17 tokens (up to SHORT_CPU_SEQUENCE keys the CPU runs the reference even when sdpa is
# asked for) and 145 tokens (sdpa's kernel runs; the classifier's last block asks with the class token alone)
@pytest.mark.parametrize(("size", "patch", "sdpa_runs"), [(32, 8, False), (48, 4, True)])
def test_eager_equals_sdpa(monkeypatch, size, patch, sdpa_runs):
    eager = tiny_model("eager", image_size=size, patch_size=patch)
    sdpa = copy.deepcopy(eager)
    sdpa.set_attn_implementation("sdpa")
    x = pixels(size=size)
    calls = _count_sdpa_calls(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(x).logits, eager(x).logits, atol=1e-5, rtol=0)
    queries = [shape[2] for shape in calls]  # one call a block where sdpa's kernel runs
    assert queries == ([(size // patch) ** 2 + 1, 1] if sdpa_runs else [])


def test_short_sequences_train_with_the_reference_kernel_on_cpu(monkeypatch):
    """sdpa's CPU kernel trains a small image's tokens several times slower than the reference
    (bench_vit.py --attention_lengths): a ViT asked for sdpa trains 17 tokens without calling it, with the same
    gradients as the eager model."""
    eager = tiny_model("eager").train()
    sdpa = copy.deepcopy(eager)
    sdpa.set_attn_implementation("sdpa")
    calls = _count_sdpa_calls(monkeypatch)
    x, labels = pixels(4), torch.tensor([0, 1, 2, 3])
    for model in (eager, sdpa):
        model(x, labels=labels).loss.backward()
    assert calls == []
    for (name, a), b in zip(eager.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=0, msg=name)


def test_flex_attention_inference_matches_eager():
    if not hasattr(torch.nn.attention, "flex_attention"):
        pytest.skip("this torch has no flex_attention")
    eager = tiny_model("eager")
    flex = copy.deepcopy(eager)
    flex.set_attn_implementation("flex_attention")
    x = pixels(2)
    with torch.no_grad():
        torch.testing.assert_close(flex(x).logits, eager(x).logits, atol=1e-4, rtol=0)


def test_attention_and_hidden_state_outputs():
    model = tiny_model("sdpa")
    x = pixels(2)
    out = model(x, output_attentions=True, output_hidden_states=True)
    tokens = (32 // 8) ** 2 + 1
    assert len(out.attentions) == 2 and len(out.hidden_states) == 3
    assert out.attentions[0].shape == (2, 4, tokens, tokens)
    torch.testing.assert_close(out.attentions[1].sum(-1), torch.ones(2, 4, tokens))
    assert all(h.shape == (2, tokens, 32) for h in out.hidden_states)
    # hidden_states[-1] is the last block's output, before the final LayerNorm
    torch.testing.assert_close(model.vit.layernorm(out.hidden_states[-1])[:, 0], model.vit(x).pooler_output)
    plain = model(x)
    assert plain.attentions is None and plain.hidden_states is None
    as_tuple = model(x, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], plain.logits)


@pytest.mark.parametrize("distillation", [False, True])
def test_the_classifier_computes_the_last_block_for_the_tokens_its_heads_read(distillation):
    """The heads read the class (and distillation) token: the last block's queries, attention output and MLP run
    for those tokens alone, with the logits, loss and gradients of the whole computation (which asking for the
    hidden states gives)."""
    model = tiny_model("sdpa", num_hidden_layers=3, use_distillation_token=distillation).train()
    full = copy.deepcopy(model)
    x, labels = pixels(4), torch.tensor([0, 1, 2, 3])
    heads = 2 if distillation else 1
    outs = []
    for net, output_hidden_states, tokens in ((model, False, heads), (full, True, (32 // 8) ** 2 + heads)):
        seen = []
        hook = net.vit.layers[-1].mlp.register_forward_hook(
            lambda module, args, out, seen=seen: seen.append(args[0].shape[1])
        )
        out = net(x, labels=labels, output_hidden_states=output_hidden_states)
        out.loss.backward()
        hook.remove()
        assert seen == [tokens]
        outs.append(out)
    torch.testing.assert_close(outs[0].logits, outs[1].logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(outs[0].loss, outs[1].loss, atol=1e-6, rtol=0)
    # gradients summed over every token in another order: float32 rounding of about 1e-5 of the largest gradient
    # (a token left out would differ by the token's whole share)
    for (name, a), b in zip(full.named_parameters(), model.parameters()):
        scale = a.grad.abs().max().item()
        torch.testing.assert_close(
            b.grad, a.grad, atol=3e-5 * max(scale, 1.0), rtol=0, msg=lambda text, name=name: f"{name}: {text}"
        )
    # the bare encoder: every token unless asked, the first tokens' outputs when asked
    with torch.no_grad():
        every = model.vit(x).last_hidden_state
        first = model.vit(x, output_tokens=heads).last_hidden_state
    assert every.shape[1] == (32 // 8) ** 2 + heads and first.shape[1] == heads
    torch.testing.assert_close(first, every[:, :heads], atol=1e-6, rtol=0)


@pytest.mark.parametrize("bad", [0, -1, "1", 1.0, True])
def test_a_bad_number_of_output_tokens_is_named(bad):
    with pytest.raises(ValueError, match="output_tokens"):
        tiny_model().vit(pixels(1), output_tokens=bad)


def test_mlp_tanh_pretraining_head():
    model = tiny_model(classifier_head="mlp_tanh", classifier_hidden_size=24)
    assert isinstance(model.pre_logits[1], torch.nn.Tanh) and model.pre_logits[0].out_features == 24
    assert model(pixels()).logits.shape == (3, 5)


def test_training_step_gives_finite_gradients_and_learns():
    model = tiny_model().train()
    x, labels = pixels(8), torch.arange(8) % 5
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(15):
        loss = model(x, labels=labels).loss
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_activation_checkpointing_gives_the_same_gradients():
    reference = tiny_model(hidden_dropout_prob=0.0).train()
    checkpointed = copy.deepcopy(reference)
    enable_activation_checkpointing(checkpointed, {"use_reentrant": False})
    assert any(getattr(module, "gradient_checkpointing", False) for module in checkpointed.modules())
    x, labels = pixels(4), torch.tensor([0, 1, 2, 3])
    reference(x, labels=labels).loss.backward()
    checkpointed(x, labels=labels).loss.backward()
    for (name, p), q in zip(reference.named_parameters(), checkpointed.parameters()):
        assert q.grad is not None and torch.isfinite(q.grad).all(), name
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=0, msg=name)


def test_no_split_modules_and_dtype():
    model = tiny_model()
    assert set(model._no_split_modules) == {"ViTPlusEmbeddings", "ViTPlusLayer"}
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    assert bf16(pixels()).logits.dtype == torch.bfloat16  # float32 pixels are cast to the weights' dtype


# ----------------------------------------------------------------------------------------------- bad input


def test_wrong_image_size_and_channels_are_clear_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"Input image size \(48x48\) does not match the model \(32x32\)"):
        model(pixels(size=48))
    with pytest.raises(ValueError, match="has 1 channels but the model expects num_channels=3"):
        model(pixels(channels=1))
    with pytest.raises(ValueError, match=r"has 2 channels but the model expects num_channels=1 \(or 3, converted"):
        tiny_model(num_channels=1)(pixels(channels=2))
    with pytest.raises(ValueError, match="multiple of patch_size=8"):
        model(pixels(size=36), interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match=r"shape \(batch, channels, height, width\)"):
        model(torch.randn(3, 32, 32))
    with pytest.raises(TypeError, match="floating-point"):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


def test_labels_outside_num_labels_are_clear_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"Label 7 is outside \[0, num_labels=5\)"):
        model(pixels(), labels=torch.tensor([0, 7, 1]))
    with pytest.raises(ValueError, match="Label -3"):
        model(pixels(), labels=torch.tensor([0, -3, 1]))
    with pytest.raises(ValueError, match="Got 2 labels for a batch of 3"):
        model(pixels(), labels=torch.tensor([0, 1]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 30}, r"`hidden_size` \(30\) must be divisible by `num_attention_heads` \(4\)"),
        ({"image_size": 30}, r"`image_size` \(30\) must be divisible by `patch_size` \(8\)"),
        ({"patch_size": 0}, "`patch_size` must be a positive integer, got 0"),
        ({"hidden_act": "swishy"}, "'swishy' is not a known activation"),
        ({"hidden_dropout_prob": 1.5}, "probability"),
        ({"classifier_head": "deep"}, "Unknown `classifier_head` 'deep': expected one of"),
    ],
)
def test_inconsistent_configs_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_missing_or_corrupt_weights_are_clear_errors(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "ok")
    missing = tmp_path / "missing"
    model.save_pretrained(missing)
    (missing / "model.safetensors").unlink()
    with pytest.raises(OSError, match="model.safetensors|weights"):
        AutoModelForImageClassification.from_pretrained(missing)
    corrupt = tmp_path / "corrupt"
    model.save_pretrained(corrupt)
    data = (corrupt / "model.safetensors").read_bytes()
    (corrupt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception, match=r"(?i)safetensors|incomplete|header|deserializ|corrupt"):
        AutoModelForImageClassification.from_pretrained(corrupt)


def test_a_grey_model_reads_rgb_input_as_its_luma():
    """transformers' image-classification scripts convert every image to RGB, then normalise it with the processor's
    mean and std (one value for a grey model, broadcast to the three channels): a 1-channel model (the digits model of
    `make demo`) raised "has 3 channels but the model expects num_channels=1". It reads them as their ITU-R 601-2
    luma, which is what its processor gives for the same image up to the processor's rounding to 8 bits."""
    import numpy as np
    from PIL import Image
    from torchvision.transforms import Compose, Normalize, ToTensor

    from hf_vit_plus import ViTPlusImageProcessor

    model = tiny_model(num_channels=1)
    torch.nn.init.normal_(model.classifier.weight, std=0.5)
    rgb = pixels()
    luma = 0.299 * rgb[:, :1] + 0.587 * rgb[:, 1:2] + 0.114 * rgb[:, 2:]
    with torch.no_grad():
        torch.testing.assert_close(model(rgb).logits, model(luma).logits, rtol=1e-5, atol=1e-5)
    processor = ViTPlusImageProcessor.from_model_config(model.config)
    image = Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8))
    # run_image_classification.py's validation transform (no resize: the image has the model's size)
    script = Compose([ToTensor(), Normalize(mean=processor.image_mean, std=processor.image_std)])
    with torch.no_grad():
        from_script = model(script(image.convert("RGB"))[None]).logits
        from_processor = model(**processor(images=image, return_tensors="pt")).logits
    # logits of about 6: the processor rounds the luma to 8 bits (2/255 after normalising), the model does not
    torch.testing.assert_close(from_script, from_processor, rtol=0, atol=0.02)
