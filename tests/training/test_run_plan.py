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
from hf_vit_plus.training.tasks import get_task
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
    launch = decide_launch(tiny(tmp_path, **flags), get_task("vit"))
    assert launch.mixed_precision == precision and launch.precision_from == chosen_by
    assert launch.on_cpu and not launch.sharded


def test_fsdp_activation_checkpointing_is_decided_into_the_arguments(tmp_path, monkeypatch):
    sharded = tiny(tmp_path, fsdp=True, fsdp_config='{"activation_checkpointing": true}')
    launch = decide_launch(sharded, get_task("vit"))
    assert launch.activation_checkpointing and launch.checkpointing_from == "--fsdp_config"
    assert launch.request.fsdp and launch.sharded
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    launch = decide_launch(tiny(tmp_path), get_task("vit"))
    assert launch.activation_checkpointing and launch.checkpointing_from == "the accelerate config"
    assert launch.request.fsdp_from == sharding.LAUNCHER_FSDP
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    plain = decide_launch(tiny(tmp_path), get_task("vit"))
    assert not plain.activation_checkpointing and plain.checkpointing_from is None


def test_the_plan_is_frozen(tmp_path):
    from hf_vit_plus.training.tasks import get_task

    args = tiny(tmp_path)
    plan = preview_plan(args, get_task("vit"))
    assert isinstance(plan, RunPlan) and isinstance(plan.launch, Launch)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.total_steps = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.optimization.learning_rate = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.max_steps = 2


def test_a_run_asks_for_its_parallelism_once_and_prints_its_plan(tmp_path, monkeypatch):
    """`with_recipe_precision`, `create_accelerator` and `with_fsdp_checkpointing` each recomputed the request from
    the arguments and the environment: three times a run. The plan computes it once, and the loop reads it; the
    launch is decided once (`create_accelerator`, `plan_the_run` and `prepare_run` take it, or the plan)."""
    calls = []
    real = sharding.parallelism_request

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr("hf_vit_plus.training.plan.parallelism_request", counted)
    monkeypatch.setattr(sharding, "parallelism_request", counted)
    from hf_vit_plus.training import loop, plan

    launches = []
    real_launch = plan.decide_launch

    def counted_launch(*args, **kwargs):
        launches.append(args)
        return real_launch(*args, **kwargs)

    monkeypatch.setattr(loop, "decide_launch", counted_launch)
    monkeypatch.setattr(plan, "decide_launch", counted_launch)
    with run_report() as report:
        result = train(tiny(tmp_path, activation_checkpointing=True))
    assert len(calls) == 1 and len(launches) == 1  # one launch a run: the Accelerator's is the plan's
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
    assert plan.model_options.tokenizer_name is None  # the options stay what was given; the plan says where it reads
    with run_report() as report:
        result = train(resumed)
    assert result.global_step == 3
    assert f"Processor: the one saved with the checkpoint resumed ({plan.processor_from})" in report.getvalue()
    # a plain run plans no resume and no processor
    fresh = resume_point(args, get_task("seq2seq"))
    assert fresh == (None, None)


FP32_FOR_1X1 = "--recipe deit, not bf16: the resnet's feature maps shrink to 1 x 1"


@pytest.mark.parametrize(
    "dataset, model_type, precision, reason",
    [
        ("digits", "resnet", "no", FP32_FOR_1X1),  # 8 x 8 images: 2 x 2 after the stem, 1 x 1 from the second stage
        ("fashion-mnist", "resnet", "bf16", None),  # 28 x 28: the smallest map is 2 x 2
        ("digits", None, "bf16", None),  # the ViT has no feature maps
    ],
)
def test_the_recipe_trains_a_cnn_whose_maps_shrink_to_1x1_in_fp32_on_the_cpu(
    tmp_path, monkeypatch, dataset, model_type, precision, reason
):
    """transformers' ResNet under the recipe's bf16 autocast on the 8 x 8 digits sometimes got non-finite gradients
    on the CPU (BatchNorm over 1 x 1 maps); the divergence guard stopped the run. The recipe takes fp32 for it and
    says why in the precision line; on CPUs with native bf16 products everything else keeps bf16."""
    from accelerate.state import AcceleratorState

    from hf_vit_plus.models import compat

    AcceleratorState._reset_state(True)
    monkeypatch.setattr(compat, "cpu_has_native_bf16_products", lambda: True)
    overrides = dict(recipe="deit", dataset_name=dataset, model_type=model_type)
    if model_type:
        overrides["config_overrides"] = None  # the ResNet's own sizes (TRANSFORMERS_CONFIGS)
    from hf_vit_plus.training.tasks import get_task

    launch = decide_launch(tiny(tmp_path, **overrides), get_task("vit"))
    assert launch.mixed_precision == precision
    if reason:
        assert launch.precision_from.startswith(reason) and "non-finite gradients" in launch.precision_from
    else:
        assert launch.precision_from == "--recipe deit"


