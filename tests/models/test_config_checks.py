"""Every config field is checked for its kind before anything else runs: finite numbers in range, ints that are ints,
bools that are bools, strings that are strings; a typo of a field name warns with the closest field."""

from __future__ import annotations

import dataclasses
import difflib
import math
import warnings

import pytest
from transformers import CONFIG_MAPPING, GPT2Config, PretrainedConfig

from hf_vit_plus import Seq2SeqTransformerConfig, SparseTransformerConfig, ViTPlusConfig
from hf_vit_plus.models import (
    config_checks,
    configuration_seq2seq_transformer,
    configuration_sparse_transformer,
    configuration_vit_plus,
)
from hf_vit_plus.models.config_checks import (
    FieldTypeError,
    check_transformers_kwargs,
    pretrained_config_names,
    transformers_config_names,
)

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


# Keyword arguments of transformers' configs, several of them close to a field of ours (layer_norm_epsilon, GPT-2's
# name, to layer_norm_eps; hidden_dropout, Falcon's, to hidden_dropout_prob): none is a typo. (`tie_word_embeddings`
# is left out: the ViT ties nothing, and the token models take it as their own field.)
TRANSFORMERS_KWARGS = dict(
    layer_norm_epsilon=1e-6, rms_norm_eps=1e-6, n_embd=32, n_head=2, n_layer=1, n_positions=32, hidden_dropout=0.0,
    problem_type="single_label_classification", output_hidden_states=True, output_attentions=False, use_cache=True,
    return_dict=True, dtype="float32", torch_dtype="float32", chunk_size_feed_forward=0, id2label={0: "a", 1: "b"},
    label2id={"a": 0, "b": 1}, pad_token_id=0, is_decoder=False, max_length=20, num_beams=1,
)  # fmt: skip
KEPT = ("layer_norm_epsilon", "rms_norm_eps", "n_embd", "hidden_dropout", "problem_type", "output_hidden_states")
FIELDS = {
    ViTPlusConfig: configuration_vit_plus.FIELD_CHECKS,
    SparseTransformerConfig: configuration_sparse_transformer.FIELD_CHECKS,
    Seq2SeqTransformerConfig: configuration_seq2seq_transformer.FIELD_CHECKS,
}
# Genuine typos of each config's fields, and the field the warning suggests (`hidden_size` of the encoder-decoder is
# its attribute_map's name for d_model).
TYPOS = {
    ViTPlusConfig: {"hiden_size": "hidden_size", "num_hiden_layers": "num_hidden_layers", "patch_sise": "patch_size",
                    "layer_norm_epss": "layer_norm_eps", "intermediat_size": "intermediate_size"},
    SparseTransformerConfig: {"hiden_size": "hidden_size", "num_hiden_layers": "num_hidden_layers",
                              "sparse_strid": "sparse_stride", "layer_norm_epss": "layer_norm_eps"},
    Seq2SeqTransformerConfig: {"dmodel": "d_model", "hiden_size": "hidden_size", "decoder_ffn_dims": "decoder_ffn_dim",
                               "layer_norm_epss": "layer_norm_eps",
                               "encoder_atention_heads": "encoder_attention_heads"},
}  # fmt: skip


def silently(function, *args, **kwargs):
    """`function(*args, **kwargs)`, failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return function(*args, **kwargs)


@pytest.mark.parametrize("cls", CONFIGS)
@pytest.mark.parametrize("key", list(TRANSFORMERS_KWARGS))
def test_the_keywords_of_transformers_configs_are_not_typos(cls, key):
    """`ViTPlusConfig(layer_norm_epsilon=1e-6)` warned "did you mean 'layer_norm_eps'?"; transformers' common tests
    and users' scripts pass such keywords. They are kept silently, as transformers keeps unknown keys."""
    value = TRANSFORMERS_KWARGS[key]
    config = silently(build, cls, **{key: value})
    if key in KEPT:
        assert getattr(config, key) == value


