"""A shared source/target BPE vocabulary (Vaswani et al., 2017, section 5.1), trained with `tokenizers` and wrapped
as transformers' `PreTrainedTokenizerFast`.

Byte-level pre-tokenisation and decoding make every string round-trip exactly (accents and rare characters
included: the 256 byte symbols are always in the vocabulary, so `<unk>` never appears). The post-processor appends
`</s>` to every sequence, sources and targets alike, as Marian and BART do. `tok.save_pretrained(model_dir)`
writes `tokenizer.json` + `tokenizer_config.json`, so `AutoTokenizer.from_pretrained(model_dir)` works without
remote code.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
# Fixed order, so the ids are pad 0, bos 1, eos 2, unk 3 in every tokenizer this module trains.
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]


def _checked_texts(texts: Iterable[str]) -> Iterator[str]:
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts must hold strings, item {i} is {type(text).__name__}: {text!r}")
        yield text


MAX_VOCAB_SIZE = 2**22  # 4,194,304: far beyond any real vocabulary, far below what aborts tokenizers


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    split_digits: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` (give it the source AND the target side: one shared vocabulary).

    Args:
        texts: the training strings.
        vocab_size: size of the final vocabulary, the 4 special tokens and 256 byte symbols included.
        min_frequency: a merge needs a pair seen at least this many times.
        model_max_length: the longest input the wrapped tokenizer accepts before truncation warnings.
        split_digits: keep every digit a token of its own (no merges across digits), which helps arithmetic-like
            tasks such as number -> words.

    Returns:
        A `PreTrainedTokenizerFast` with `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3 and `</s>` appended to every
        encoded sequence.
    """
    if isinstance(texts, str):
        raise TypeError(f"texts must be an iterable of strings, not one string: {texts[:50]!r}")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    min_size = len(SPECIAL_TOKENS) + len(alphabet)
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise TypeError(f"vocab_size must be an int >= {min_size} (specials + 256 bytes), got {vocab_size!r}")
    if not min_size <= vocab_size <= MAX_VOCAB_SIZE:
        # the tokenizers library aborts the whole process (not an exception) on absurd sizes such as 2**40
        raise ValueError(
            f"vocab_size must be an int from {min_size} (specials + 256 bytes) to {MAX_VOCAB_SIZE:,}, got "
            f"{vocab_size!r}"
        )
    for name, value in (("min_frequency", min_frequency), ("model_max_length", model_max_length)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(split_digits, bool):
        raise TypeError(f"split_digits must be True or False, got {split_digits!r}")

    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    # add_prefix_space=False keeps decode(encode(text)) == text; "ĠWord" and "Word" stay distinct tokens.
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if split_digits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(_checked_texts(texts), trainer=trainer)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A {EOS_TOKEN} $B {EOS_TOKEN}",
        special_tokens=[(EOS_TOKEN, eos_id)],
    )
    logger.info("trained a byte-level BPE vocabulary of %d tokens", tokenizer.get_vocab_size())
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
