"""transformers' `MarianMTModel` (the opus-mt checkpoints) converted to the Seq2seq Transformer: same logits, same
`generate` output, a checkpoint folder that saves, loads (also as remote code) and keeps the Marian tokenizer.

Every Marian here is randomly initialised and saved locally; the weights are scaled up (init_std) so that greedy
and beam search produce varied tokens rather than one repeated token."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel

from hf_vit_plus import Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.cli import main
from hf_vit_plus.conversion import seq2seq_from_marian
from hf_vit_plus.conversion.cli import MARIAN_TOKENIZER_FILES
from hf_vit_plus.errors import UsageError
from hf_vit_plus.models.modeling_seq2seq_transformer import position_table
from tests.utils import run_without_package

VOCAB = 61
PAD = VOCAB - 1  # Marian: the last id, also the decoder start token
EOS = 0
MAX_POSITIONS = 64


def marian_model(seed: int = 0, **overrides) -> MarianMTModel:
    """A small random MarianMTModel shaped like an opus-mt checkpoint (swish, scaled embeddings, pad = decoder
    start, a non-zero output bias) with an opus-mt-like generation config."""
    fields = dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=48,
        max_position_embeddings=MAX_POSITIONS,
        activation_function="swish",
        scale_embedding=True,
        init_std=0.3,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=EOS,
        forced_eos_token_id=EOS,
    )
    fields.update(overrides)
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**fields)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(std=0.5)
    generation = model.generation_config
    generation.bad_words_ids = [[PAD]]
    generation.max_length = 24
    generation.num_beams = 4
    return model


def source_batch(seed: int = 1, batch: int = 3, length: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """Random source ids ending in </s>, the later rows right-padded, and their mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, PAD, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for row in range(1, batch):
        mask[row, length - 2 * row :] = 0
    ids[torch.arange(batch), mask.sum(1) - 1] = EOS
    return ids.masked_fill(mask == 0, PAD), mask


EMBEDDINGS = {
    "all-tied": dict(tie_word_embeddings=True, share_encoder_decoder_embeddings=True),
    "source-separate": dict(tie_word_embeddings=True, share_encoder_decoder_embeddings=False),
    "untied": dict(tie_word_embeddings=False, share_encoder_decoder_embeddings=True),
}


