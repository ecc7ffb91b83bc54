"""The run's decisions, made once into a frozen plan (`training/plan.py`): precision, sharding, activation
checkpointing (the launch the Accelerator is built from), the checkpoint to resume and its processor; the loop, the
Accelerator and the first lines read it."""

from __future__ import annotations

import dataclasses

import pytest

from hf_vit_plus.training import sharding
from hf_vit_plus.training.args import family_arguments
from hf_vit_plus.training.loop import train
from hf_vit_plus.training.plan import Launch, RunPlan, decide_launch, preview_plan, resume_point
from tests.utils import TINY_VIT_OVERRIDES, run_report


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    """A plain process: none of the variables `accelerate launch` sets."""
    import os

    for name in list(os.environ):
        if name.startswith(("ACCELERATE_", "FSDP_")):
            monkeypatch.delenv(name)


def tiny(tmp_path, name="run", **overrides):
    values = dict(output_dir=str(tmp_path / name), config_overrides=TINY_VIT_OVERRIDES, report_to="none",
                  write_card=False, max_train_samples=32, max_eval_samples=16, per_device_train_batch_size=16,
                  save_steps="none", max_steps=1, use_cpu=True)  # fmt: skip
    values.update(overrides)
    return family_arguments("vit", **values)


@pytest.mark.parametrize(
    "flags, environ, native, precision, chosen_by",
    [
        (dict(recipe="deit"), {}, True, "bf16", "--recipe deit"),
        (dict(recipe="deit"), {}, False, "no", "--recipe deit"),
        (dict(recipe="deit", mixed_precision="no"), {}, True, "no", "--mixed_precision"),
        (dict(recipe="deit"), {"ACCELERATE_MIXED_PRECISION": "bf16"}, True, None, "the launcher"),
        (dict(recipe="none"), {}, True, None, "the default"),
    ],
)
def test_the_plan_decides_the_precision_and_says_who_chose_it(
    tmp_path, monkeypatch, flags, environ, native, precision, chosen_by
):
    from accelerate.state import AcceleratorState

    from hf_vit_plus.models import compat

    AcceleratorState._reset_state(True)  # a fresh process as far as Accelerate knows
    monkeypatch.setattr(compat, "cpu_has_native_bf16_products", lambda: native)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    launch = decide_launch(tiny(tmp_path, **flags))
    assert launch.mixed_precision == precision and launch.precision_from == chosen_by
    assert launch.on_cpu and not launch.sharded


def test_fsdp_activation_checkpointing_is_decided_into_the_arguments(tmp_path, monkeypatch):
    launch = decide_launch(tiny(tmp_path, fsdp=True, fsdp_config='{"activation_checkpointing": true}'))
    assert launch.activation_checkpointing and launch.checkpointing_from == "--fsdp_config"
    assert launch.request.fsdp and launch.sharded
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    launch = decide_launch(tiny(tmp_path))
    assert launch.activation_checkpointing and launch.checkpointing_from == "the accelerate config"
    assert launch.request.fsdp_from == sharding.LAUNCHER_FSDP
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    plain = decide_launch(tiny(tmp_path))
    assert not plain.activation_checkpointing and plain.checkpointing_from is None


def test_the_plan_is_frozen(tmp_path):
    from hf_vit_plus.training.tasks import get_task

    args = tiny(tmp_path)
    plan = preview_plan(args, get_task("vit"))
    assert isinstance(plan, RunPlan) and isinstance(plan.launch, Launch)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.total_steps = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.options.learning_rate = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.max_steps = 2


def test_a_run_asks_for_its_parallelism_once_and_prints_its_plan(tmp_path, monkeypatch):
    """`with_recipe_precision`, `create_accelerator` and `with_fsdp_checkpointing` each recomputed the request from
    the arguments and the environment: three times a run. The plan computes it once, and the loop reads it."""
    calls = []
    real = sharding.parallelism_request

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr("hf_vit_plus.training.plan.parallelism_request", counted)
    monkeypatch.setattr(sharding, "parallelism_request", counted)
    with run_report() as report:
        result = train(tiny(tmp_path, activation_checkpointing=True))
    assert len(calls) == 1
    lines = report.getvalue().splitlines()
    assert lines[3].endswith("activation checkpointing: on"), lines
    assert result.global_step == 1


def test_resuming_reads_the_checkpoint_and_its_processor_into_the_plan(tmp_path):
    """The seq2seq family trains its tokenizer: a resumed run must use the checkpoint's, chosen by the plan."""
    from hf_vit_plus.training.tasks import get_task

    args = family_arguments(
        "seq2seq", output_dir=str(tmp_path / "s2s"), report_to="none", write_card=False, max_steps=2, save_steps=1,
        max_train_samples=32, max_eval_samples=8, per_device_train_batch_size=8, vocab_size=300, use_cpu=True,
        config_overrides="d_model=16,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,"
        "decoder_attention_heads=2,encoder_ffn_dim=32,decoder_ffn_dim=32",
    )  # fmt: skip
    train(args)
    resumed = dataclasses.replace(args, resume_from_checkpoint="latest", max_steps=3)
    plan = preview_plan(resumed, get_task("seq2seq"))
    assert plan.resume is not None and plan.resume.path.name == "checkpoint-2"
    assert plan.processor_from == str(plan.resume.path / "processor") == plan.processor_location
    assert plan.options.tokenizer_name is None  # the options stay what was given; the plan says where it reads
    with run_report() as report:
        result = train(resumed)
    assert result.global_step == 3
    assert f"Processor: the one saved with the checkpoint resumed ({plan.processor_from})" in report.getvalue()
    # a plain run plans no resume and no processor
    fresh = resume_point(args, get_task("seq2seq"))
    assert fresh == (None, None)
