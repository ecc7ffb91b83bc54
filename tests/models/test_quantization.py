"""int8 with torchao (`hf_vit_plus.quantization.quantize`) over every family variant of the common matrix: each
`nn.Linear` is quantized, outputs stay close to fp32, generation runs, saving is refused with a clear message and
re-quantizing after loading gives the same model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.conftest import MODEL_CASES

pytest.importorskip("torchao")
from torchao.quantization import Int8Tensor  # noqa: E402

from hf_vit_plus.quantization import SCHEMES, quantize  # noqa: E402

CASE_IDS = [case.id for case in MODEL_CASES]
GENERATIVE = [case for case in MODEL_CASES if case.generative]


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("case", MODEL_CASES, ids=CASE_IDS)
def test_quantize_every_linear_and_stay_close(case, scheme):
    model = case.model()
    inputs = case.inputs()
    pixels = slice(0, 256) if case.family == "image-lm" else slice(None)  # the start token's logit is -inf
    expected = _logits(model, inputs)[..., pixels]
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]

    assert quantize(model, scheme) is model
    for name in linears:
        weight = model.get_submodule(name).weight
        assert type(weight) is Int8Tensor, name
        assert weight.qdata.dtype == torch.int8
        # dynamic: activations are quantized too (the tensor carries their settings); weight-only: they are not
        assert (weight.act_quant_kwargs is not None) == (scheme == "int8-dynamic"), name
    assert not [m for m in model.modules() if isinstance(m, nn.Embedding) and type(m.weight) is Int8Tensor]

    got = _logits(model, inputs)[..., pixels]
    assert expected.abs().max() > 0.1
    # int8 per-row weights (and activations): close to fp32 relative to the logits' scale
    assert (got - expected).abs().max() <= 0.05 * expected.abs().max(), (got - expected).abs().max()


@pytest.mark.parametrize("case", MODEL_CASES, ids=CASE_IDS)
def test_dynamic_int8_layers_multiply_many_rows_in_blocks_with_the_same_numbers(case, monkeypatch):
    """On the CPU a dynamic-int8 layer multiplies at most CPU_INT8_DYNAMIC_ROWS rows at a time (large inputs fell
    out of cache in eager mode): each row is quantized on its own, so blocks of 3 rows give the logits of one block."""
    from hf_vit_plus import quantization

    model = quantize(case.model(), "int8-dynamic")
    inputs = case.inputs()
    blocked = [m for m in model.modules() if isinstance(m, quantization.RowBlockedLinear)]
    assert blocked and all(isinstance(m, nn.Linear) for m in blocked)
    assert len(blocked) == sum(isinstance(m, nn.Linear) for m in model.modules())
    whole = _logits(model, inputs)
    calls = []
    monkeypatch.setattr(quantization, "CPU_INT8_DYNAMIC_ROWS", 3)
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, *a: calls.append(x[..., 0].numel()) or real(x, *a))
    assert torch.equal(_logits(model, inputs), whole)
    assert calls and max(calls) <= 3
    weight_only = quantize(case.model(), "int8-weight-only")
    assert not any(isinstance(m, quantization.RowBlockedLinear) for m in weight_only.modules())


@pytest.mark.parametrize("case", GENERATIVE, ids=[case.id for case in GENERATIVE])
def test_quantized_model_generates(case):
    model = quantize(case.model(), "int8-dynamic")
    inputs = case.inputs()
    inputs.pop("decoder_input_ids", None)
    if case.family == "image-lm":  # images are drawn from the start token
        inputs = {"input_ids": torch.full((2, 1), case.config().bos_token_id)}
    for kwargs in (dict(num_beams=1, do_sample=False), dict(num_beams=3, do_sample=False)):
        out = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, **kwargs)
        prompt = 1 if case.family == "seq2seq" else inputs["input_ids"].shape[1]
        assert out.shape == (inputs["input_ids"].shape[0], prompt + 5)
        assert 0 <= int(out.min()) and int(out.max()) < model.config.vocab_size


def test_tied_output_projection_gets_its_own_int8_copy():
    case = next(c for c in MODEL_CASES if c.id == "seq2seq-dense")
    model = case.model()
    assert model.lm_head.weight is model.get_input_embeddings().weight
    embedding_before = model.get_input_embeddings().weight.detach().clone()
    quantize(model, "int8-dynamic")
    assert type(model.lm_head.weight) is Int8Tensor
    assert type(model.get_input_embeddings().weight) is nn.Parameter  # the lookup keeps the float matrix
    assert torch.equal(model.get_input_embeddings().weight, embedding_before)


def test_quantize_rejects_bad_input():
    case = MODEL_CASES[0]
    with pytest.raises(ValueError, match=r"'int4'.*'int8-dynamic', 'int8-weight-only'"):
        quantize(case.model(), "int4")
    with pytest.raises(TypeError, match="dict"):
        quantize({"weight": torch.zeros(2)}, "int8-dynamic")
    with pytest.raises(ValueError, match="no nn.Linear"):
        quantize(nn.Sequential(nn.ReLU()), "int8-dynamic")
    model = quantize(case.model(), "int8-dynamic")
    with pytest.raises(ValueError, match="already quantized"):
        quantize(model, "int8-weight-only")


@pytest.mark.parametrize("case_id", ["vit-dense", "seq2seq-dense", "sparse-lm-fixed-merged"])
def test_save_is_refused_and_requantizing_after_load_restores_the_model(case_id, tmp_path):
    case = next(c for c in MODEL_CASES if c.id == case_id)
    model = case.model()
    model.save_pretrained(tmp_path / "float")
    quantized = quantize(copy.deepcopy(model), "int8-dynamic")
    with pytest.raises(ValueError, match="quantize\\(model, scheme\\) again after from_pretrained"):
        quantized.save_pretrained(tmp_path / "int8")
    with pytest.raises(ValueError, match="cannot be saved"):
        copy.deepcopy(quantized).save_pretrained(tmp_path / "int8")
    with pytest.raises(ValueError, match="cannot be saved"):
        quantized.push_to_hub("user/int8-model")  # refused before any request
    assert not (tmp_path / "int8").exists()

    reloaded = quantize(case.head_class.from_pretrained(tmp_path / "float").eval(), "int8-dynamic")
    inputs = case.inputs()
    torch.testing.assert_close(_logits(reloaded, inputs), _logits(quantized, inputs), rtol=0, atol=0)


@pytest.mark.parametrize("case_id", ["vit-dense", "seq2seq-dense"])
def test_transformers_torchao_config_route_loads_and_saves(case_id, tmp_path):
    """The serialisable alternative that the docs point to: transformers quantizes on load and saves torchao's
    flattened tensors; its output projection stays float."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig
    from transformers import TorchAoConfig

    case = next(c for c in MODEL_CASES if c.id == case_id)
    model = case.model()
    model.save_pretrained(tmp_path / "float")
    loaded = case.head_class.from_pretrained(
        tmp_path / "float", quantization_config=TorchAoConfig(Int8DynamicActivationInt8WeightConfig())
    ).eval()
    assert type(loaded.get_submodule(_first_linear(loaded)).weight) is Int8Tensor
    loaded.save_pretrained(tmp_path / "int8")
    again = case.head_class.from_pretrained(tmp_path / "int8").eval()
    assert type(again.get_submodule(_first_linear(again)).weight) is Int8Tensor
    inputs = case.inputs()
    torch.testing.assert_close(_logits(again, inputs), _logits(loaded, inputs), rtol=0, atol=0)