@pytest.mark.parametrize("embeddings", list(EMBEDDINGS))
def test_logits_match_marian(embeddings):
    marian = marian_model(**EMBEDDINGS[embeddings])
    ours = seq2seq_from_marian(marian)
    assert isinstance(ours, Seq2SeqTransformerForConditionalGeneration) and not ours.training
    config = ours.config
    assert (config.tie_word_embeddings, config.share_encoder_decoder_embeddings) == tuple(
        EMBEDDINGS[embeddings].values()
    )
    assert (config.activation_function, config.sinusoid_layout, config.add_final_logits_bias) == (
        "swish",
        "halves",
        True,
    )
    ids, mask = source_batch()
    decoder_ids = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = marian(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        got = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    assert expected.abs().max() > 1  # not a degenerate model
    assert (got - expected).abs().max() < 1e-5


def test_embedding_sharing_follows_marian():
    separate = seq2seq_from_marian(marian_model(**EMBEDDINGS["source-separate"]))
    decoder_embedding = separate.model.decoder.embed_tokens.weight
    assert separate.lm_head.weight is decoder_embedding
    assert separate.model.encoder.embed_tokens.weight is not decoder_embedding
    assert separate.model.shared is None
    tied = seq2seq_from_marian(marian_model())
    assert tied.lm_head.weight is tied.model.encoder.embed_tokens.weight is tied.model.shared.weight
    untied = seq2seq_from_marian(marian_model(**EMBEDDINGS["untied"]))
    assert untied.lm_head.weight is not untied.model.decoder.embed_tokens.weight


# A random model soon repeats one token; `no_repeat_ngram_size=1` makes the later cases choose among varied tokens.
GENERATION_SETTINGS = {
    "greedy": dict(num_beams=1),
    "beam4": dict(num_beams=4),
    "greedy-varied": dict(num_beams=1, no_repeat_ngram_size=1),
    "beam3-return2-varied": dict(num_beams=3, num_return_sequences=2, length_penalty=0.6, no_repeat_ngram_size=1),
}


@pytest.mark.parametrize("settings", list(GENERATION_SETTINGS))
def test_generate_matches_marian(settings):
    marian = marian_model()
    ours = seq2seq_from_marian(marian)
    assert ours.generation_config.to_dict() == marian.generation_config.to_dict()
    ids, mask = source_batch()
    expected = marian.generate(input_ids=ids, attention_mask=mask, **GENERATION_SETTINGS[settings])
    got = ours.generate(input_ids=ids, attention_mask=mask, **GENERATION_SETTINGS[settings])
    assert torch.equal(got, expected)
    # Marian's conventions, kept by the copied generation config: start from <pad>, never emit it, end with </s>.
    assert (expected[:, 0] == PAD).all() and (expected == EOS).any(dim=1).all()
    for row in expected.tolist():
        assert PAD not in row[1 : row.index(EOS)]  # padding only after </s>
    if settings.endswith("varied"):
        assert len(set(expected.flatten().tolist())) > 20


def test_position_table_is_marians():
    marian = marian_model()
    config = seq2seq_from_marian(marian).config
    expected = marian.get_encoder().embed_positions.create_weight()
    assert torch.equal(position_table(config), expected)
    paper = position_table(Seq2SeqTransformerConfig(d_model=32, max_position_embeddings=MAX_POSITIONS))
    assert torch.equal(paper[:, 0::2], expected[:, :16]) and torch.equal(paper[:, 1::2], expected[:, 16:])


def test_converted_model_saves_loads_and_runs_as_remote_code(tmp_path):
    marian = marian_model()
    ours = seq2seq_from_marian(marian)
    ids, mask = source_batch()
    with torch.no_grad():
        expected_logits = marian(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits
    expected_tokens = marian.generate(input_ids=ids, attention_mask=mask)  # the copied config: beam 4, max 24
    ours.save_pretrained(tmp_path / "converted")

    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted").eval()
    assert type(loaded) is Seq2SeqTransformerForConditionalGeneration
    assert torch.equal(loaded.final_logits_bias, marian.final_logits_bias)
    assert loaded.generation_config.bad_words_ids == [[PAD]] and loaded.generation_config.num_beams == 4
    with torch.no_grad():
        got = loaded(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits
    assert (got - expected_logits).abs().max() < 1e-5
    assert torch.equal(loaded.generate(input_ids=ids, attention_mask=mask), expected_tokens)

    torch.save({"ids": ids, "mask": mask}, tmp_path / "inputs.pt")
    code = f"""
        import json, torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "converted")!r}, trust_remote_code=True)
        batch = torch.load({str(tmp_path / "inputs.pt")!r})
        tokens = model.eval().generate(input_ids=batch["ids"], attention_mask=batch["mask"])
        print(json.dumps({{"module": type(model).__module__, "tokens": tokens.tolist()}}))
    """
    result = run_without_package(code, cwd=tmp_path)
    assert not result["module"].startswith("hf_vit_plus")
    assert result["tokens"] == expected_tokens.tolist()


def test_float16_marian_converts_in_its_dtype():
    marian = marian_model().half()
    ours = seq2seq_from_marian(marian)
    assert ours.lm_head.weight.dtype == torch.float16 and ours.final_logits_bias.dtype == torch.float16


# --------------------------------------------------------------------------------------------- refused models
def test_a_target_vocabulary_of_another_size_is_refused():
    marian = marian_model(share_encoder_decoder_embeddings=False, decoder_vocab_size=VOCAB + 3)
    with pytest.raises(ValueError, match=r"decoder_vocab_size=64"):
        seq2seq_from_marian(marian)


def test_a_model_that_is_not_marian_is_refused():
    with pytest.raises(TypeError, match="Expected a transformers MarianMTModel, got Linear"):
        seq2seq_from_marian(torch.nn.Linear(2, 2))


def test_layerdrop_is_named_in_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_vit_plus.conversion.marian"):
        seq2seq_from_marian(marian_model(encoder_layerdrop=0.1))
    assert "encoder_layerdrop=0.1 is not converted" in caplog.text


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(sinusoid_layout="split"), "Unknown `sinusoid_layout` 'split'"),
        (dict(add_final_logits_bias="yes"), "`add_final_logits_bias` must be True or False, got 'yes'"),
        (dict(share_encoder_decoder_embeddings=None), "`share_encoder_decoder_embeddings` must be True or False"),
    ],
)
def test_new_config_fields_are_validated(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Seq2SeqTransformerConfig(**fields)


def test_new_config_fields_default_to_the_papers_model():
    config = Seq2SeqTransformerConfig()
    assert (config.sinusoid_layout, config.share_encoder_decoder_embeddings, config.add_final_logits_bias) == (
        "interleaved",
        True,
        False,
    )
    model = Seq2SeqTransformerForConditionalGeneration(Seq2SeqTransformerConfig(d_model=16, encoder_layers=1))
    assert model.final_logits_bias is None and "final_logits_bias" not in model.state_dict()


@pytest.mark.parametrize("embeddings", list(EMBEDDINGS))
def test_resize_token_embeddings_resizes_every_matrix(embeddings):
    """Regression: resizing an untied model (or one with `share_encoder_decoder_embeddings=False`) left the decoder
    embedding at the old size, and `final_logits_bias` did not follow either; the new tokens then crashed."""
    marian = marian_model(**EMBEDDINGS[embeddings])
    model = seq2seq_from_marian(marian)
    model.resize_token_embeddings(VOCAB + 5)
    decoder_embedding = model.model.decoder.embed_tokens.weight
    assert model.model.encoder.embed_tokens.weight.shape[0] == decoder_embedding.shape[0] == VOCAB + 5
    assert model.lm_head.weight.shape[0] == model.config.vocab_size == VOCAB + 5
    assert (model.lm_head.weight is decoder_embedding) == model.config.tie_word_embeddings
    assert torch.equal(model.model.decoder.embed_tokens.weight[:VOCAB], marian.get_decoder().embed_tokens.weight)
    assert torch.equal(model.final_logits_bias[:, :VOCAB], marian.final_logits_bias)
    assert (model.final_logits_bias[:, VOCAB:] == 0).all()
    ids, mask = source_batch()
    ids[0, 0] = VOCAB + 4  # a new token, on both sides
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits
    assert logits.shape[-1] == VOCAB + 5 and torch.isfinite(logits).all()


# ------------------------------------------------------------------------------------------------------ the CLI
def save_marian_folder(folder: Path, model: MarianMTModel | None = None) -> MarianMTModel:
    """A Marian checkpoint folder as transformers 5 saves one, with stand-in tokenizer files (no sentencepiece)."""
    model = model or marian_model()
    model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(VOCAB)} | {"</s>": EOS, "<unk>": 1, "<pad>": PAD}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "source.spm").write_bytes(b"source sentencepiece model")
    (folder / "target.spm").write_bytes(b"target sentencepiece model")
    # An older opus-mt folder: the tokenizer config names no class.
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    return model


