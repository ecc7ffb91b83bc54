"""Property-based tests of the input boundary: configs, forward, `generate`, loading and the command line.

Each drawn input (hypothesis, fixed seed) must end in one of two ways:
- it ran correctly: finite outputs of the expected shape (a config: a model built from it gives them);
- a clear error: a `ValueError` / `TypeError` (the command line: one `error:` line and exit status 2) whose message
  names the argument.
Anything else (another exception, an error that does not say what was wrong, a NaN output, a crash) is "unclear",
and the test fails on it. `make test` draws a small fixed-seed set per boundary; `make test-slow` a larger one.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_vit_plus import Seq2SeqTransformerConfig, SparseTransformerConfig, ViTPlusConfig
from hf_vit_plus.models.configuration_seq2seq_transformer import FIELD_CHECKS as SEQ2SEQ_FIELDS
from hf_vit_plus.models.configuration_sparse_transformer import FIELD_CHECKS as SPARSE_FIELDS
from hf_vit_plus.models.configuration_vit_plus import FIELD_CHECKS as VIT_FIELDS
from tests.conftest import MODEL_CASES, TINY_CONFIGS

CASES = {case.id: case for case in MODEL_CASES}
SIZES = {"default": 12, "large": 300}  # drawn examples per boundary: `make test` / `make test-slow`
RUNS = [pytest.param("default"), pytest.param("large", marks=pytest.mark.slow)]

# Values a user might pass by mistake, and borderline good ones.
ODD_VALUES = st.sampled_from(
    [0, -1, 1, 2, 3, 7, 16, 10**12, 2.0, 0.5, -0.5, 1.5, 1e-12, math.nan, math.inf, -math.inf, True, False, None, "",
     "2", "abc", "gelu", "false", [4, 4], [], {"a": 1}]
)  # fmt: skip


def _fuzz(run: str):
    return settings(
        max_examples=SIZES[run], derandomize=True, database=None, deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )  # fmt: skip


def _clear(error: BaseException, *names: str) -> bool:
    """A ValueError/TypeError whose message names one of `names`."""
    message = str(error)
    return isinstance(error, (ValueError, TypeError)) and any(name and name in message for name in names)


def _finite(*tensors) -> bool:
    """No NaN and no +inf (-inf logits are masked tokens: the image model's start token)."""
    floats = [t.float() for t in tensors if torch.is_tensor(t) and t.is_floating_point()]
    return all(not (t.isnan().any() or (t == math.inf).any()) for t in floats)


# -------------------------------------------------------------------------------------------------------- configs
CONFIGS = {
    "vit": (ViTPlusConfig, VIT_FIELDS),
    "seq2seq": (Seq2SeqTransformerConfig, SEQ2SEQ_FIELDS),
    "sparse-lm": (SparseTransformerConfig, SPARSE_FIELDS),
}
CASE_OF = {"vit": "vit-dense", "seq2seq": "seq2seq-dense", "sparse-lm": "sparse-lm-fixed-merged"}
EXTRA_FIELDS = ["num_labels", "vocab_size"]  # transformers' own, checked before it reads them


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("family", list(CONFIGS))
def test_configs(family, run):
    cls, fields = CONFIGS[family]
    case = CASES[CASE_OF[family]]

    @_fuzz(run)
    @given(name=st.sampled_from(sorted(fields) + EXTRA_FIELDS), value=ODD_VALUES)
    def check(name, value):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a typo warning is not an outcome
            try:
                config = case.config(**{name: value})
            except Exception as error:  # noqa: BLE001 - every outcome is classified
                assert _clear(error, name, cls.__name__), (
                    f"unclear: {name}={value!r} -> {type(error).__name__}: {error}"
                )
                return
        # accepted: a model built from it runs and gives finite outputs (or refuses, clearly, the common suite's
        # inputs that no longer fit it: a smaller vocabulary, one channel)
        model = case.head_class(config).eval()
        with torch.no_grad():
            try:
                logits = model(**case.inputs()).logits
            except Exception as error:  # noqa: BLE001
                outcome = f"{name}={value!r} accepted, then {type(error).__name__}: {error}"
                assert _clear(error, name, "`input_ids`", "`pixel_values`", "`labels`"), f"unclear: {outcome}"
                return
        assert _finite(logits), f"unclear: {name}={value!r} was accepted and gives non-finite logits"

    check()


# -------------------------------------------------------------------------------------------------------- forward
def _forward_inputs(case, draw_kind: str, value):
    """The case's valid inputs with one entry replaced by a drawn variant; returns (inputs, argument name)."""
    inputs = case.inputs()
    name = "pixel_values" if "pixel_values" in inputs else draw_kind
    if name not in inputs and draw_kind != "labels":
        name = "input_ids"
    base = inputs.get(name)
    variants = {
        "float": base.float() if torch.is_tensor(base) else base,
        "int32": base.int() if torch.is_tensor(base) else base,
        "bool": base.bool() if torch.is_tensor(base) else base,
        "empty-batch": base[:0] if torch.is_tensor(base) else base,
        "1-d": base.reshape(-1) if torch.is_tensor(base) else base,
        "extra-dim": base[None] if torch.is_tensor(base) else base,
        "negative": -(base.abs() + 1) if torch.is_tensor(base) else base,
        "huge": base * 0 + 10**6 if torch.is_tensor(base) else base,
        "nan": base.float() * math.nan if torch.is_tensor(base) else base,
        "list": base.tolist() if torch.is_tensor(base) else base,
        "none": None,
        "truncated": base[:, :-1] if torch.is_tensor(base) and base.dim() > 1 else base,
    }
    inputs[name] = variants[value]
    return inputs, name


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("case_id", ["vit-dense", "seq2seq-dense", "sparse-lm-strided-heads", "image-lm-dense"])
def test_forward(case_id, run):
    case = CASES[case_id]
    model = case.model()
    kinds = ["input_ids", "attention_mask", "decoder_input_ids", "labels", "position_ids"]
    variants = ["float", "int32", "bool", "empty-batch", "1-d", "extra-dim", "negative", "huge", "nan", "list",
                "none", "truncated"]  # fmt: skip

    @_fuzz(run)
    @given(kind=st.sampled_from(kinds), variant=st.sampled_from(variants), labels=st.booleans())
    def check(kind, variant, labels):
        inputs, name = _forward_inputs(case, kind, variant)
        if labels and "labels" not in inputs:
            inputs = {**case.inputs(labels=True), name: inputs.get(name)}
        inputs = {key: value for key, value in inputs.items() if value is not None or key == name}
        with torch.no_grad():
            try:
                out = model(**inputs)
            except Exception as error:  # noqa: BLE001
                assert _clear(error, name, "labels", "pixel", "input_ids", "attention_mask", "`"), (
                    f"unclear: {name}={variant} -> {type(error).__name__}: {error}"
                )
                return
        assert _finite(out.logits, out.loss if out.loss is not None else None), f"unclear: {name}={variant} -> NaN"

    check()


# ------------------------------------------------------------------------------------------------------- generate
GENERATE_ARGUMENTS = ["num_beams", "max_new_tokens", "num_return_sequences", "temperature", "top_k", "top_p",
                      "min_new_tokens", "no_repeat_ngram_size", "max_length", "repetition_penalty"]  # fmt: skip


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("case_id", ["seq2seq-dense", "sparse-lm-fixed-heads"])
def test_generate(case_id, run):
    case = CASES[case_id]
    model = case.model()
    prompt = {"input_ids": case.inputs(batch=1)["input_ids"][:, :4]}

    @_fuzz(run)
    @given(name=st.sampled_from(GENERATE_ARGUMENTS), value=ODD_VALUES, sample=st.booleans())
    def check(name, value, sample):
        settings_ = {"max_new_tokens": 3, "do_sample": sample, name: value}
        if name == "max_length" and isinstance(value, int) and not isinstance(value, bool):
            settings_.pop("max_new_tokens")
        torch.manual_seed(0)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # transformers' advice on unused settings
            try:
                out = model.generate(**prompt, **settings_)
            except Exception as error:  # noqa: BLE001
                assert _clear(error, name), f"unclear: generate({name}={value!r}) -> {type(error).__name__}: {error}"
                return
        assert torch.is_tensor(out) and out.dtype == torch.long and out.shape[0] >= 1, f"generate({name}={value!r})"

    check()


# -------------------------------------------------------------------------------------------------------- loading
def _break(folder: Path, how: str, value) -> str:
    """Damage a saved model folder; returns what an error should name."""
    config_path = folder / "config.json"
    weights = folder / "model.safetensors"
    if how == "no-config":
        config_path.unlink()
        return "config.json"
    if how == "config-not-object":
        config_path.write_text(json.dumps(value if not isinstance(value, dict) else [value]))
        return "config.json"
    if how == "config-not-json":
        config_path.write_text("{not json")
        return "config.json"
    if how == "field":
        config = json.loads(config_path.read_text())
        config["hidden_size"] = value
        config_path.write_text(json.dumps(config, default=str))
        return "hidden_size' 'another shape"
    if how == "model-type":
        config = json.loads(config_path.read_text())
        config["model_type"] = "seq2seq_transformer"
        config_path.write_text(json.dumps(config))
        return "seq2seq_transformer"
    if how == "wider":
        config = json.loads(config_path.read_text())
        config["intermediate_size"] = 48
        config_path.write_text(json.dumps(config))
        return "intermediate_size' 'fc1"
    if how == "truncated-weights":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
        return "model.safetensors"
    raise AssertionError(how)


@pytest.mark.parametrize("run", RUNS)
def test_loading(tmp_path_factory, run):
    from hf_vit_plus import ViTPlusForImageClassification

    saved = tmp_path_factory.mktemp("saved")
    CASES["vit-dense"].model().save_pretrained(saved)
    ways = ["no-config", "config-not-object", "config-not-json", "field", "model-type", "wider", "truncated-weights"]

    @_fuzz(run)
    @given(how=st.sampled_from(ways), value=ODD_VALUES)
    def check(how, value):
        folder = tmp_path_factory.mktemp("broken")
        shutil.copytree(saved, folder, dirs_exist_ok=True)
        names = _break(folder, how, value).split("' '")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                model = ViTPlusForImageClassification.from_pretrained(folder)
            except OSError as error:  # a corrupt weights file: CorruptCheckpointError names it
                assert any(name in str(error) for name in names), f"unclear: {how} -> {error}"
                return
            except Exception as error:  # noqa: BLE001
                assert _clear(error, *names), f"unclear: {how} ({value!r}) -> {type(error).__name__}: {error}"
                return
        with torch.no_grad():
            assert _finite(model(**CASES["vit-dense"].inputs()).logits), f"unclear: {how} loaded a NaN model"

    check()


# ---------------------------------------------------------------------------------------------- the command line
FLAGS = [
    "--learning_rate", "--weight_decay", "--adam_beta1", "--adam_beta2", "--adam_epsilon", "--max_grad_norm", "--seed",
    "--warmup_steps", "--warmup_ratio", "--per_device_train_batch_size", "--gradient_accumulation_steps",
    "--max_steps", "--num_train_epochs", "--logging_steps", "--eval_steps", "--save_steps", "--save_total_limit",
    "--report_to", "--max_train_samples", "--validation_split_percentage", "--config_overrides",
    "--lr_scheduler_type", "--mixed_precision", "--dataset", "--output_dir",
]  # fmt: skip
CLI_VALUES = ["0", "-1", "1", "2", "1.5", "-0.5", "nan", "inf", "1e30", "abc", "", "none", "epoch",
              "hidden_size=nan", "num_labels=3", "layer_norm_eps=-1", "hiden_size=2", "qkv_bias=maybe"]  # fmt: skip


@pytest.mark.parametrize("run", RUNS)
def test_command_line(tmp_path_factory, monkeypatch, fresh_accelerate_state, run):
    """Single-flag mistakes on `hf-vit-plus train vit`, run up to the first update (the updates themselves are
    stubbed out: every check must have happened by then)."""
    from hf_vit_plus.cli import main
    from hf_vit_plus.training import loop

    def no_training(run_, progress):
        progress.stop_reason = "stop_after_steps"

    monkeypatch.setattr(loop, "run_epochs", no_training)
    monkeypatch.setattr(loop, "stop_early", lambda run_, progress, seconds: loop.TrainResult.__new__(loop.TrainResult))
    quick = ["--max_train_samples", "32", "--max_eval_samples", "16", "--per_device_train_batch_size", "8",
             "--report_to", "none", "--save_steps", "none", "--write_card", "false"]  # fmt: skip

    @_fuzz(run)
    @given(flag=st.sampled_from(FLAGS), value=st.sampled_from(CLI_VALUES))
    def check(flag, value):
        output = tmp_path_factory.mktemp("run")
        if flag == "--output_dir" and value not in ("", "none"):
            (output / "file").write_text("x")
            value = str(output / "file")
        argv = ["train", "vit", "--output_dir", str(output), *quick, flag, value]
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
        except Exception as error:  # noqa: BLE001
            raise AssertionError(f"unclear: {flag} {value!r} -> traceback {type(error).__name__}: {error}") from error
        if code == 0:
            return  # accepted, and the run got to its first update
        lines = [line for line in stderr.getvalue().splitlines() if "error:" in line]
        assert code == 2 and lines, f"unclear: {flag} {value!r} -> exit {code}: {stderr.getvalue()[-500:]}"
        named = flag.lstrip("-") in lines[-1] or (value and value.split("=")[0] in lines[-1])
        assert named, f"unclear: {flag} {value!r} -> {lines[-1]}"

    check()


def test_the_tiny_configs_are_the_common_suites():
    assert set(CASE_OF.values()) <= set(CASES) and set(CONFIGS) <= set(TINY_CONFIGS)


# ------------------------------------------------------------------------------------ inputs fuzzing once found
def _vit():
    return CASES["vit-dense"].model().eval()


def _lm():
    return CASES["sparse-lm-strided-heads"].model().eval()


def _empty_config_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    from hf_vit_plus import ViTPlusForImageClassification

    return ViTPlusForImageClassification.from_pretrained(tmp_path)


# (what is run, what a clear error names; None: it must run and give finite outputs)
FOUND = {
    "vit labels as a list": (lambda tmp: _vit()(**CASES["vit-dense"].inputs(), labels=[0, 1]).loss, None),
    "vit empty width": (
        lambda tmp: _vit()(pixel_values=torch.randn(1, 3, 20, 0), interpolate_pos_encoding=True),
        "pixel_values",
    ),
    "lm empty sequence, a position": (
        lambda tmp: _lm()(input_ids=torch.zeros(2, 0, dtype=torch.long), position_ids=torch.zeros(2, 1).long()),
        "input_ids",
    ),
    "lm positions of another length": (
        lambda tmp: _lm()(input_ids=torch.ones(2, 3, dtype=torch.long), position_ids=torch.zeros(2, 1).long()),
        "position_ids",
    ),
    "processor given numbers": (lambda tmp: _processor()(images=[[1, 2], [3, 4]]), "images[0][0]"),
    "generate with 3-D input_ids": (
        lambda tmp: _lm().generate(input_ids=torch.ones(2, 3, 4, dtype=torch.long), num_beams=2, max_new_tokens=2),
        "input_ids",
    ),
    "huge initializer_range": (lambda tmp: SparseTransformerConfig(initializer_range=2**31), "initializer_range"),
    "an encoder-decoder that is not one": (
        lambda tmp: Seq2SeqTransformerConfig(is_encoder_decoder=False),
        "is_encoder_decoder",
    ),
    "a config.json of {}": (_empty_config_folder, "model_type"),
}


def _processor():
    from hf_vit_plus import ViTPlusImageProcessor

    return ViTPlusImageProcessor.from_model_config(CASES["vit-dense"].config())


@pytest.mark.parametrize("name", list(FOUND))
def test_the_inputs_fuzzing_found_end_clearly(name, tmp_path):
    """Each input the property-based tests once found ending in a traceback or a silent wrong result, by name."""
    run, names = FOUND[name]
    with torch.no_grad():
        try:
            out = run(tmp_path)
        except Exception as error:  # noqa: BLE001 - every outcome is classified
            assert names is not None and _clear(error, names), f"unclear: {name} -> {type(error).__name__}: {error}"
            return
    assert names is None, f"{name} ran, expected an error naming {names}"
    assert _finite(out), f"{name} gives non-finite outputs"