@pytest.mark.parametrize("dataset, side", [("digits", 1), ("fashion-mnist", 2)])
def test_the_smallest_feature_map_is_the_real_models(tmp_path, dataset, side):
    """`smallest_feature_map` runs the fresh model on the meta device: the same sides as a real forward."""
    import torch
    from transformers import AutoModelForImageClassification

    from hf_vit_plus.training.tasks import get_task

    family = get_task("vit")
    args = tiny(tmp_path, dataset_name=dataset, model_type="resnet", config_overrides=None)
    assert family.smallest_feature_map(args) == side
    shape = family.default_config(args)
    model = AutoModelForImageClassification.from_config(family.transformers_config(args, {})).eval()
    with torch.no_grad():
        pixels = torch.zeros(1, shape["num_channels"], shape["image_size"], shape["image_size"])
        hidden = model(pixel_values=pixels, output_hidden_states=True).hidden_states
    assert min(min(h.shape[-2:]) for h in hidden) == side
    assert family.smallest_feature_map(tiny(tmp_path, dataset_name=dataset)) is None  # the ViT


def test_the_first_lines_say_why_the_cnn_trains_in_fp32(tmp_path, monkeypatch):
    from accelerate.state import AcceleratorState

    from hf_vit_plus.models import compat

    AcceleratorState._reset_state(True)
    monkeypatch.setattr(compat, "cpu_has_native_bf16_products", lambda: True)
    args = tiny(tmp_path, recipe="deit", dataset_name="digits", model_type="resnet", config_overrides=None)
    with run_report() as report:
        result = train(args)
    assert result.global_step == 1
    precision = next(line for line in report.getvalue().splitlines() if line.startswith("Precision: "))
    assert precision.startswith(f"Precision: fp32 (chosen by {FP32_FOR_1X1}"), precision


def test_a_run_builds_its_model_config_once_and_reads_a_saved_one_once(tmp_path, monkeypatch):
    """The plan asks the task for the run's config once (`TrainingTask.model_config`), the recipe's fields are set on
    it, and the model is made from it: one config build a run (the recipe's drop-path, the input size and the model
    each built one), and a saved config read once (it was read five times before `from_pretrained`)."""
    from transformers import PretrainedConfig

    from hf_vit_plus.cli import main
    from hf_vit_plus.training.tasks.base import TrainingTask

    builds, reads = [], []
    build_config, get_config_dict = TrainingTask.build_config, PretrainedConfig.get_config_dict.__func__

    def counted_build(self, *args, **kwargs):
        builds.append(args)
        return build_config(self, *args, **kwargs)

    def counted_read(cls, location, *args, **kwargs):
        reads.append(str(location))
        return get_config_dict(cls, location, *args, **kwargs)

    monkeypatch.setattr(TrainingTask, "build_config", counted_build)
    monkeypatch.setattr(PretrainedConfig, "get_config_dict", classmethod(counted_read))
    common = ["--config_overrides", TINY_VIT_OVERRIDES, "--max_train_samples", "32", "--max_eval_samples", "16",
              "--per_device_train_batch_size", "16", "--max_steps", "1", "--save_steps", "none", "--report_to",
              "none", "--write_card", "false", "--use_cpu", "--recipe", "deit", "--mixed_precision", "no"]  # fmt: skip
    assert main(["train", "vit", "--output_dir", str(tmp_path / "fresh"), *common]) == 0
    assert len(builds) == 1 and not reads, (builds, reads)
    builds.clear()
    tuned = ["--output_dir", str(tmp_path / "tuned"), "--model_name_or_path", str(tmp_path / "fresh")]
    assert main(["train", "vit", *tuned, *common]) == 0
    saved = str(tmp_path / "fresh")
    assert len(builds) == 1 and reads.count(saved) == 1, (builds, reads)