def test_cli_converts_a_marian_folder_and_copies_its_tokenizer(tmp_path, capsys):
    marian = save_marian_folder(tmp_path / "marian")
    assert main(["convert", "marian", str(tmp_path / "marian"), str(tmp_path / "out")]) == 0
    assert "Seq2seq Transformer checkpoint written to" in capsys.readouterr().out
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "marian" / name).read_bytes()
    tokenizer_config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert tokenizer_config == {"source_lang": "en", "target_lang": "de", "tokenizer_class": "MarianTokenizer"}
    assert {"config.json", "model.safetensors", "generation_config.json", "modeling_seq2seq_transformer.py"} <= {
        path.name for path in (tmp_path / "out").iterdir()
    }
    converted = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    ids, mask = source_batch()
    assert torch.equal(
        converted.generate(input_ids=ids, attention_mask=mask), marian.generate(input_ids=ids, attention_mask=mask)
    )


def test_cli_without_tokenizer_files_converts_with_a_warning(tmp_path, caplog):
    marian_model().save_pretrained(tmp_path / "marian")
    with caplog.at_level(logging.WARNING, logger="hf_vit_plus.conversion.cli"):
        assert main(["convert", "marian", str(tmp_path / "marian"), str(tmp_path / "out")]) == 0
    assert "has no complete Marian tokenizer (missing source.spm, target.spm, vocab.json)" in caplog.text
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert not any((tmp_path / "out" / name).exists() for name in MARIAN_TOKENIZER_FILES)


