"""CTranslate2 export (`hf_vit_plus.export.export_ctranslate2`, `hf-vit-plus export ctranslate2`) and the engine
switch of translation: `Translator`, `hf-vit-plus translate`, and the text2text pipeline's `engine=...`.

The exported model is CTranslate2's own engine on our weights: greedy decoding gives our float32 model's tokens. A
briefly trained toy model (the source reversed) gives varied predictions; a random model with a small BPE tokenizer
carries text through the three entry points.
"""

from __future__ import annotations

import json

import pytest
import torch

from hf_vit_plus import Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.cli import main
from hf_vit_plus.export import ctranslate2_vocabulary, export_ctranslate2
from hf_vit_plus.models.fast_decoding import FastDecoding
from hf_vit_plus.models.pipeline_text2text_generation import (
    CTranslate2Generator,
    Text2TextGenerationPipeline,
    save_text2text_pipeline,
)
from hf_vit_plus.serving import Translator
from tests.models.test_fast_decoding import BOS, EOS, PAD, _config, _reversal_batch, _train
from tests.utils import run_without_package

pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return _train(Seq2SeqTransformerForConditionalGeneration(_config()))


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    return export_ctranslate2(model, tmp_path_factory.mktemp("ct2") / "model")


@pytest.fixture(scope="module")
def batch():
    src, mask, _ = _reversal_batch(torch.Generator().manual_seed(123), batch=8)
    return src, mask


def _generate(model, batch, **settings):
    with torch.no_grad():
        return model.generate(batch[0], attention_mask=batch[1], **settings)


# The export's greedy tokens against generate's, with the other engines: test_decoding_engines.py.


def test_beam_search_runs_with_generate_layout(model, exported, batch):
    """Beam search ranks finished hypotheses with CTranslate2's own length normalisation: not asserted equal, but
    the layout is generate's (start token, eos, and beam search's filler: the pad id, or eos when pad is 0)."""
    out = CTranslate2Generator(exported).generate(*batch, num_beams=3, num_return_sequences=2, max_new_tokens=10)
    reference = _generate(model, batch, num_beams=3, num_return_sequences=2, max_new_tokens=10)
    assert out.shape[0] == reference.shape[0] == 16
    assert (out[:, 0] == BOS).all()
    assert not (out[:, 1:] == PAD).any()  # pad id 0: generate's beam search fills with eos (regression)
    length = min(out.shape[1], reference.shape[1])
    assert (out[:, :length] == reference[:, :length]).float().mean() > 0.9