@pytest.mark.parametrize("cls", CONFIGS)
def test_the_names_of_attribute_maps_are_not_typos(cls):
    """The config's own `attribute_map` (the encoder-decoder's `hidden_size` for `d_model`, ...), GPT-2's (`n_embd`
    for `hidden_size`, ...) and every name an `attribute_map` of transformers' configs holds that is close to one of
    our fields (e.g. `layer_norm_epsilon`, `encoder_attention_heads`)."""
    silently(build, cls, **{alias: TINY[cls][target] for alias, target in cls.attribute_map.items()})
    config = build(cls)
    silently(build, cls, **{name: 4 for name in GPT2Config.attribute_map.values() if not hasattr(config, name)})
    fields = list(FIELDS[cls])
    names = {name for model_type in CONFIG_MAPPING for pair in CONFIG_MAPPING[model_type].attribute_map.items()
             for name in pair}  # fmt: skip
    close = [
        name
        for name in sorted(names)
        if difflib.get_close_matches(name, fields, n=1, cutoff=0.8) and not hasattr(config, name)
    ]
    assert close  # there is something to test (which names depends on the release: 5.24's include layer_norm_epsilon)
    for name in close:
        silently(build, cls, **{name: None})


@pytest.mark.parametrize("cls", CONFIGS)
def test_a_typo_of_a_field_still_warns_and_names_the_field(cls):
    for typo, field in TYPOS[cls].items():
        message = rf"{cls.__name__} got an unknown field '{typo}' .*did you mean '{field}'"
        with pytest.warns(UserWarning, match=message):
            config = build(cls, **{typo: 7})
        assert getattr(config, typo) == 7  # kept, as transformers keeps unknown keys


def test_the_known_names_come_from_the_installed_transformers():
    base = pretrained_config_names()
    if dataclasses.is_dataclass(PretrainedConfig):
        assert {field.name for field in dataclasses.fields(PretrainedConfig)} <= base
    assert {"num_labels", "id2label", "problem_type", "dtype", "torch_dtype", "output_attentions", "return_dict",
            "chunk_size_feed_forward", "architectures", "model_type", "_name_or_path",
            "max_length"} <= base  # fmt: skip
    everything = transformers_config_names()
    assert base <= everything
    assert {field.name for field in dataclasses.fields(GPT2Config)} <= everything
    assert {"layer_norm_epsilon", "n_embd", "rms_norm_eps", "hidden_dropout", "tie_word_embeddings", "pad_token_id",
            "use_cache"} <= everything  # fmt: skip
    assert not {"hiden_size", "num_hiden_layers", "patch_sise"} & everything


def test_the_known_names_are_computed_only_for_an_unknown_keyword(monkeypatch):
    """A config built from its own fields pays nothing; a far-off unknown name only the base config's names (a few
    milliseconds); the configs of transformers are imported only for a name close to a field."""
    calls = []

    def recording(function):
        def wrapper():
            calls.append(function.__name__)
            return function()

        return wrapper

    for name in ("pretrained_config_names", "transformers_config_names"):
        monkeypatch.setattr(config_checks, name, recording(getattr(config_checks, name)))
    for cls in CONFIGS:
        silently(build, cls)
    assert calls == []
    silently(build, ViTPlusConfig, num_labels=3, my_own_note="kept")
    assert "pretrained_config_names" in calls and "transformers_config_names" not in calls
    silently(build, ViTPlusConfig, layer_norm_epsilon=1e-6)
    assert "transformers_config_names" in calls


def test_a_caller_may_name_its_config_class():
    with pytest.warns(UserWarning, match=r"X got an unknown field 'hiden_size' .*did you mean 'hidden_size'"):
        check_transformers_kwargs("X", {"hiden_size": 1}, ["d_model"], config_class=Seq2SeqTransformerConfig)
    silently(check_transformers_kwargs, "X", {"hidden_size": 1}, ["d_model"], config_class=Seq2SeqTransformerConfig)
