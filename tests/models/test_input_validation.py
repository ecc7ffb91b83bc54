"""Bad inputs to the token models (seq2seq Transformer, Sparse Transformer LM) raise a ValueError or TypeError naming
the argument and the offending value or shape, instead of an IndexError, a reshape error or a crash deep inside an
embedding or a kernel; valid edge cases (ignored labels, int32 ids, cached generation with growing masks) still pass,
and the value checks stay out of the way of torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch

from hf_vit_plus import (
    Seq2SeqTransformerConfig,
    Seq2SeqTransformerForConditionalGeneration,
    SparseTransformerConfig,
    SparseTransformerForCausalLM,
)
from hf_vit_plus.models.compat import output_cache

VOCAB = 20
MAX_POSITIONS = 32


def seq2seq_model(**overrides) -> Seq2SeqTransformerForConditionalGeneration:
    fields = dict(
        vocab_size=VOCAB,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        dropout=0.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    fields.update(overrides)
    torch.manual_seed(0)
    return Seq2SeqTransformerForConditionalGeneration(Seq2SeqTransformerConfig(**fields)).eval()


def sparse_lm(**overrides) -> SparseTransformerForCausalLM:
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=MAX_POSITIONS,
        attention_type="fixed",
        sparse_stride=4,
        sparse_summary_size=1,
    )
    fields.update(overrides)
    torch.manual_seed(0)
    return SparseTransformerForCausalLM(SparseTransformerConfig(**fields)).eval()


MODELS = {"seq2seq": seq2seq_model, "sparse-lm": sparse_lm}


def ids(*rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


SRC = ids([3, 4, 5, 6], [7, 8, 9, 10])  # (2, 4)
TGT = ids([1, 5, 6], [1, 7, 8])  # (2, 3)


def with_bad(tensor: torch.Tensor, batch: int, index: int, value: int) -> torch.Tensor:
    out = tensor.clone()
    out[batch, index] = value
    return out


# (family, case id, inputs, exception, regex the message must match)
BAD_INPUTS = [
    # Token ids outside the vocabulary: the id, the argument, the position (batch, index) and vocab_size.
    *(
        (family, f"input_ids={value}", {"input_ids": with_bad(SRC, 1, 2, value)}, ValueError,
         rf"`input_ids` holds the token id {value} at position \(batch=1, index=2\).*vocab_size={VOCAB}")
        for family in MODELS
        for value in (VOCAB, VOCAB + 7, -1)
    ),
    ("seq2seq", "decoder_input_ids=vocab", {"input_ids": SRC, "decoder_input_ids": with_bad(TGT, 0, 1, VOCAB)},
     ValueError, rf"`decoder_input_ids` holds the token id {VOCAB} at position \(batch=0, index=1\).*vocab_size=20"),
    ("seq2seq", "labels=vocab", {"input_ids": SRC, "labels": with_bad(TGT, 1, 2, VOCAB + 5)},
     ValueError, rf"`labels` holds the token id {VOCAB + 5} at position \(batch=1, index=2\).*vocab_size=20.*-100"),
    ("seq2seq", "labels=-5", {"input_ids": SRC, "labels": with_bad(TGT, 0, 0, -5)},
     ValueError, r"`labels` holds the token id -5 at position \(batch=0, index=0\).*-100"),
    ("sparse-lm", "labels=vocab", {"input_ids": SRC, "labels": with_bad(SRC, 1, 3, VOCAB)},
     ValueError, rf"`labels` holds the token id {VOCAB} at position \(batch=1, index=3\).*vocab_size=20.*-100"),
    ("sparse-lm", "labels=-5", {"input_ids": SRC, "labels": ids([3, 4, 5, 6], [7, -5, -5, 30])},
     ValueError, r"`labels` holds the token id -5 at position \(batch=1, index=1\) \(2 more out of range\)"),
    # Empty batches and sequences.
    *(
        (family, f"input_ids{shape}", {"input_ids": torch.zeros(shape, dtype=torch.long)}, ValueError,
         rf"`input_ids` is empty: shape \({shape[0]}, {shape[1]}\)")
        for family in MODELS
        for shape in ((1, 0), (0, 4))
    ),
    ("seq2seq", "decoder_input_ids(2, 0)",
     {"input_ids": SRC, "decoder_input_ids": torch.zeros(2, 0, dtype=torch.long)},
     ValueError, r"`decoder_input_ids` is empty: shape \(2, 0\)"),
    # Wrong dtypes and ranks.
    *(
        (family, "float input_ids", {"input_ids": SRC.float()}, TypeError, r"`input_ids`.*dtype torch.float32")
        for family in MODELS
    ),
    *(
        (family, "bool input_ids", {"input_ids": SRC > 5}, TypeError, r"`input_ids`.*dtype torch.bool")
        for family in MODELS
    ),
    *(
        (family, "3-D input_ids", {"input_ids": SRC[None]}, ValueError,
         r"`input_ids` must have shape \(batch, seq_len\), got shape \(1, 2, 4\)")
        for family in MODELS
    ),
    ("seq2seq", "float labels", {"input_ids": SRC, "labels": TGT.float()}, TypeError, r"`labels`.*torch.float32"),
    ("sparse-lm", "float labels", {"input_ids": SRC, "labels": SRC.float()}, TypeError, r"`labels`.*torch.float32"),
    # Padding masks that do not cover the tokens.
    *(
        (family, f"attention_mask{shape}", {"input_ids": SRC, "attention_mask": torch.ones(shape)}, ValueError,
         rf"`attention_mask` has shape {shape_re}.*`input_ids` of shape \(2, 4\).*\(2, 4\)")
        for family in MODELS
        for shape, shape_re in (((2, 5), r"\(2, 5\)"), ((2, 3), r"\(2, 3\)"), ((1, 4), r"\(1, 4\)"), ((4,), r"\(4,\)"))
    ),
    ("seq2seq", "decoder_attention_mask(2, 5)",
     {"input_ids": SRC, "decoder_input_ids": TGT, "decoder_attention_mask": torch.ones(2, 5)},
     ValueError, r"`decoder_attention_mask` has shape \(2, 5\).*`decoder_input_ids` of shape \(2, 3\).*\(2, 3\)"),
    # Longer than the position table.
    ("seq2seq", "source too long", {"input_ids": torch.full((1, MAX_POSITIONS + 3), 3)},
     ValueError, rf"source sequence has {MAX_POSITIONS + 3} positions but max_position_embeddings is {MAX_POSITIONS}"),
    ("seq2seq", "target too long", {"input_ids": SRC, "decoder_input_ids": torch.full((2, MAX_POSITIONS + 1), 3)},
     ValueError, rf"target sequence has {MAX_POSITIONS + 1} positions but max_position_embeddings is {MAX_POSITIONS}"),
    ("sparse-lm", "input too long", {"input_ids": torch.full((1, MAX_POSITIONS + 3), 3)},
     ValueError, rf"{MAX_POSITIONS + 3} tokens, longer than `max_position_embeddings` \({MAX_POSITIONS}\)"),
]  # fmt: skip


@pytest.mark.parametrize(
    "family,inputs,error,match",
    [
        pytest.param(family, inputs, error, match, id=f"{family}-{name}")
        for family, name, inputs, error, match in BAD_INPUTS
    ],
)
def test_bad_input_raises_naming_the_argument_and_the_value(family, inputs, error, match):
    model = MODELS[family]()
    if family == "seq2seq" and "decoder_input_ids" not in inputs and "labels" not in inputs:
        inputs = {**inputs, "decoder_input_ids": TGT[: inputs["input_ids"].shape[0]]}
    with pytest.raises(error, match=match):
        model(**inputs)


def test_seq2seq_source_mask_is_checked_against_given_encoder_outputs():
    model = seq2seq_model()
    encoder_outputs = model.get_encoder()(SRC)
    with pytest.raises(ValueError, match=r"`attention_mask` has shape \(2, 6\).*encoder output.*\(2, 4\)"):
        model(encoder_outputs=encoder_outputs, attention_mask=torch.ones(2, 6), decoder_input_ids=TGT)


@pytest.mark.parametrize("family", list(MODELS))
def test_mask_during_cached_decoding_must_cover_past_and_new_tokens(family):
    """With a cache the padding mask covers the cached tokens plus the new ones (as `generate` builds it)."""
    model = MODELS[family]()
    if family == "seq2seq":
        first = model(input_ids=SRC, decoder_input_ids=TGT, use_cache=True)
        step = dict(input_ids=SRC, decoder_input_ids=ids([4], [5]), cache=output_cache(first))
        mask_name, given = "decoder_attention_mask", "decoder_input_ids"
    else:
        first = model(input_ids=SRC[:, :3], use_cache=True)
        step = dict(input_ids=ids([4], [5]), cache=output_cache(first))
        mask_name, given = "attention_mask", "input_ids"
    past = output_cache(first).get_seq_length()
    assert past == 3
    expected = rf"`{mask_name}` has shape \(2, 1\).*`{given}` of shape \(2, 1\) after 3 cached tokens.*\(2, 4\)"
    with pytest.raises(ValueError, match=expected):
        model(**step, **{mask_name: torch.ones(2, 1)}, use_cache=True)
    # The right length works, and gives the logits of the uncached forward over the whole sequence.
    cached = model(**step, **{mask_name: torch.ones(2, 4)}, use_cache=True).logits[:, -1]
    if family == "seq2seq":
        full = model(input_ids=SRC, decoder_input_ids=torch.cat([TGT, step["decoder_input_ids"]], 1)).logits[:, -1]
    else:
        full = model(input_ids=torch.cat([SRC[:, :3], step["input_ids"]], 1)).logits[:, -1]
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", list(MODELS))
def test_valid_edge_cases_pass(family):
    """-100 labels are ignored, int32 ids are token ids, the largest id is vocab_size - 1, a boolean mask is a mask."""
    model = MODELS[family]()
    src = with_bad(SRC, 0, 0, VOCAB - 1)
    labels = with_bad(TGT if family == "seq2seq" else SRC, 1, 1, -100)
    out = model(input_ids=src.int(), attention_mask=torch.ones(2, 4, dtype=torch.bool), labels=labels)
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("family", list(MODELS))
def test_generate_still_works_with_and_without_cache(family):
    model = MODELS[family]()
    mask = torch.ones_like(SRC)
    mask[1, :1] = 0  # left padding for the LM, a padded source token for seq2seq
    for settings in (dict(num_beams=1), dict(num_beams=2, num_return_sequences=2), dict(do_sample=True, top_k=3)):
        outputs = []
        for use_cache in (True, False):
            torch.manual_seed(1)
            generated = model.generate(
                SRC, attention_mask=mask, max_new_tokens=4, use_cache=use_cache, pad_token_id=0, **settings
            )
            outputs.append(generated)
        assert torch.equal(outputs[0], outputs[1]), settings


@pytest.mark.parametrize("family", list(MODELS))
def test_value_checks_are_skipped_under_compile_fullgraph(family):
    """The range checks read values (a graph break): they are skipped while torch.compile traces, so fullgraph=True
    still compiles the forward with labels (the eager backend keeps this fast; it still traces with dynamo)."""
    torch._dynamo.reset()
    model = MODELS[family]()
    inputs = {"input_ids": SRC, "labels": TGT if family == "seq2seq" else SRC}
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        expected = model(**inputs, use_cache=False)
        got = compiled(**inputs, use_cache=False)
    torch.testing.assert_close(got.logits, expected.logits)
    torch.testing.assert_close(got.loss, expected.loss)