def test_cli_refuses_pickled_weights_and_other_models(tmp_path):
    from hf_vit_plus.conversion.cli import convert_marian

    folder = tmp_path / "pickled"
    marian_model().config.save_pretrained(folder)
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(UsageError, match=r"no safetensors weights .*found \['pytorch_model.bin'\].*can run code"):
        convert_marian(folder, tmp_path / "out")
    Seq2SeqTransformerConfig(d_model=16).save_pretrained(tmp_path / "ours")
    with pytest.raises(UsageError, match="is a 'seq2seq_transformer' model; the 'marian' source converts"):
        convert_marian(tmp_path / "ours", tmp_path / "out")
    with pytest.raises(UsageError, match="does not exist"):
        convert_marian(tmp_path / "missing", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_user_errors_are_one_line_with_status_2(tmp_path, capsys):
    (tmp_path / "pickled").mkdir()
    marian_model().config.save_pretrained(tmp_path / "pickled")
    for folder, message in (("missing", "does not exist"), ("pickled", "has no safetensors weights")):
        capsys.readouterr()
        assert main(["convert", "marian", str(tmp_path / folder), str(tmp_path / "out")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hf-vit-plus convert: error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()


def test_cli_names_a_marian_the_converter_cannot_express(tmp_path):
    from hf_vit_plus.conversion.cli import convert_marian

    marian_model(share_encoder_decoder_embeddings=False, decoder_vocab_size=VOCAB + 3).save_pretrained(tmp_path / "m")
    with pytest.raises(UsageError, match="separate source and target vocabularies of different sizes"):
        convert_marian(tmp_path / "m", tmp_path / "out")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_stored_position_table_that_is_not_the_sinusoid_is_refused(tmp_path, dtype):
    """The converted model recomputes the position tables: a stored table that differs by more than the rounding
    of its dtype (here 0.006, under the old absolute tolerance of two bf16 epsilons) would be dropped silently."""
    from safetensors.torch import load_file, save_file

    from hf_vit_plus.conversion.cli import convert_marian

    marian = marian_model().to(dtype)
    marian.save_pretrained(tmp_path / "exact")
    convert_marian(tmp_path / "exact", tmp_path / "exact-out")  # the exact table (rounded to its dtype) converts
    state = load_file(tmp_path / "exact" / "model.safetensors")
    table = marian.get_encoder().embed_positions.weight.detach()
    state["model.encoder.embed_positions.weight"] = (table.float() + 0.006).to(dtype)
    (tmp_path / "shifted").mkdir()
    (tmp_path / "shifted" / "config.json").write_text((tmp_path / "exact" / "config.json").read_text())
    save_file(state, tmp_path / "shifted" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UsageError, match=r"model.encoder.embed_positions.weight is not the sinusoidal table.*0\.00"):
        convert_marian(tmp_path / "shifted", tmp_path / "shifted-out")
    assert not (tmp_path / "shifted-out").exists()


# ------------------------------------------------------------------------------- the real Marian tokenizer
def test_the_marian_tokenizer_works_with_the_converted_model(tmp_path):
    """With sentencepiece installed: a real MarianTokenizer (tiny spm models trained here) saved next to a Marian,
    converted by the CLI; `AutoTokenizer` loads the same tokenizer from the output and the translations agree."""
    spm = pytest.importorskip("sentencepiece")
    from transformers import AutoTokenizer, MarianTokenizer

    sentences = [
        "the cat sat on the mat",
        "a dog ran in the park",
        "the bird sang a song in the tree",
        "she reads a book every night",
        "we walk to the river and back",
    ] * 20
    folder = tmp_path / "marian"
    folder.mkdir()
    for side in ("source", "target"):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_prefix=str(tmp_path / side),
            vocab_size=40,
            model_type="unigram",
            hard_vocab_limit=False,
            minloglevel=2,
        )
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "source.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = MarianTokenizer(
        str(tmp_path / "source.model"), str(tmp_path / "target.model"), str(tmp_path / "vocab.json")
    )
    tokenizer.save_pretrained(folder)
    marian = marian_model(vocab_size=len(vocab), pad_token_id=vocab["<pad>"], decoder_start_token_id=vocab["<pad>"])
    marian.generation_config.bad_words_ids = [[vocab["<pad>"]]]
    marian.save_pretrained(folder)

    assert main(["convert", "marian", str(folder), str(tmp_path / "out")]) == 0
    loaded = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert type(loaded) is MarianTokenizer
    texts = ["the cat ran in the park", "a bird reads"]
    batch = loaded(texts, return_tensors="pt", padding=True)
    assert batch["input_ids"].tolist() == tokenizer(texts, return_tensors="pt", padding=True)["input_ids"].tolist()
    converted = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval()
    ours = loaded.batch_decode(converted.generate(**batch), skip_special_tokens=True)
    theirs = tokenizer.batch_decode(marian.generate(**batch), skip_special_tokens=True)
    assert ours == theirs


# --------------------------------------------------------------------------------------------- the fast engine
def _save_opus_mt_folder(folder: Path, marian: MarianMTModel) -> None:
    """A Marian saved with a word-level tokenizer of its vocabulary ("w1" ... "w59", `</s>` 0, `<pad>` the last id):
    what `Translator` needs of an opus-mt folder, without sentencepiece."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"</s>": EOS, **{f"w{i}": i for i in range(1, PAD)}, "<pad>": PAD}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", pad_token="<pad>", unk_token="w1")
    marian.save_pretrained(folder)
    fast.save_pretrained(folder)


def test_fast_decoding_converts_an_opus_mt_model_on_the_fly(tmp_path, caplog):
    """`MarianMTModel.generate(custom_generate=FastDecoding())` and `Translator(opus-mt folder, engine="fast")`
    decode the exact conversion: the converted model's tokens, with one log line saying so (per model, not per
    call)."""
    from hf_vit_plus.models.fast_decoding import FastDecoding
    from hf_vit_plus.serving.translator import Translator

    marian = marian_model()
    converted = seq2seq_from_marian(marian)
    src, mask = source_batch()
    engine = FastDecoding(backend="eager")  # the compiled steps are tested in test_fast_decoding.py
    with caplog.at_level(logging.WARNING, logger="hf_vit_plus.models.fast_decoding"):
        for settings in (dict(num_beams=1, max_new_tokens=12), dict(num_beams=3, max_new_tokens=12)):
            expected = converted.generate(src, attention_mask=mask, **settings)
            got = marian.generate(src, attention_mask=mask, custom_generate=engine, **settings)
            assert torch.equal(got, expected), settings
            assert torch.equal(engine.generate(marian, src, attention_mask=mask, **settings), expected), settings
    lines = [r.getMessage() for r in caplog.records if "on the fly" in r.getMessage()]
    assert len(lines) == 1 and "converted the MarianMTModel" in lines[0] and "hf-vit-plus convert marian" in lines[0]

    folder = tmp_path / "opus-mt"
    _save_opus_mt_folder(folder, marian)
    texts = ["w3 w7 w9 w11", "w5 w2"]
    reference = Translator(folder)(texts, num_beams=1, max_new_tokens=10)
    fast = Translator(folder, engine="fast")
    assert type(fast.model) is Seq2SeqTransformerForConditionalGeneration
    fast.decoder = engine
    assert fast(texts, num_beams=1, max_new_tokens=10) == reference and any(reference)


def test_fast_decoding_refuses_what_it_cannot_convert_in_one_line(monkeypatch):
    from transformers import BartConfig, BartForConditionalGeneration

    from hf_vit_plus.models import fast_decoding
    from hf_vit_plus.models.fast_decoding import FastDecoding

    src, mask = source_batch()
    engine = FastDecoding(backend="eager")
    other_vocabulary = marian_model(share_encoder_decoder_embeddings=False, decoder_vocab_size=VOCAB + 3)
    bart = BartForConditionalGeneration(
        BartConfig(
            vocab_size=VOCAB,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
        )
    ).eval()
    cases = {
        "Cannot convert this MarianMTModel: .*64.*`hf-vit-plus convert marian` refuses": other_vocabulary,
        "decodes the Seq2seq Transformer .* not BartForConditionalGeneration.*`hf-vit-plus convert marian`": bart,
    }
    for message, model in cases.items():
        calls = {
            "generate": lambda model=model: model.generate(
                src, attention_mask=mask, custom_generate=engine, max_new_tokens=4
            ),
            "FastDecoding.generate": lambda model=model: engine.generate(
                model, src, attention_mask=mask, max_new_tokens=4
            ),
        }
        for name, call in calls.items():
            with pytest.raises(ValueError, match=message) as error:
                call()
            assert "\n" not in str(error.value), name
    # as a checkpoint's remote code, without the package: no converter to call, and the command named
    monkeypatch.setitem(
        fast_decoding.EXACT_CONVERSIONS, "marian", ("no_such_package.marian", "convert", "hf-vit-plus convert marian")
    )
    with pytest.raises(
        ValueError, match=r"with the hf_vit_plus package installed.*`hf-vit-plus convert marian FOLDER"
    ):
        engine.generate(marian_model(), src, attention_mask=mask, max_new_tokens=4)
