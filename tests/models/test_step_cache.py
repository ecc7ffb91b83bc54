"""FastDecoding's compiled steps serve every batch size of their class, are kept on disk and loaded by the next
process instead of compiled (`hf_vit_plus.models.step_cache`), and run without the rows that are finished.

One module fixture compiles (AOTInductor) two steps and the engine's encoder into a folder of this module: greedy for
batches of 5 rows or more, beam 4 for 2 sources or more, the encoder for 2 sources or more. Every other check reuses
them (batch sizes not seen before), loads them in a fresh process, or runs the same loop uncompiled
(`backend="eager"`), or checks the cache's mechanics on plain files.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from hf_vit_plus import Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.models import fast_decoding, step_cache
from hf_vit_plus.models.fast_decoding import FastDecoding, _batch_range
from tests.models.test_fast_decoding import _config, _reversal_batch, _train

GREEDY = dict(num_beams=1, max_new_tokens=12)
BEAM = dict(num_beams=4, max_new_tokens=12)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return _train(Seq2SeqTransformerForConditionalGeneration(_config()), steps=80)


@pytest.fixture(scope="module")
def sources():
    src, mask, _ = _reversal_batch(torch.Generator().manual_seed(5), batch=16)
    return src, mask


def _generate(model, src, mask, **settings):
    with torch.no_grad():
        return model.generate(src, attention_mask=mask, **settings)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, model, sources):
    """The model saved (for a second process), then its greedy step of 8 rows and beam step of 3 sources compiled
    into a fresh step cache, and the engine's encoder (`FastDecoding.generate`) for the 8 sources; the tokens of
    each, and the counts of compilations."""
    folder = tmp_path_factory.mktemp("steps")
    saved = tmp_path_factory.mktemp("model")
    model.save_pretrained(saved)
    fast = FastDecoding(step_cache=folder)
    src, mask = sources
    before = dict(fast_decoding.step_counts)
    greedy = _generate(model, src[:8], mask[:8], custom_generate=fast, **GREEDY)
    beam = _generate(model, src[:3], mask[:3], custom_generate=fast, **BEAM)
    engine = fast.generate(model, src[:8], attention_mask=mask[:8], **GREEDY)
    compiled = fast_decoding.step_counts["compiled"] - before.get("compiled", 0)
    return dict(fast=fast, folder=folder, saved=saved, greedy=greedy, beam=beam, engine=engine, compiled=compiled)


def test_one_compiled_step_serves_every_batch_size_and_source_length_of_its_class(model, sources, compiled):
    """Three compilations in all (greedy, beam, the encoder); batches of other sizes and other source lengths
    compile nothing and give generate's tokens, rows ending at different steps leaving the batch, with generate's
    encoder and with the engine's compiled one."""
    assert compiled["compiled"] == 3
    packages = sorted(path.name.startswith(step_cache.PACKAGE_PREFIX) for path in compiled["folder"].iterdir())
    assert packages == [1, 1, 1]
    fast, (src, mask) = compiled["fast"], sources
    counted = fast_decoding.step_counts["compiled"]
    assert torch.equal(compiled["greedy"], _generate(model, src[:8], mask[:8], **GREEDY))
    assert torch.equal(compiled["beam"], _generate(model, src[:3], mask[:3], **BEAM))
    assert torch.equal(compiled["engine"], compiled["greedy"])
    for size, cut in ((5, 8), (7, 6), (13, 8)):
        batch = (src[:size, :cut], mask[:size, :cut])
        expected = _generate(model, *batch, **GREEDY)
        assert torch.equal(_generate(*((model,) + batch), custom_generate=fast, **GREEDY), expected)
        assert torch.equal(fast.generate(model, batch[0], attention_mask=batch[1], **GREEDY), expected)
    for size, cut in ((2, 8), (5, 7)):
        batch = (src[:size, :cut], mask[:size, :cut])
        assert torch.equal(_generate(model, *batch, custom_generate=fast, **BEAM), _generate(model, *batch, **BEAM))
    assert fast_decoding.step_counts["compiled"] == counted
    assert fast.dropped_rows > 0


def test_expanded_start_tokens_decode_as_contiguous_ones(model, sources, compiled):
    """The loop's first tokens may come expanded from one start token (stride 0: `Translator` hands them so); the
    compiled step reads its inputs as contiguous ones, so the loop makes them so: the tokens are generate's (without
    it, rows past the first read memory beyond the one start token)."""
    fast, (src, mask) = compiled["fast"], sources

    def expanded(model, input_ids, *args, **kwargs):
        start = input_ids[:1, :1].clone().expand(input_ids.shape[0], 1)
        assert start.stride(0) == 0
        return fast(model, start, *args, **kwargs)

    batch = (src[:13], mask[:13])
    expected = _generate(model, *batch, **GREEDY)
    assert torch.equal(_generate(model, *batch, custom_generate=expanded, **GREEDY), expected)
    # a compiled graph handed an expanded input refuses it, in one line, instead of reading past its memory
    state, length = fast.decoding_state(model), src.shape[1]
    encoder = state.steps.encoder_runner(state.encoder, state.encoder.layers[0].kernel(length, "cpu"), length)
    ids = src[:1].expand(13, length)
    with pytest.raises(ValueError, match=r"strides \(0, 1\).*contiguous"):
        encoder(ids, torch.ones(13, 1, 1, length, dtype=torch.bool))


