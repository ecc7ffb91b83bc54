"""The shared BPE vocabulary: training, special tokens, save -> AutoTokenizer round trip, exact decoding."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from hf_vit_plus.data.number_words import load_number_words_dataset
from hf_vit_plus.tokenization import train_bpe_tokenizer

ENGLISH = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "And God said, Let there be light: and there was light.",
    "And God saw the light, that it was good: and God divided the light from the darkness.",
]
SPANISH = [
    "En el principio crió Dios los cielos y la tierra.",
    "Y la tierra estaba desordenada y vacía, y las tinieblas estaban sobre la haz del abismo.",
    "Y dijo Dios: Sea la luz: y fué la luz.",
    "Y vió Dios que la luz era buena: y apartó Dios la luz de las tinieblas.",
]
HELD_OUT = [
    "Señor, ¿qué es el hombre?  Two spaces, a tab\tand ünïcödé 漢字 — never seen in training.",
    "The quick brown fox jumps over the lazy dog (1234567890).",
    "",
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer((ENGLISH + SPANISH) * 20, vocab_size=400)


def test_special_tokens_and_eos(tokenizer):
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == (
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
    )
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    ids = tokenizer("la luz").input_ids
    assert ids[-1] == tokenizer.eos_token_id and ids.count(tokenizer.eos_token_id) == 1
    # Merges were learned: a frequent word is one token, shared by both languages' vocabulary.
    assert len(tokenizer.tokenize(" light")) == 1 and len(tokenizer.tokenize(" tierra")) == 1
    assert tokenizer.unk_token_id not in tokenizer(HELD_OUT[0]).input_ids  # byte-level: nothing is unknown


def test_save_and_auto_tokenizer_round_trip(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in ENGLISH + SPANISH + HELD_OUT:
        ids = loaded(text).input_ids
        assert ids == tokenizer(text).input_ids
        assert loaded.decode(ids, skip_special_tokens=True) == text
    assert loaded.eos_token_id == 2 and loaded.pad_token_id == 0
    batch = loaded(["a", "longer sentence here"], text_target=["b", "c"], padding=True)
    assert batch["input_ids"][0][-1] == loaded.pad_token_id and batch["labels"][1][-1] == loaded.eos_token_id


def test_split_digits_on_number_words():
    data = load_number_words_dataset(max_number=999, num_test=50)
    texts = list(data["train"]["source"]) + list(data["train"]["target"])
    tok = train_bpe_tokenizer(texts, vocab_size=300, split_digits=True)
    assert tok.tokenize("4021") == ["4", "0", "2", "1"]
    for source, target in zip(data["test"]["source"], data["test"]["target"]):
        assert tok.decode(tok(target).input_ids, skip_special_tokens=True) == target
        assert tok.decode(tok(source).input_ids, skip_special_tokens=True) == source
    assert tok.tokenize(" hundred") == ["Ġhundred"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(ENGLISH, vocab_size=100)
    with pytest.raises(TypeError, match="one string"):
        train_bpe_tokenizer("just one string", vocab_size=400)
    with pytest.raises(TypeError, match="item 1"):
        train_bpe_tokenizer(["ok", 3], vocab_size=400)
