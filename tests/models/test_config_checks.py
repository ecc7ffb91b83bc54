"""Every config field is checked for its kind before anything else runs: finite numbers in range, ints that are ints,
bools that are bools, strings that are strings; a typo of a field name warns with the closest field."""

from __future__ import annotations

import math
import warnings

import pytest

from hf_vit_plus import Seq2SeqTransformerConfig, SparseTransformerConfig, ViTPlusConfig
from hf_vit_plus.models.config_checks import FieldTypeError

TINY = {
    ViTPlusConfig: dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=8,
                        patch_size=4),
    SparseTransformerConfig: dict(vocab_size=20, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32, sparse_stride=4,
                                  sparse_summary_size=1),
    Seq2SeqTransformerConfig: dict(vocab_size=20, d_model=32, encoder_layers=1, decoder_layers=1,
                                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                   decoder_ffn_dim=64, max_position_embeddings=32),
}  # fmt: skip
LN_EPS = {
    ViTPlusConfig: "layer_norm_eps",
    SparseTransformerConfig: "layer_norm_eps",
    Seq2SeqTransformerConfig: "layer_norm_eps",
}
INIT = {
    ViTPlusConfig: "initializer_range",
    SparseTransformerConfig: "initializer_range",
    Seq2SeqTransformerConfig: "init_std",
}
ACT = {
    ViTPlusConfig: "hidden_act",
    SparseTransformerConfig: "hidden_act",
    Seq2SeqTransformerConfig: "activation_function",
}
WIDTH = {ViTPlusConfig: "hidden_size", SparseTransformerConfig: "hidden_size", Seq2SeqTransformerConfig: "d_model"}
CONFIGS = list(TINY)


def build(cls, **overrides):
    return cls(**{**TINY[cls], **overrides})


@pytest.mark.parametrize("cls", CONFIGS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.0, -1e-5])
def test_non_finite_or_non_positive_numbers_are_refused(cls, value):
    """layer_norm_eps=nan built a model with NaN logits; initializer_range=0 divided by zero in the initialiser."""
    for name in (LN_EPS[cls], INIT[cls]):
        with pytest.raises(ValueError, match=rf"`{name}` must be a finite positive number, got {value!r}"):
            build(cls, **{name: value})


@pytest.mark.parametrize("cls", CONFIGS)
def test_ints_are_ints_and_bools_are_bools(cls):
    width = WIDTH[cls]
    with pytest.raises(FieldTypeError, match=rf"`{width}` must be a positive integer, got 32.0 \(float\)"):
        build(cls, **{width: 32.0})  # not truncated
    with pytest.raises(FieldTypeError, match=rf"`{width}` must be a positive integer, got True"):
        build(cls, **{width: True})
    if cls is not ViTPlusConfig:  # (the ViT ties nothing)
        with pytest.raises(FieldTypeError, match=r"`tie_word_embeddings` must be True or False, got 'false' \(str\)"):
            build(cls, tie_word_embeddings="false")  # a non-empty string is truthy: it would have tied
    if cls is not Seq2SeqTransformerConfig:
        with pytest.raises(FieldTypeError, match=r"`qkv_bias` must be True or False, got 'false'"):
            build(cls, qkv_bias="false")


@pytest.mark.parametrize("cls", CONFIGS)
def test_strings_are_strings(cls):
    with pytest.raises(FieldTypeError, match=rf"`{ACT[cls]}` must be a string, got \['gelu'\] \(list\)"):
        build(cls, **{ACT[cls]: ["gelu"]})  # was "unhashable type: 'list'"


@pytest.mark.parametrize("cls", CONFIGS)
def test_the_fields_transformers_reads_first_are_checked_before_it(cls):
    with pytest.raises(FieldTypeError, match=r"`num_labels` must be a positive integer, got 2.0 \(float\)"):
        build(cls, num_labels=2.0)
    with pytest.raises(ValueError, match=r"`num_labels` must be at most 1,048,576, got 1,000,000,000"):
        build(cls, num_labels=10**9)  # transformers built a billion-entry id2label dict (MemoryError)
    with pytest.raises(FieldTypeError, match=r"`vocab_size` must be a positive integer, got \[4, 4\] \(list\)"):
        build(cls, vocab_size=[4, 4]) if cls is not ViTPlusConfig else SparseTransformerConfig(vocab_size=[4, 4])
    with pytest.raises(ValueError, match=r"`.*` must be at most 2,147,483,647"):
        build(cls, **{WIDTH[cls]: 2**40})


@pytest.mark.parametrize("cls", CONFIGS)
def test_a_typo_of_a_field_warns_with_the_closest_field(cls):
    width = WIDTH[cls]
    typo = width.replace("_", "", 1) if "_" in width else width[:-1] + "x"
    with pytest.warns(UserWarning, match=rf"unknown field '{typo}' .*did you mean '{width}'\?"):
        build(cls, **{typo: 64})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(cls, num_labels=3, architectures=["X"], my_own_note="kept")  # known keys and far-off names: silent


@pytest.mark.parametrize("cls", CONFIGS)
def test_saved_configs_load_unchanged(cls, tmp_path):
    config = build(cls, num_labels=4)
    config.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = cls.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