def test_the_compiled_encoder_computes_the_eager_encoders_states_after_the_same_checks(model, sources, compiled):
    """The engine's compiled encoder (batch and source length dynamic) gives the states of its eager layers, also
    for a batch of one source (its own class, compiled here) and a source of one token (the eager layers); a token
    id out of range is refused before the compiled call, with the model's own error."""
    fast, (src, mask) = compiled["fast"], sources
    state = fast.decoding_state(model)
    for size, cut in ((8, 8), (3, 5), (1, 6), (4, 1)):
        ids, real = src[:size, :cut], mask[:size, :cut]
        with torch.no_grad():
            eager = state.encoder(ids, real).last_hidden_state
            engine = state.encode(ids, real).last_hidden_state
        assert engine.shape == eager.shape
        torch.testing.assert_close(engine, eager, rtol=1e-5, atol=1e-5)
    bad = src[:8].clone()
    bad[0, 0] = model.config.vocab_size
    with pytest.raises(ValueError, match="input_ids"):
        state.encode(bad, mask[:8])


SECOND_PROCESS = """
import json, sys, torch, torch._inductor
from hf_vit_plus import Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.models import fast_decoding
from hf_vit_plus.models.fast_decoding import FastDecoding

calls = []
compile_and_package = torch._inductor.aoti_compile_and_package
def counted(*args, **kwargs):
    calls.append(1)
    return compile_and_package(*args, **kwargs)
torch._inductor.aoti_compile_and_package = counted

saved, folder, src, mask = sys.argv[1], sys.argv[2], *torch.load(sys.argv[3])
model = Seq2SeqTransformerForConditionalGeneration.from_pretrained(saved).eval()
fast = FastDecoding(step_cache=folder)
with torch.no_grad():
    greedy = model.generate(src[:8], attention_mask=mask[:8], custom_generate=fast, num_beams=1, max_new_tokens=12)
    beam = model.generate(src[:3], attention_mask=mask[:3], custom_generate=fast, num_beams=4, max_new_tokens=12)
    engine = fast.generate(model, src[:8], attention_mask=mask[:8], num_beams=1, max_new_tokens=12)
print(json.dumps(dict(calls=len(calls), counts=dict(fast_decoding.step_counts), greedy=greedy.tolist(),
                      beam=beam.tolist(), engine=engine.tolist())))
"""