def _first_linear(model) -> str:
    return next(name for name, module in model.named_modules() if isinstance(module, nn.Linear))


FBGEMM_CASES = ["vit-dense", "seq2seq-dense", "image-lm-dense"]


@pytest.mark.parametrize("case_id", FBGEMM_CASES)
def test_fbgemm_path_gives_the_vnni_paths_logits_within_int8_rounding(case_id, monkeypatch):
    """Without int8 dot-product instructions (AVX2 alone, or a cap below VNNI) "int8-dynamic" runs FBGEMM's dynamic
    int8 linear (`FbgemmInt8Linear`): int8 weights per row, activations per tensor: the logits of fp32 within the
    tolerance above, and of the torchao (VNNI) path within int8 rounding of both."""
    from hf_vit_plus import quantization

    case = next(c for c in MODEL_CASES if c.id == case_id)
    model, inputs = case.model(), case.inputs()
    pixels = slice(0, 256) if case.family == "image-lm" else slice(None)
    expected = _logits(model, inputs)[..., pixels]
    vnni = _logits(quantize(copy.deepcopy(model), "int8-dynamic"), inputs)[..., pixels]
    monkeypatch.setattr(quantization, "dynamic_int8_backend", lambda: "fbgemm")
    fbgemm = quantize(copy.deepcopy(model), "int8-dynamic")
    linears = [m for m in fbgemm.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is quantization.FbgemmInt8Linear for m in linears)
    assert all(m.weight.dtype == torch.qint8 and quantization.is_quantized_weight(m.weight) for m in linears)
    got = _logits(fbgemm, inputs)[..., pixels]
    scale = expected.abs().max()
    assert (got - expected).abs().max() <= 0.05 * scale, (got - expected).abs().max()
    assert (got - vnni).abs().max() <= 0.05 * scale, (got - vnni).abs().max()
    with pytest.raises(ValueError, match="already quantized"):
        quantize(fbgemm, "int8-dynamic")
    with pytest.raises(ValueError, match="cannot be saved"):
        fbgemm.save_pretrained("unused")
    torch.testing.assert_close(_logits(copy.deepcopy(fbgemm), inputs)[..., pixels], got, rtol=0, atol=0)
    if case.family == "seq2seq":  # the tied output projection gets its own int8 copy; the lookup stays float
        assert fbgemm.lm_head.weight.dtype == torch.qint8
        assert type(fbgemm.get_input_embeddings().weight) is nn.Parameter


