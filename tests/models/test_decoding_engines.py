"""Every decoding engine of the encoder-decoder Transformer against transformers' eager `generate`, over the same
cases: greedy and beam search, a padded batch whose rows end at different lengths, min / max lengths, the length
penalty, returned sequences, two end tokens, forced first and last tokens and bad words.

Engines: transformers' loop on the static cache (`cache_implementation="static"`, its steps uncompiled here: the
compiled ones are tests/models/test_compiled_decoding.py's), the fused step (`FastDecoding`, float32, run uncompiled:
its compiled steps are test_fast_decoding.py's), the onnxruntime decoder of the ONNX export and the CTranslate2
export. Each must give eager `generate`'s tokens, except where the engine's own rules differ (and then it refuses or
the case is left out, for the reason given):

- onnxruntime: greedy decoding only; beam search is refused in one line (`test_what_an_engine_cannot_do_is_refused`);
- CTranslate2: beam search ranks finished hypotheses with CTranslate2's own length normalisation (not transformers'
  `score / length ** length_penalty` over the finished set), so its beams may differ: only their layout is checked
  (test_ctranslate2_export.py); a forced first token has no CTranslate2 option and is refused; a forced last token is
  ignored (it could change only sequences that reach the maximum length), so that case is left out.
"""

from __future__ import annotations

import pytest
import torch

from hf_vit_plus import Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.models.fast_decoding import FastDecoding
from tests.models.test_fast_decoding import PAD, SETTINGS, _config, _reversal_batch, _train

ENGINES = ("static", "fast", "onnx", "ctranslate2")


def _applies(engine: str, settings: dict) -> bool:
    greedy = settings.get("num_beams", 1) == 1
    if engine == "onnx":
        return greedy
    if engine == "ctranslate2":
        return greedy and "forced_bos_token_id" not in settings and "forced_eos_token_id" not in settings
    return True


CASES = [(engine, name) for engine in ENGINES for name, settings in SETTINGS.items() if _applies(engine, settings)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return _train(Seq2SeqTransformerForConditionalGeneration(_config()))


@pytest.fixture(scope="module")
def batch():
    src, mask, _ = _reversal_batch(torch.Generator().manual_seed(123), batch=8)
    return src, mask


@pytest.fixture(scope="module")
def engines(model, tmp_path_factory):
    """engine name -> generate(src, mask, **settings) -> token ids as eager generate returns them. Each engine is
    built at its first use (`-k fast` builds no export: `make test-generic`); one whose extra is missing is absent."""

    def with_generate(**extra):
        def run(src, mask, **settings):
            with torch.no_grad():
                return model.generate(src, attention_mask=mask, **extra, **settings)

        return run

    def onnx():
        from hf_vit_plus.export import export_onnx
        from hf_vit_plus.serving import OnnxSeq2SeqGenerator

        folder = tmp_path_factory.mktemp("onnx")
        export_onnx(model, folder)
        runner = OnnxSeq2SeqGenerator(folder)
        return lambda src, mask, **settings: torch.as_tensor(runner.generate(src, mask, **settings))

    def ctranslate2():
        from hf_vit_plus.export import export_ctranslate2
        from hf_vit_plus.models.pipeline_text2text_generation import CTranslate2Generator

        folder = export_ctranslate2(model, tmp_path_factory.mktemp("ct2") / "model")
        return CTranslate2Generator(folder, compute_type="float32").generate

    builders = {
        "static": lambda: with_generate(cache_implementation="static", disable_compile=True),
        "fast": lambda: with_generate(custom_generate=FastDecoding(backend="eager")),
        "onnx": onnx,
        "ctranslate2": ctranslate2,
    }
    return _Engines(builders)


class _Engines(dict):
    """The engines built so far, each built on the first `in` or `[]` that names it (absent where its extra is not
    installed: ImportError)."""

    def __init__(self, builders):
        super().__init__()
        self.builders = builders

    def _build(self, name) -> bool:
        if not dict.__contains__(self, name) and name in self.builders:
            try:
                self[name] = self.builders.pop(name)()
            except ImportError:  # the export extra is missing: that engine's cases skip
                pass
        return dict.__contains__(self, name)

    def __contains__(self, name) -> bool:
        return self._build(name)

    def __getitem__(self, name):
        self._build(name)
        return dict.__getitem__(self, name)


@pytest.mark.parametrize("engine, case", CASES, ids=[f"{engine}: {case}" for engine, case in CASES])
def test_every_engine_gives_the_tokens_of_eager_generate(model, batch, engines, engine, case):
    if engine not in engines:
        pytest.skip(f"the {engine} engine is not installed")
    settings = SETTINGS[case]
    src, mask = batch
    with torch.no_grad():
        eager = model.generate(src, attention_mask=mask, **settings)
    out = engines[engine](src, mask, **settings)
    assert out.shape == eager.shape and torch.equal(out, eager), (engine, case, out, eager)


def test_the_cases_tell_the_rules_apart(model, batch):
    """The batch is padded and its greedy rows end at different lengths (padding after EOS is exercised), and the
    settings change the tokens (each rule is exercised, not vacuously equal)."""
    src, mask = batch
    assert (mask == 0).any()
    with torch.no_grad():
        outputs = {name: model.generate(src, attention_mask=mask, **settings) for name, settings in SETTINGS.items()}
    assert len({int(row.ne(PAD).sum()) for row in outputs["greedy"]}) > 1
    plain = outputs["greedy"]
    for name in ("greedy, min_new_tokens", "greedy, max_length", "greedy, two eos ids, forced bos"):
        other = outputs[name]
        assert other.shape != plain.shape or not torch.equal(other, plain), name


def test_what_an_engine_cannot_do_is_refused(engines, batch):
    src, mask = batch
    if "onnx" in engines:
        with pytest.raises(ValueError, match="greedy decoding.*num_beams=3"):
            engines["onnx"](src, mask, num_beams=3, max_new_tokens=4)
        with pytest.raises(ValueError, match="do not take"):
            engines["onnx"](src, mask, not_a_setting=1)
    if "ctranslate2" in engines:
        with pytest.raises(ValueError, match="cannot force a first token"):
            engines["ctranslate2"](src, mask, forced_bos_token_id=5, max_new_tokens=4)
