"""ONNX export (`hf_vit_plus.export`, `hf-vit-plus export onnx`) checked against the PyTorch models with onnxruntime:
ViT logits, the seq2seq encoder output and a greedy decoding loop through the exported decoder step, and the
Sparse Transformer LM (dense and sparse) prompt logits and greedy decoding, at batch sizes and lengths other than
the ones the graphs were traced at."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_vit_plus.models.compat import output_cache
from tests.conftest import MODEL_CASES

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

from hf_vit_plus.cli import main  # noqa: E402
from hf_vit_plus.export import (  # noqa: E402
    DECODER_FILE,
    ENCODER_FILE,
    LM_FILE,
    VIT_FILE,
    export_onnx,
)
from hf_vit_plus.serving import OnnxCausalLMGenerator, OnnxSeq2SeqGenerator  # noqa: E402

CASES = {case.id: case for case in MODEL_CASES}
# Larger initial weights than the defaults, so that greedy decoding of a random model varies its tokens; with seed 10
# the dense seq2seq model ends one row with EOS after two tokens (padded then) while the others go on.
SEQ2SEQ_INIT = {"init_std": 0.5}
LM_INIT = {"initializer_range": 0.5}
SEEDS = {"seq2seq-dense": 3}


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, folder) per case id, exported once for the module."""
    cache = {}

    def get(case_id: str):
        seed = SEEDS.get(case_id, 0)
        if (case_id, seed) not in cache:
            case = CASES[case_id]
            overrides = {"seq2seq": SEQ2SEQ_INIT, "sparse-lm": LM_INIT}.get(case.family, {})
            model = case.model(seed=seed, **overrides)
            if getattr(model, "final_logits_bias", None) is not None:  # Marian's output bias, zero at init
                torch.nn.init.normal_(model.final_logits_bias, std=0.5)
            folder = tmp_path_factory.mktemp(f"{case_id}-{seed}")
            kernel = model.config._attn_implementation
            export_onnx(model, folder)
            assert model.config._attn_implementation == kernel and not model.training  # left as it was
            cache[case_id, seed] = model, folder
        return cache[case_id, seed]

    return get


@pytest.mark.parametrize("case_id", ["vit-dense", "vit-fixed", "vit-distilled", "vit-hybrid"])
def test_vit_logits_match(exported, case_id):
    model, folder = exported(case_id)
    pixel_values = CASES[case_id].inputs(batch=5)["pixel_values"]  # traced at batch 2
    (logits,) = _session(folder / VIT_FILE).run(None, {"pixel_values": pixel_values.numpy()})
    with torch.no_grad():
        expected = model(pixel_values=pixel_values).logits
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4, rtol=1e-4)
    assert (folder / "config.json").is_file()


def _padded_source(case, batch: int = 3, length: int = 9, seed: int = 5):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, case.config().vocab_size, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    ids[1, -3:], mask[1, -3:] = case.config().pad_token_id, 0  # one right-padded source
    return ids, mask