def test_the_folder_and_its_quantizations(model, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("kept")
    export_ctranslate2(model, folder, quantization="int8")
    names = {path.name for path in folder.iterdir()}
    # CTranslate2's converter replaces a whole folder: the export must leave other files alone (regression)
    assert {"model.bin", "config.json", "shared_vocabulary.json", "generation_config.json", "notes.txt"} <= names
    config = json.loads((folder / "config.json").read_text())
    assert (config["decoder_start_token"], config["eos_token"]) == (f"<id:{BOS}>", f"<id:{EOS}>")
    float32_size = (export_ctranslate2(model, tmp_path / "f32") / "model.bin").stat().st_size
    assert (folder / "model.bin").stat().st_size < float32_size / 2
    with pytest.raises(ValueError, match="Unknown CTranslate2 quantization 'int4'"):
        export_ctranslate2(model, tmp_path / "x", quantization="int4")


@pytest.mark.parametrize("attention", ["strided", "fixed", "local"])
def test_a_sparse_encoder_is_refused_by_name(attention, tmp_path):
    config = _config(encoder_attention_type=attention, encoder_sparse_stride=4, encoder_sparse_summary_size=1)
    model = Seq2SeqTransformerForConditionalGeneration(config).eval()
    with pytest.raises(ValueError, match=f"sparse attention \\(encoder_attention_type='{attention}'\\)"):
        export_ctranslate2(model, tmp_path / "out")
    model.save_pretrained(tmp_path / "sparse")
    code = main(["export", "ctranslate2", str(tmp_path / "sparse"), str(tmp_path / "out")])
    assert code == 2 and not (tmp_path / "out").exists()


def test_vocabulary_checks(model):
    assert ctranslate2_vocabulary(model)[:3] == ["<id:0>", "<id:1>", "<id:2>"]

    class Tokenizer:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    with pytest.raises(ValueError, match="the model's vocabulary has 20 ids"):
        ctranslate2_vocabulary(model, Tokenizer({"a": 0, "b": 25}))
    # id 19 is missing from the tokenizer: its placeholder "<id:19>" is also the spelling of id 5
    with pytest.raises(ValueError, match="spells two ids the same"):
        ctranslate2_vocabulary(model, Tokenizer({**{f"t{i}": i for i in range(19) if i != 5}, "<id:19>": 5}))


# ------------------------------------------------------------------------------------- text, on three engines
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random model with a byte-level BPE tokenizer, saved as a text2text pipeline folder."""
    from hf_vit_plus.tokenization import train_bpe_tokenizer

    texts = ["in the beginning was the word", "and the word was with god", "blessed are the meek"] * 10
    tokenizer = train_bpe_tokenizer(texts, vocab_size=300)
    config = _config(
        vocab_size=len(tokenizer),
        max_position_embeddings=96,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(5)
    model = Seq2SeqTransformerForConditionalGeneration(config).eval()
    folder = tmp_path_factory.mktemp("text") / "checkpoint"
    save_text2text_pipeline(model, tokenizer, folder)
    return folder


TEXTS = ["blessed are the meek", "in the beginning"]
GREEDY = dict(num_beams=1, max_new_tokens=10)


def test_one_switch_picks_the_engine_and_greedy_translations_agree(checkpoint, tmp_path):
    reference = Translator(checkpoint)(TEXTS, **GREEDY)
    fast = Translator(checkpoint, engine="fast")
    fast.decoder = FastDecoding(backend="eager")  # the compiled steps are tested in test_fast_decoding.py
    assert fast(TEXTS, **GREEDY) == reference
    assert Translator(checkpoint, engine="ctranslate2")(TEXTS, **GREEDY) == reference  # converted on the fly
    folder = tmp_path / "ct2"
    assert main(["export", "ctranslate2", str(checkpoint), str(folder)]) == 0
    assert {"tokenizer.json", "model.bin"} <= {path.name for path in folder.iterdir()}
    assert Translator(folder, engine="ctranslate2", compute_type="float32")(TEXTS, **GREEDY) == reference
    assert len(Translator(folder, engine="ctranslate2", compute_type="int8")(TEXTS, **GREEDY)) == 2
    with pytest.raises(ValueError, match="is a CTranslate2 export: it runs with engine='ctranslate2'"):
        Translator(folder)


def test_the_translate_command(checkpoint, tmp_path, capsys, monkeypatch):
    expected = Translator(checkpoint)(TEXTS, **GREEDY)
    folder = tmp_path / "ct2"
    assert main(["export", "ctranslate2", str(checkpoint), str(folder), "--quantization", "int8"]) == 0
    for argv in (
        [str(checkpoint), *TEXTS],
        [str(folder), *TEXTS, "--compute_type", "float32"],
        [str(checkpoint), *TEXTS, "--engine", "ctranslate2"],
    ):
        capsys.readouterr()
        assert main(["translate", *argv, "--num_beams", "1", "--max_new_tokens", "10"]) == 0
        assert capsys.readouterr().out.splitlines() == expected, argv
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("blessed are the meek\n\nin the beginning\n"))
    capsys.readouterr()
    assert main(["translate", str(checkpoint), "--num_beams", "1", "--max_new_tokens", "10"]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    capsys.readouterr()
    assert main(["translate", str(folder), "x", "--engine", "generate"]) == 2
    assert "is a CTranslate2 export: it runs with --engine ctranslate2" in capsys.readouterr().err


def test_the_pipeline_engines(checkpoint, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    folder = export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    outputs = {}
    for engine, extra in (("generate", {}), ("fast", {}), ("ctranslate2", {"ctranslate2_model": folder})):
        pipe = Text2TextGenerationPipeline(model=model, tokenizer=tokenizer, engine=engine, **extra)
        if engine == "fast":
            pipe.decoder = FastDecoding(backend="eager")
        outputs[engine] = [out[0]["generated_text"] for out in pipe(TEXTS, **GREEDY)]
    assert outputs["fast"] == outputs["ctranslate2"] == outputs["generate"]
    with pytest.raises(ValueError, match="needs ctranslate2_model"):
        Text2TextGenerationPipeline(model=model, tokenizer=tokenizer, engine="ctranslate2")
    with pytest.raises(ValueError, match="Unknown engine 'onnx'"):
        Text2TextGenerationPipeline(model=model, tokenizer=tokenizer, engine="onnx")


def test_the_fast_engine_runs_as_remote_code(checkpoint, tmp_path):
    """The saved pipeline folder carries fast_decoding.py: pipeline(..., engine="fast") works without the package."""
    engine = ("fast_decoding.py", "fast_layers.py", "fast_steps.py", "fast_kernels.py", "step_cache.py", "cpu_isa.py")
    shipped = ("decoding_rules.py", *engine)
    assert all((checkpoint / name).is_file() for name in shipped)
    result = run_without_package(
        f"""
        import json
        from transformers import pipeline
        pipe = pipeline("translation", model={str(checkpoint)!r}, trust_remote_code=True, engine="fast")
        eager = pipeline("translation", model={str(checkpoint)!r}, trust_remote_code=True)
        pipe.decoder = type(pipe.decoder)(backend="eager")
        print(json.dumps({{"fast": pipe({TEXTS!r}, **{GREEDY!r}), "eager": eager({TEXTS!r}, **{GREEDY!r}),
                          "module": type(pipe.decoder).__module__}}))
        """,
        tmp_path,
    )
    assert result["fast"] == result["eager"]
    assert result["module"].startswith("transformers_modules.")


def test_the_card_says_how_to_serve_it(tmp_path):
    from hf_vit_plus.hub.card import write_model_card

    config = {"model_type": "seq2seq_transformer", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2}
    path = write_model_card(
        tmp_path,
        family="seq2seq",
        model_config=config,
        training_args={},
        eval_results={"eval_bleu": 1.0},
        dataset_name="local-data",
        repo_id="org/translator",
    )
    text = path.read_text()
    assert "## Serving it fast" in text
    assert "custom_generate=fast" in text and 'FastDecoding(precision="int8")' in text
    assert "hf-vit-plus export ctranslate2 org/translator translator-ct2 --quantization int8" in text
    assert 'engine="ctranslate2", ctranslate2_model="translator-ct2"' in text
