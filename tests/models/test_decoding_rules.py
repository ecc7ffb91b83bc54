"""`models/decoding_rules.py`: generate's rules, written once and read by every engine that runs its own loop
(FastDecoding, the onnxruntime decoders, the CTranslate2 options). The per-token rules are checked against
transformers' own logits processors; the settings against what `generate` does with them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
)

from hf_vit_plus.models.decoding_rules import DecodingRules, advance_greedy, process_scores, token_ids

VOCAB = 12


def _transformers_processors(config: GenerationConfig) -> LogitsProcessorList:
    """The processors `generate` builds for these settings (encoder-decoder: one decoder start token), in its order."""
    eos = config.eos_token_id
    processors = [NoBadWordsLogitsProcessor(config.bad_words_ids, eos)] if config.bad_words_ids else []
    if config.min_length:
        processors.append(MinLengthLogitsProcessor(config.min_length, eos))
    if config.min_new_tokens:
        processors.append(MinNewTokensLengthLogitsProcessor(1, config.min_new_tokens, eos))
    if config.forced_bos_token_id is not None:
        processors.append(ForcedBOSTokenLogitsProcessor(config.forced_bos_token_id))
    if config.forced_eos_token_id is not None:
        processors.append(ForcedEOSTokenLogitsProcessor(config.max_length, config.forced_eos_token_id))
    return LogitsProcessorList(processors)


@pytest.mark.parametrize(
    "settings",
    [
        dict(eos_token_id=2, min_length=4, max_length=8),
        dict(eos_token_id=[2, 5], min_new_tokens=3, max_length=8),
        dict(eos_token_id=2, min_length=3, min_new_tokens=4, max_length=9),  # both apply: the larger wins
        dict(eos_token_id=2, bad_words_ids=[[7], [2]], max_length=6),  # an end token is never a bad word
        dict(eos_token_id=2, forced_bos_token_id=9, forced_eos_token_id=[2, 5], max_length=6),
    ],
)
def test_the_scores_are_those_of_transformers_processors_at_every_length(settings):
    config = GenerationConfig(**settings)
    rules = DecodingRules.from_generation_config(config)
    controls = rules.controls(VOCAB, "cpu")
    reference = _transformers_processors(config)
    gen = torch.Generator().manual_seed(0)
    for cur_len in range(1, config.max_length):
        scores = torch.randn(3, VOCAB, generator=gen)
        sequences = torch.zeros(3, cur_len, dtype=torch.long)  # what the processors read: the length
        expected = reference(sequences, scores.clone())
        assert torch.equal(process_scores(scores, torch.tensor(cur_len), controls), expected), cur_len
        ids = torch.tensor([[0, 2, 7], [5, 9, 1], [11, 3, 2]])  # the scores of a few tokens per row (the screen)
        chosen = process_scores(scores.gather(1, ids), torch.tensor(cur_len), controls, ids)
        assert torch.equal(chosen, expected.gather(1, ids)), cur_len


def test_lengths_and_fillers_are_resolved_as_generate_resolves_them():
    rules = DecodingRules.from_generation_config(GenerationConfig(eos_token_id=2, max_new_tokens=5, max_length=50))
    assert rules.max_length == 6 and rules.new_token_bounds() == (0, 5)  # max_new_tokens wins; start token counted
    rules = DecodingRules.from_generation_config(GenerationConfig(eos_token_id=2, min_length=3, min_new_tokens=4))
    assert rules.min_length == 5 and rules.new_token_bounds() == (4, 19)  # generate's default max_length is 20
    assert DecodingRules.from_generation_config(GenerationConfig(min_length=5)).min_length == 0  # no end token
    prompt = DecodingRules.from_generation_config(GenerationConfig(max_new_tokens=4), start_length=7)
    assert prompt.max_length == 11 and prompt.new_token_bounds(7) == (0, 4)
    # greedy pads finished rows with pad_token_id, else the first end token; beam search fills with
    # `pad_token_id or eos_token_id[0]` (a pad id of 0 counts as missing), -1 without either
    assert DecodingRules.from_generation_config(GenerationConfig(eos_token_id=[4, 6])).pad_token_id == 4
    zero_pad = DecodingRules.from_generation_config(GenerationConfig(eos_token_id=[4, 6], pad_token_id=0))
    assert zero_pad.pad_token_id == 0 and zero_pad.beam_fill_value == 4
    assert DecodingRules.from_generation_config(GenerationConfig()).beam_fill_value == -1
    assert token_ids(torch.tensor([3, 4])) == [3, 4] and token_ids(5) == [5] and token_ids(None) == []


def test_finished_rows_get_the_pad_token_and_rows_stop_at_an_end_token_or_the_maximum_length():
    rules = DecodingRules.from_generation_config(GenerationConfig(eos_token_id=[2, 5], pad_token_id=0, max_length=6))
    controls = rules.controls(VOCAB, "cpu")
    unfinished, pad, step = torch.tensor([1, 1, 0, 1]), torch.tensor(0), torch.tensor
    tokens, unfinished, running = advance_greedy(step([2, 7, 9, 5]), step(3), unfinished, pad, controls)
    assert tokens.tolist() == [2, 7, 0, 5] and unfinished.tolist() == [0, 1, 0, 0] and bool(running)
    tokens, unfinished, running = advance_greedy(step([8, 8, 8, 8]), step(5), unfinished, pad, controls)
    assert tokens.tolist() == [0, 8, 0, 0] and unfinished.tolist() == [0, 0, 0, 0] and not bool(running)


def test_the_ctranslate2_options_come_from_the_same_rules():
    """CTranslate2 took min_new_tokens instead of min_length where both were given (generate applies both)."""
    from hf_vit_plus.models.pipeline_text2text_generation import CTranslate2Generator

    vocabulary = SimpleNamespace(target_tokens=[f"t{i}" for i in range(VOCAB)])
    config = GenerationConfig(eos_token_id=2, min_length=6, min_new_tokens=2, max_new_tokens=9, num_beams=3,
                              bad_words_ids=[[7]], length_penalty=0.6)  # fmt: skip
    options = CTranslate2Generator._options(vocabulary, config)
    assert (options["min_decoding_length"], options["max_decoding_length"]) == (5, 9)
    assert options["beam_size"] == 3 and options["length_penalty"] == 0.6 and options["end_token"] == ["t2"]
    assert options["suppress_sequences"] == [["t7"]]