@pytest.mark.parametrize("case_id", ["seq2seq-dense", "seq2seq-fixed"])
def test_seq2seq_encoder_output_and_cross_attention_cache_match(exported, case_id):
    model, folder = exported(case_id)
    ids, mask = _padded_source(CASES[case_id])
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    hidden, *cross = _session(folder / ENCODER_FILE).run(None, feed)
    with torch.no_grad():
        expected = model.get_encoder()(ids, attention_mask=mask).last_hidden_state
        # the cross-attention keys/values the model caches at the first decoding step
        start = torch.full((ids.shape[0], 1), model.config.decoder_start_token_id)
        cache = output_cache(model(input_ids=ids, attention_mask=mask, decoder_input_ids=start, use_cache=True))
    np.testing.assert_allclose(hidden, expected.numpy(), atol=1e-4, rtol=1e-4)
    assert len(cross) == 2 * model.config.decoder_layers
    for i, layer in enumerate(cache.cross_attention_cache.layers):
        np.testing.assert_allclose(cross[2 * i], layer.keys.numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(cross[2 * i + 1], layer.values.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case_id", ["seq2seq-dense", "seq2seq-fixed", "seq2seq-marian"])
def test_seq2seq_greedy_decoding_through_onnxruntime_equals_generate(exported, case_id):
    model, folder = exported(case_id)
    ids, mask = _padded_source(CASES[case_id])
    tokens = OnnxSeq2SeqGenerator(folder).generate(ids, mask, max_new_tokens=12)
    with torch.no_grad():
        expected = model.generate(input_ids=ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=12)
    assert tokens.tolist() == expected.tolist()
    assert len({tuple(row) for row in tokens.tolist()}) > 1  # the rows differ: the test can tell them apart
    if case_id == "seq2seq-dense":
        finished = [model.config.eos_token_id in row for row in tokens.tolist()]
        assert any(finished) and not all(finished)


def test_seq2seq_decoder_step_logits_match_the_model(exported):
    """Step by step: the ONNX decoder step on its own cache gives the model's logits for the same prefix."""
    model, folder = exported("seq2seq-dense")
    ids, mask = _padded_source(CASES["seq2seq-dense"], batch=2)
    encoder, decoder = _session(folder / ENCODER_FILE), _session(folder / DECODER_FILE)
    hidden, *cross = encoder.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    config = model.config
    heads = config.decoder_attention_heads
    past = [np.zeros((2, heads, 0, config.d_model // heads), np.float32)] * (2 * config.decoder_layers)
    prefix = torch.tensor([[config.decoder_start_token_id, 7, 11, 5]] * 2)
    for step in range(prefix.shape[1]):
        feed = {"decoder_input_ids": prefix[:, step : step + 1].numpy(), "encoder_attention_mask": mask.numpy()}
        feed["encoder_hidden_states"] = hidden
        for i in range(config.decoder_layers):
            feed[f"past_key.{i}"], feed[f"past_value.{i}"] = past[2 * i], past[2 * i + 1]
            feed[f"cross_key.{i}"], feed[f"cross_value.{i}"] = cross[2 * i], cross[2 * i + 1]
        names = {value.name for value in decoder.get_inputs()}
        logits, *past = decoder.run(None, {k: v for k, v in feed.items() if k in names})
        assert past[0].shape[2] == step + 1
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=prefix[:, : step + 1]).logits
        np.testing.assert_allclose(logits[:, 0], expected[:, -1].numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case_id", ["sparse-lm-dense", "sparse-lm-fixed-heads", "sparse-lm-strided-interleaved"])
def test_causal_lm_prompt_logits_and_greedy_decoding_match(exported, case_id):
    model, folder = exported(case_id)
    case = CASES[case_id]
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, case.config().vocab_size, (3, 13), generator=generator)
    mask = torch.ones_like(ids)
    ids[2, :4], mask[2, :4] = 0, 0  # one left-padded prompt

    session = _session(folder / LM_FILE)
    heads, layers = model.config.num_attention_heads, model.config.num_hidden_layers
    empty = np.zeros((3, heads, 0, model.config.hidden_size // heads), np.float32)
    feed = {"input_ids": ids[:2].numpy(), "attention_mask": mask[:2].numpy()}
    feed.update({f"past_{kind}.{i}": empty[:2] for i in range(layers) for kind in ("key", "value")})
    logits, *present = session.run(None, feed)
    with torch.no_grad():
        expected = model(input_ids=ids[:2]).logits
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4, rtol=1e-4)
    assert present[0].shape[2] == ids.shape[1]

    tokens = OnnxCausalLMGenerator(folder).generate(ids, mask, max_new_tokens=10)
    with torch.no_grad():
        reference = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1, max_new_tokens=10)
    assert tokens.tolist() == reference.tolist()


def test_export_refuses_other_models_and_quantized_weights(tmp_path):
    pytest.importorskip("torchao")
    from hf_vit_plus.quantization import quantize

    with pytest.raises(TypeError, match="ViTPlusModel"):
        export_onnx(CASES["vit-dense"].model(head=False), tmp_path)
    with pytest.raises(ValueError, match="torchao-quantized weights"):
        export_onnx(quantize(CASES["vit-dense"].model(), "int8-dynamic"), tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_length_fixed_while_tracing_is_an_error(tmp_path):
    """A model whose code turns a traced length into a Python number would give a graph that only runs at the
    example's shape; the exporter's check says so instead of writing it."""
    from hf_vit_plus.export import _export

    class ReadsLength(torch.nn.Module):
        def forward(self, x):
            return x * int(x.shape[1])

    with pytest.raises(RuntimeError, match=r"axis 1 \(length\) of input 'x' was fixed to 3"):
        _export(
            ReadsLength(),
            (torch.randn(2, 3),),
            tmp_path / "bad.onnx",
            ["x"],
            ["y"],
            {"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("length")}},
            {"x": {1: "length"}},
        )
    assert not (tmp_path / "bad.onnx").exists()


# ------------------------------------------------------------------------------------------------------ the CLI
def test_cli_exports_a_saved_vit_with_its_processor(tmp_path, capsys):
    from hf_vit_plus import ViTPlusImageProcessor

    case = CASES["vit-dense"]
    model = case.model()
    model.save_pretrained(tmp_path / "ckpt")
    ViTPlusImageProcessor.from_model_config(model.config).save_pretrained(tmp_path / "ckpt")
    assert main(["export", "onnx", str(tmp_path / "ckpt"), str(tmp_path / "onnx")]) == 0
    assert "model.onnx" in capsys.readouterr().out
    assert (tmp_path / "onnx" / "preprocessor_config.json").is_file()
    pixel_values = case.inputs(batch=3)["pixel_values"]
    (logits,) = _session(tmp_path / "onnx" / VIT_FILE).run(None, {"pixel_values": pixel_values.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(logits, model(pixel_values=pixel_values).logits.numpy(), atol=1e-4, rtol=1e-4)


def test_cli_user_errors_are_one_line(tmp_path, capsys):
    from transformers import ViTConfig

    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        tmp_path / "hf_vit"
    )
    (tmp_path / "file").write_text("x")
    cases = [
        ([str(tmp_path / "missing"), str(tmp_path / "out")], "does not exist"),
        ([str(tmp_path / "hf_vit"), str(tmp_path / "out")], "'vit' model"),
        ([str(tmp_path / "hf_vit"), str(tmp_path / "file")], "is a file"),
    ]
    for argv, message in cases:
        capsys.readouterr()
        assert main(["export", "onnx", *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hf-vit-plus export onnx: error: "), lines
        assert message in lines[0], lines


def test_export_only_writes_files_and_its_old_serving_names_still_resolve():
    """The decoders and the translator moved to `hf_vit_plus.serving`; `hf_vit_plus.export.Translator` and the
    onnxruntime decoders still resolve there (the same objects), and unknown names still raise AttributeError."""
    import hf_vit_plus.export as export
    import hf_vit_plus.serving as serving

    for name in ("Translator", "TRANSLATION_ENGINES", "OnnxSeq2SeqGenerator", "OnnxCausalLMGenerator"):
        assert getattr(export, name) is getattr(serving, name)
        assert name not in export.__all__ and name in serving.__all__
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        export.Nope  # noqa: B018