def test_a_cap_below_vnni_chooses_the_fbgemm_path_with_the_same_logits(tmp_path):
    """Under `capped_environment("avx2")` (set before torch loads, in a fresh process) `quantize` takes the FBGEMM
    path, whose AVX2 kernels give the logits of its widest ones (FBGEMM_ENABLE_INSTRUCTIONS caps them)."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from hf_vit_plus.models.cpu_isa import capped_environment, supported_isa
    from tests.utils import REPO_ROOT

    if supported_isa() == "generic":
        pytest.skip("the CPU has no AVX2 to cap at")
    script = (
        "import sys, torch\n"
        "from safetensors.torch import save_file\n"
        "from hf_vit_plus import quantization\n"
        "from tests.conftest import MODEL_CASES\n"
        "case = next(c for c in MODEL_CASES if c.id == 'vit-dense')\n"
        "model = quantization.quantize(case.model(), 'int8-dynamic')\n"
        "with torch.no_grad():\n"
        "    logits = model(**case.inputs()).logits\n"
        "save_file({'logits': logits.contiguous()}, sys.argv[1])\n"
        "first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))\n"
        "print(quantization.dynamic_int8_backend(), type(first).__name__)\n"
    )
    env = capped_environment("avx2", dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "capped.safetensors")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["fbgemm", "FbgemmInt8Linear"]
    from hf_vit_plus import quantization

    case = next(c for c in MODEL_CASES if c.id == "vit-dense")
    model = case.model()
    expected = _logits(model, case.inputs())
    for module in [m for m in model.modules() if isinstance(m, nn.Linear)]:
        quantization.FbgemmInt8Linear.from_float(module)
    widest = _logits(model, case.inputs())
    capped = load_file(tmp_path / "capped.safetensors")["logits"]
    torch.testing.assert_close(capped, widest, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
