"""`Translator`'s batching: the sources of a buffer sorted by length into batches, the translations back in input
order, each sentence's the tokens it gets alone (on `generate` and on `FastDecoding`, uncompiled: its compiled
steps are tests/models/test_fast_decoding.py's); `hf-vit-plus translate --buffer_size`. A random model with a small
BPE tokenizer: its translations run to `max_new_tokens`, which every call here gives."""

from __future__ import annotations

import pytest

from hf_vit_plus.cli import main
from hf_vit_plus.models.fast_decoding import FastDecoding
from hf_vit_plus.serving import BUFFER_BATCHES, Translator
from tests.models import test_ctranslate2_export

# the module fixture: a random model with a small BPE tokenizer, saved as a text2text pipeline folder
checkpoint = test_ctranslate2_export.checkpoint

# mixed lengths, in no order: 1 to 12 words
TEXTS = [
    "blessed are the meek",
    "in",
    "in the beginning was the word and the word was with god and",
    "the word",
    "and the word was with god",
    "blessed",
    "in the beginning was the word",
    "meek are the blessed ones in the beginning",
    "god",
]
SETTINGS = dict(num_beams=1, max_new_tokens=6)


def _translators(checkpoint) -> dict[str, Translator]:
    fast = Translator(checkpoint, engine="fast")
    fast.decoder = FastDecoding(backend="eager")
    return {"generate": Translator(checkpoint), "fast": fast}


def _record_batches(translator: Translator) -> list[list[int]]:
    """The source lengths (real tokens) of each batch `translator` decodes, in the order decoded."""
    batches = []
    generate = translator.generate

    def recording(input_ids, attention_mask=None, **settings):
        batches.append(attention_mask.sum(dim=1).tolist())
        return generate(input_ids, attention_mask, **settings)

    translator.generate = recording
    return batches


@pytest.mark.parametrize("engine", ["generate", "fast"])
def test_sorted_batches_give_each_sentence_its_translation_alone_in_input_order(checkpoint, engine):
    translator = _translators(checkpoint)[engine]
    alone = [translator([text], **SETTINGS)[0] for text in TEXTS]
    batches = _record_batches(translator)
    assert translator(TEXTS, batch_size=4, **SETTINGS) == alone
    lengths = [len(ids) for ids in translator.tokenizer(TEXTS)["input_ids"]]
    # one buffer (16 x 4 >= 9 texts): batches of 4, 4, 1 of the sources sorted by length
    assert batches == [sorted(lengths)[:4], sorted(lengths)[4:8], sorted(lengths)[8:]]
    batches.clear()
    assert translator(TEXTS, batch_size=4, buffer_size=4, **SETTINGS) == alone  # sorted within 4 texts only
    assert batches == [sorted(lengths[:4]), sorted(lengths[4:8]), lengths[8:]]


def test_beams_and_returned_sequences_stay_with_their_text(checkpoint):
    translator = Translator(checkpoint)
    settings = dict(num_beams=2, num_return_sequences=2, max_new_tokens=5)
    alone = [translator([text], **settings) for text in TEXTS]
    assert translator(TEXTS, batch_size=3, **settings) == [text for pair in alone for text in pair]


def test_the_fast_engine_hands_generates_preparation_over_again(checkpoint):
    """After its first call of a setting the fast engine skips `generate`'s preparation: the same tokens as
    `generate`, at any batch and length limit (the default's too), beams and returned sequences included."""
    translators = _translators(checkpoint)
    for settings in (SETTINGS, dict(num_beams=2, num_return_sequences=2, max_new_tokens=4), dict(num_beams=1)):
        for batch_size in (4, 3):  # the second round: the setting's preparation is kept
            expected = translators["generate"](TEXTS, batch_size=batch_size, **settings)
            assert translators["fast"](TEXTS, batch_size=batch_size, **settings) == expected, settings
    assert len(translators["fast"]._prepared) == 2  # one per setting, whatever the length limit


def test_the_buffer_bounds_what_is_read_ahead(checkpoint):
    translator = Translator(checkpoint)
    consumed = []

    def lines():
        for index, text in enumerate(TEXTS):
            consumed.append(index)
            yield text

    translations = translator.translate_iterable(lines(), batch_size=2, buffer_size=4, **SETTINGS)
    first = next(translations)
    assert len(consumed) == 4  # the first buffer only, before the first translation
    assert [first, *translations] == translator(TEXTS, **SETTINGS)
    assert BUFFER_BATCHES * 2 == Translator._buffer_size(2, None)


@pytest.mark.parametrize(
    ("batch_size", "buffer_size", "message"),
    [(0, None, "batch_size must be an integer >= 1, got 0"), (4, 3, r"buffer_size must be an integer >= batch_size")],
)
def test_bad_sizes_are_refused_before_any_work(checkpoint, batch_size, buffer_size, message):
    translator = Translator(checkpoint)
    _record_batches(translator)
    with pytest.raises(ValueError, match=message):
        translator(TEXTS, batch_size=batch_size, buffer_size=buffer_size)


def test_the_translate_command_sorts_within_its_buffer(checkpoint, capsys):
    expected = Translator(checkpoint)(TEXTS, **SETTINGS)
    argv = ["translate", str(checkpoint), *TEXTS, "--num_beams", "1", "--max_new_tokens", "6", "--batch_size", "2"]
    capsys.readouterr()
    assert main([*argv, "--buffer_size", "4"]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    assert main([*argv, "--buffer_size", "1"]) == 2
    assert "--buffer_size must be at least --batch_size (2), got 1" in capsys.readouterr().err
