"""Every config field is checked for its kind before anything else runs: finite numbers in range, ints that are ints,
bools that are bools, strings that are strings; a typo of a field name warns with the closest field."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import time
import warnings
from logging import WARNING
from pathlib import Path

import pytest
from transformers import AutoConfig, PretrainedConfig
from transformers.utils import logging as transformers_logging

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
    generation_setting_names,
    pretrained_config_names,
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


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("hf_vit_plus") and r.levelno >= WARNING]


def quietly(caplog, function, *args, **kwargs):
    """`function(*args, **kwargs)`, failing on any warning (of Python's or logged by the package)."""
    caplog.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = function(*args, **kwargs)
    assert warnings_of(caplog) == []
    return result


def logged(caplog, function, *args, **kwargs) -> str:
    """The one warning `function(*args, **kwargs)` logs through the package's logger."""
    caplog.clear()
    function(*args, **kwargs)
    messages = warnings_of(caplog)
    assert len(messages) == 1, messages
    return messages[0]


@pytest.mark.parametrize("cls", CONFIGS)
def test_a_typo_of_a_field_warns_with_the_closest_field(cls, caplog):
    width = WIDTH[cls]
    typo = width.replace("_", "", 1) if "_" in width else width[:-1] + "x"
    message = logged(caplog, build, cls, **{typo: 64})
    assert re.search(rf"{cls.__name__} does not use `{typo}`=64 \(kept in the config, unused\): did you mean "
                     rf"`{width}`", message), message  # fmt: skip
    quietly(caplog, build, cls, num_labels=3, architectures=["X"], id2label={0: "a", 1: "b", 2: "c"})


@pytest.mark.parametrize("cls", CONFIGS)
def test_saved_configs_load_unchanged(cls, tmp_path, caplog):
    config = build(cls, num_labels=4)
    config.save_pretrained(tmp_path)
    loaded = quietly(caplog, cls.from_pretrained, tmp_path)
    assert loaded.to_dict() == config.to_dict()


@pytest.mark.parametrize("family", ["vit", "seq2seq", "sparse-lm"])
def test_the_configs_of_release_0_1_load_without_a_warning(family, caplog):
    folder = Path(__file__).parents[1] / "fixtures" / "release_0_1" / family
    config = quietly(caplog, AutoConfig.from_pretrained, folder)
    assert type(config).__name__ in {"ViTPlusConfig", "Seq2SeqTransformerConfig", "SparseTransformerConfig"}


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
# Typos of the keys of transformers' base config, which every config takes
TRANSFORMERS_TYPOS = {
    "output_attention": "output_attentions", "output_hidden_state": "output_hidden_states", "id2labels": "id2label",
    "problem_typ": "problem_type", "return_dicts": "return_dict",
}  # fmt: skip


@pytest.mark.parametrize("cls", CONFIGS)
def test_a_typo_of_a_field_or_of_a_transformers_key_warns_and_names_it(cls, caplog):
    for typo, field in {**TYPOS[cls], **TRANSFORMERS_TYPOS}.items():
        message = logged(caplog, build, cls, **{typo: 7})
        assert f"{cls.__name__} does not use `{typo}`=7" in message and f"did you mean `{field}`" in message, message
        assert getattr(build(cls, **{typo: 7}), typo) == 7  # kept, as transformers keeps unknown keys


def _valid_value(cls, field: str):
    """A value of `field` that is valid in the tiny config and differs from the field's default."""
    if field in TINY[cls]:
        return TINY[cls][field]
    default = getattr(cls(), field)
    if isinstance(default, str):
        return "relu" if default != "relu" else "gelu"
    if isinstance(default, float):
        return 0.125 if default != 0.125 else 0.25
    raise AssertionError(f"no test value for {field}")


@pytest.mark.parametrize("cls", CONFIGS)
def test_the_names_other_configs_give_a_field_set_it(cls, caplog, tmp_path):
    """`ViTPlusConfig(layer_norm_epsilon=1e-5, num_layers=3, n_embd=64)` kept layer_norm_eps=1e-06, 12 layers and
    width 768, silently: each name of the config's `attribute_map` sets its field, and the config saves the field."""
    assert len(cls.attribute_map) >= 8
    for alias, field in cls.attribute_map.items():
        value = _valid_value(cls, field)
        tiny = {k: v for k, v in TINY[cls].items() if k != field}
        config = quietly(caplog, cls, **tiny, **{alias: value})
        assert getattr(config, field) == value and getattr(config, alias) == value, (alias, field)
        assert alias not in config.to_dict(), alias
        config.save_pretrained(tmp_path)
        assert getattr(cls.from_pretrained(tmp_path), field) == value, (alias, field)


def test_the_issue_example_keeps_every_value(caplog):
    config = quietly(caplog, ViTPlusConfig, layer_norm_epsilon=1e-5, num_layers=3, n_embd=64, n_head=4)
    assert (config.layer_norm_eps, config.num_hidden_layers, config.hidden_size) == (1e-5, 3, 64)
    tiny = {k: v for k, v in TINY[SparseTransformerConfig].items() if k != "max_position_embeddings"}
    lm = quietly(caplog, SparseTransformerConfig, **tiny, n_positions=64)
    assert lm.max_position_embeddings == 64


@pytest.mark.parametrize("cls", CONFIGS)
def test_a_field_under_two_names_at_two_values_is_refused(cls):
    alias = next(alias for alias, field in cls.attribute_map.items() if field == WIDTH[cls] and alias != WIDTH[cls])
    with pytest.raises(ValueError, match=rf"got `{WIDTH[cls]}`=32 and `{alias}`=64: `{alias}` is another name of"):
        build(cls, **{alias: 64})
    assert getattr(build(cls, **{alias: 32}), WIDTH[cls]) == 32  # the same value twice is no conflict


@pytest.mark.parametrize("cls", CONFIGS)
def test_a_value_under_another_name_is_checked_under_that_name(cls):
    alias = next(alias for alias, field in cls.attribute_map.items() if field == LN_EPS[cls])
    with pytest.raises(ValueError, match=rf"`{alias}` must be a finite positive number, got nan"):
        build(cls, **{alias: math.nan})


@pytest.mark.parametrize("cls", CONFIGS)
def test_generation_settings_and_names_of_no_field_warn(cls, caplog):
    message = logged(caplog, build, cls, num_beams=4)
    assert "`num_beams`=4" in message and "generation setting" in message and "generation_config" in message
    message = logged(caplog, build, cls, rms_norm_eps=1e-6)  # Llama's, close to layer_norm_eps, another norm
    assert "does not use `rms_norm_eps`" in message and "did you mean `layer_norm_eps`" in message, message
    message = logged(caplog, build, cls, my_own_note="kept")
    assert "does not use `my_own_note`='kept' (kept in the config, unused): no field has a similar name" in message
    message = logged(caplog, build, cls, rope_theta=10000.0)  # transformers' base config reads it; no model here
    assert "does not use `rope_theta`" in message


def test_the_encoder_decoder_names_both_fields_of_a_name_for_both_stacks(caplog):
    for name, fields in [("num_layers", "`encoder_layers` and `decoder_layers`"),
                         ("num_heads", "`encoder_attention_heads` and `decoder_attention_heads`"),
                         ("d_ff", "`encoder_ffn_dim` and `decoder_ffn_dim`")]:  # fmt: skip
        message = logged(caplog, build, Seq2SeqTransformerConfig, **{name: 4})
        assert f"does not use `{name}`=4" in message and f"it may mean {fields}" in message, message


@pytest.mark.parametrize("cls", CONFIGS)
def test_transformers_verbosity_rules_the_warning(cls, caplog):
    """A warning through the package's logger, not a UserWarning: `transformers.logging.set_verbosity_error()`
    silences it, as it silences transformers' own."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logged(caplog, build, cls, output_attention=True)
    transformers_logging.set_verbosity_error()
    try:
        quietly(caplog, build, cls, output_attention=True)
    finally:
        transformers_logging.set_verbosity_warning()


@pytest.mark.parametrize("cls", CONFIGS)
def test_the_keys_of_transformers_base_config_pass(cls, caplog):
    quietly(caplog, build, cls, num_labels=3, problem_type="single_label_classification", output_hidden_states=True,
            output_attentions=False, return_dict=True, dtype="float32", chunk_size_feed_forward=0,
            id2label={0: "a", 1: "b", 2: "c"}, label2id={"a": 0, "b": 1, "c": 2}, architectures=["X"])  # fmt: skip


def test_a_folder_transformers_trainer_saved_loads_without_a_warning(tmp_path, caplog):
    """transformers' `Trainer` sets `use_cache` on the model's config (a quantized model's loading sets
    `quantization_config`): a key transformers writes itself is no unknown keyword, for ours as for its ViTConfig."""
    from transformers import Trainer, TrainingArguments, ViTConfig

    from hf_vit_plus import ViTPlusForImageClassification

    model = ViTPlusForImageClassification(ViTPlusConfig(**TINY[ViTPlusConfig], num_labels=2))
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), report_to="none", use_cpu=True)
    Trainer(model=model, args=args).save_model(str(tmp_path / "saved"))
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert "use_cache" in saved  # written by Trainer
    loaded = quietly(caplog, ViTPlusForImageClassification.from_pretrained, tmp_path / "saved")
    quietly(caplog, AutoConfig.from_pretrained, tmp_path / "saved")
    quietly(caplog, build, ViTPlusConfig, quantization_config={"quant_method": "bitsandbytes", "load_in_8bit": True})
    vit = quietly(caplog, ViTConfig.from_dict, {**saved, "model_type": "vit"})
    assert hasattr(loaded.config, "use_cache") == hasattr(vit, "use_cache")  # transformers' base config decides


def test_the_known_names_come_from_the_installed_transformers():
    base = pretrained_config_names()
    if dataclasses.is_dataclass(PretrainedConfig):
        assert {field.name for field in dataclasses.fields(PretrainedConfig)} <= base
    assert {"num_labels", "id2label", "problem_type", "dtype", "torch_dtype", "output_attentions", "return_dict",
            "chunk_size_feed_forward", "architectures", "model_type", "_name_or_path"} <= base  # fmt: skip
    generation = generation_setting_names()
    assert {"num_beams", "max_length", "do_sample", "temperature"} <= generation and not generation & base
    assert not {"hiden_size", "rope_theta", "layer_norm_epsilon"} & (base | generation)


def test_the_first_unknown_keyword_costs_milliseconds_and_imports_no_config_of_transformers(caplog):
    """The first near-miss once imported every config of transformers (about 1,300 modules, 2-5 s)."""
    caches = (pretrained_config_names, generation_setting_names, config_checks._init_defaults)
    times = []
    for _ in range(5):
        for cache in caches:
            cache.cache_clear()
        before = {name for name in sys.modules if name.startswith("transformers.models.")}
        start = time.perf_counter()
        logged(caplog, ViTPlusConfig, output_attention=True)
        times.append(time.perf_counter() - start)
        assert {name for name in sys.modules if name.startswith("transformers.models.")} == before
    assert min(times) < 0.05, times


def test_a_config_built_from_its_own_fields_computes_no_names(monkeypatch, caplog):
    calls = []

    def recording(function):
        def wrapper():
            calls.append(function.__name__)
            return function()

        return wrapper

    for name in ("pretrained_config_names", "generation_setting_names"):
        monkeypatch.setattr(config_checks, name, recording(getattr(config_checks, name)))
    for cls in CONFIGS:
        quietly(caplog, build, cls)
    assert calls == []


def test_a_caller_may_check_keywords_for_its_own_class(caplog):
    message = logged(caplog, check_transformers_kwargs, Seq2SeqTransformerConfig, {"hiden_size": 1})
    assert "Seq2SeqTransformerConfig does not use `hiden_size`=1" in message and "`hidden_size` (`d_model`)" in message
    quietly(caplog, check_transformers_kwargs, Seq2SeqTransformerConfig, {"hidden_size": 1})