def test_a_second_process_loads_the_compiled_steps_and_compiles_nothing(compiled, sources, tmp_path):
    """A fresh process with the same weights loads both steps and the encoder from the cache (no call into
    AOTInductor's compiler), says so in its first lines, and decodes the same tokens."""
    tensors = tmp_path / "sources.pt"
    torch.save(sources, tensors)
    script = tmp_path / "second.py"
    script.write_text(textwrap.dedent(SECOND_PROCESS))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "HF_HUB_OFFLINE": "1"}
    env["HF_VIT_PLUS_VERBOSITY"] = "info"
    run = subprocess.run(
        [sys.executable, str(script), str(compiled["saved"]), str(compiled["folder"]), str(tensors)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["calls"] == 0 and result["counts"] == {"loaded": 3}, result
    said = [line for line in run.stderr.splitlines() if "FastDecoding: " in line]
    assert len(said) == 3 and all("loaded the" in line and str(compiled["folder"]) in line for line in said), said
    assert result["greedy"] == compiled["greedy"].tolist()
    assert result["beam"] == compiled["beam"].tolist()
    assert result["engine"] == compiled["engine"].tolist()


@pytest.mark.parametrize("settings", [GREEDY, BEAM, dict(num_beams=3, num_return_sequences=2, length_penalty=0.6)])
def test_finished_rows_leave_the_batch_and_the_tokens_stay_those_of_generate(model, sources, settings):
    """Uncompiled (the same loop): a batch of 16 whose rows end at different steps decodes generate's tokens, with
    finished rows (greedy) and sources (beams) dropped, and the same without dropping."""
    src, mask = sources
    settings = {"max_new_tokens": 12, **settings}
    eager = _generate(model, src, mask, **settings)
    fast = FastDecoding(backend="eager")
    assert torch.equal(_generate(model, src, mask, custom_generate=fast, **settings), eager)
    assert fast.dropped_rows > 0
    whole = FastDecoding(backend="eager", drop_finished=False)
    assert torch.equal(_generate(model, src, mask, custom_generate=whole, **settings), eager)
    assert whole.dropped_rows == 0


def test_the_classes_of_batch_sizes():
    """Where the products change (one row, up to SMALL_ROWS, more) and where loops over fixed rows need one size."""
    assert [_batch_range(batch, 1) for batch in (1, 2, 4, 5, 64)] == [(1, 1), (2, 4), (2, 4), (5, None), (5, None)]
    assert [_batch_range(batch, 4) for batch in (1, 2, 9)] == [(1, 1), (2, None), (2, None)]
    assert [_batch_range(batch, 2) for batch in (1, 2, 3)] == [(1, 1), (2, 2), (3, None)]
    assert _batch_range(3, 1, static_small_rows=True) == (3, 3) and _batch_range(6, 1, True) == (5, None)


def _write_zip(path: str, payload: bytes = b"step") -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("step.bin", payload)


def _read_zip(path: str) -> bytes:
    with zipfile.ZipFile(path) as archive:
        return archive.read("step.bin")


def test_a_damaged_package_is_built_again_with_one_warning(tmp_path, caplog):
    path = tmp_path / "steps" / "step-x.pt2"
    built = []

    def build(target):
        built.append(target)
        _write_zip(target)

    assert step_cache.load_or_build(path, build, _read_zip) == (b"step", True)
    assert step_cache.load_or_build(path, build, _read_zip) == (b"step", False) and len(built) == 1
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a truncated file
    with caplog.at_level(logging.WARNING, logger=step_cache.__name__):
        assert step_cache.load_or_build(path, build, _read_zip) == (b"step", True)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == step_cache.__name__]
    assert len(warnings) == 1 and str(path) in warnings[0].getMessage() and len(built) == 2

    def unloadable(target):
        raise RuntimeError("an archive of another torch\nwith more lines")

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=step_cache.__name__):
        with pytest.raises(RuntimeError):
            step_cache.load_or_build(path, build, unloadable)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_a_build_that_fails_leaves_no_file_that_a_later_process_would_load(tmp_path):
    path = tmp_path / "step-y.pt2"

    def killed(target):
        Path(target).write_bytes(b"half a pack")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        step_cache.load_or_build(path, killed, _read_zip)
    assert list(tmp_path.iterdir()) == []


def test_the_key_follows_the_weights_the_instruction_set_and_the_threads(model, monkeypatch):
    digest = step_cache.weights_digest(model)
    parts = dict(method="greedy_step", shapes=((5, None), 1, 2), weights=digest)
    name = step_cache.step_key(**parts)
    assert name == step_cache.step_key(**parts) and name.startswith(step_cache.PACKAGE_PREFIX)
    monkeypatch.setattr(step_cache, "isa_label", lambda: "avx2")
    assert step_cache.step_key(**parts) != name
    monkeypatch.undo()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert step_cache.step_key(**parts) != name
    finally:
        torch.set_num_threads(threads)
    other = Seq2SeqTransformerForConditionalGeneration(model.config)
    other.load_state_dict(model.state_dict())
    assert step_cache.weights_digest(other) == digest
    with torch.no_grad():
        other.lm_head.weight[0, 0] += 1.0
    assert step_cache.weights_digest(other) != digest


def test_the_step_cache_follows_its_variable_else_the_kernel_cache():
    from hf_vit_plus.models.fast_kernels import kernel_cache_dir

    assert step_cache.step_cache_dir({"HF_VIT_PLUS_STEP_CACHE": "/s"}) == Path("/s")
    assert step_cache.step_cache_dir({"HF_HOME": "/hf"}) == kernel_cache_dir({"HF_HOME": "/hf"}) / "steps"
    with pytest.raises(TypeError, match="step_cache"):
        FastDecoding(step_cache=3)


def test_a_decoder_without_the_output_screen_does_not_share_the_screened_decoders_packages(model, tmp_path):
    """The screen's tensors are constants of the greedy step: a package built with them is not one that a decoder
    without them (screened_greedy=False) can load, so the two are kept apart."""
    from hf_vit_plus.models.fast_kernels import fbgemm_fp16_available

    if not fbgemm_fp16_available():
        pytest.skip("no output screen here: torch has no FBGEMM float16 linear")
    key = ("greedy_step", (), ((2, 4), 1, 2), (torch.float32,), torch.get_num_threads())
    paths = [
        FastDecoding(step_cache=tmp_path, screened_greedy=screened).decoding_state(model).steps._package_path(key)
        for screened in (True, False)
    ]
    assert paths[0].parent == paths[1].parent == tmp_path and paths[0] != paths[1]
    again = FastDecoding(step_cache=tmp_path).decoding_state(model).steps._package_path(key)
    assert again == paths[0]
