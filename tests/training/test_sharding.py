"""What a run asks for and what it gets, in one process: FSDP and DeepSpeed requests that cannot be honoured are
refused in one line naming them, --fsdp_config is checked key by key, the units and tied weights of every family's
model, and a checkpoint of another layout (DDP under FSDP, or the reverse) is refused by name. The sharded runs
themselves (two processes) are in test_training_fsdp.py."""

from __future__ import annotations

import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
import torch

from hf_vit_plus.cli import main
from hf_vit_plus.errors import UsageError
from hf_vit_plus.training.args import family_arguments, read_fsdp_config
from hf_vit_plus.training.checkpoints import write_manifest
from hf_vit_plus.training.loop import train
from hf_vit_plus.training.sharding import (
    CHECKPOINT_LAYOUTS,
    fsdp_plugin,
    layer_classes,
    parallelism_request,
    prepare_model,
    refuse_before_start,
    tied_module_groups,
)
from tests.utils import TINY_VIT_OVERRIDES, run_report

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


@pytest.fixture(autouse=True)
def no_launcher_environment(monkeypatch):
    """Each test starts without the variables `accelerate launch` sets (and checks that none leaks out)."""
    for name in list(os.environ):
        if name.startswith(("ACCELERATE_", "FSDP_")):
            monkeypatch.delenv(name)
    yield


def tiny_vit(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), config_overrides=TINY_VIT_OVERRIDES, report_to="none",
                  write_card=False, max_train_samples=64, max_eval_samples=16, per_device_train_batch_size=16,
                  save_steps="none", max_steps=2)  # fmt: skip
    values.update(overrides)
    return family_arguments("vit", **values)


def cli(capsys, *argv: str) -> tuple[int, str]:
    status = main(["train", *argv, "--report_to", "none", "--save_steps", "none"])
    return status, capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- refusals
def test_fsdp_in_one_process_is_refused_not_dropped(tmp_path, capsys):
    """A single process cannot shard: --fsdp was silently one process training alone; now one line says why."""
    status, err = cli(capsys, "vit", "--output_dir", str(tmp_path / "run"), "--config_overrides", TINY_VIT_OVERRIDES,
                      "--max_steps", "1", "--fsdp")  # fmt: skip
    assert status == 2
    [line] = err.strip().splitlines()
    assert line.startswith("hf-vit-plus train vit: error: --fsdp asks to shard the model with FSDP, but this run has")
    assert "one process" in line and "accelerate launch --num_processes N" in line
    assert os.environ.get("ACCELERATE_USE_FSDP") is None  # the Accelerator's setting did not leak into the process
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_launcher_requests_that_cannot_be_honoured_are_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # an accelerate config of distributed_type FSDP, no version
    with pytest.raises(UsageError, match=r"accelerate config \(ACCELERATE_USE_FSDP=true\) asks for FSDP version 1"):
        train(tiny_vit(tmp_path))
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(UsageError, match=r"USE_FSDP=true\) asks to shard the model with FSDP, but this run has one"):
        train(tiny_vit(tmp_path))
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    with pytest.raises(UsageError, match="offload parameters to the CPU .* this run is on the CPU already"):
        train(tiny_vit(tmp_path))
    monkeypatch.delenv("FSDP_OFFLOAD_PARAMS")
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "SIZE_BASED_WRAP")
    with pytest.raises(UsageError, match="SIZE_BASED_WRAP"):
        train(tiny_vit(tmp_path))
    monkeypatch.delenv("FSDP_AUTO_WRAP_POLICY")
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")  # honoured (test_fsdp_ram_efficient_loading.py)
    with pytest.raises(UsageError, match=r"USE_FSDP=true\) asks to shard the model with FSDP, but this run has one"):
        train(tiny_vit(tmp_path))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(UsageError, match="asks for FSDP and .* for DeepSpeed: choose one"):
        train(tiny_vit(tmp_path))
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    # DeepSpeed: trained on CPU processes too (tests/training/test_training_deepspeed.py), not on one process
    installed = importlib.util.find_spec("deepspeed") is not None
    why = "this run has one process and ZeRO shards over processes" if installed else "which is not installed"
    with pytest.raises(UsageError, match=rf"USE_DEEPSPEED=true\) asks for DeepSpeed.*{why}"):
        train(tiny_vit(tmp_path))


def test_fp16_on_cpu_is_refused_not_run_in_fp32(tmp_path):
    """Accelerate applies fp16 only on accelerators: `--mixed_precision fp16` trained in fp32 on a CPU, silently."""
    with pytest.raises(UsageError, match="--mixed_precision fp16 needs a GPU"):
        train(tiny_vit(tmp_path, mixed_precision="fp16"))


def test_the_first_lines_say_what_a_run_is(tmp_path):
    with run_report() as report:
        train(tiny_vit(tmp_path, mixed_precision="bf16"))
    lines = report.getvalue().splitlines()
    assert lines[:4] == [
        "Distributed: one process, no data parallelism [NO on CPU], 1 process on 1 machine",
        "Sharding: none",
        "Precision: bf16 autocast; weights, gradients and optimizer state fp32",
        "Global batch: 16 = 16 per process x 1 process x 1 accumulation step; activation checkpointing: off",
    ]


# ------------------------------------------------------------------------------------------------ --fsdp_config
def test_fsdp_config_is_read_and_checked(tmp_path):
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_version": 2, "reshard_after_forward": "false", "activation_checkpointing": True,
                                "mixed_precision_policy": {"param_dtype": "bf16", "reduce_dtype": "fp32"},
                                "transformer_layer_cls_to_wrap": "ViTPlusLayer",
                                "cpu_ram_efficient_loading": True}))  # fmt: skip
    assert read_fsdp_config(str(path)) == {
        "version": 2, "reshard_after_forward": False, "activation_checkpointing": True,
        "cpu_ram_efficient_loading": True,
        "mixed_precision_policy": {"param_dtype": "bf16", "reduce_dtype": "fp32"},
        "transformer_layer_cls_to_wrap": ["ViTPlusLayer"],
    }  # fmt: skip
    assert read_fsdp_config('{"state_dict_type": "full_state_dict"}') == {"state_dict_type": "FULL_STATE_DICT"}
    for value, message in [
        ('{"reshard_after_fwd": true}', "unknown key 'reshard_after_fwd': did you mean 'reshard_after_forward'"),
        ('{"version": 3}', "version must be 2"),
        ('{"cpu_offload": "maybe"}', "cpu_offload must be true or false, got 'maybe'"),
        ('{"auto_wrap_policy": "SIZE_BASED_WRAP"}', "auto_wrap_policy must be TRANSFORMER_BASED_WRAP or NO_WRAP"),
        ('{"mixed_precision_policy": "fp8"}', "mixed_precision_policy must be one of"),
        ("[1, 2]", "must be a JSON object, got list"),
        ("{not json", "is not valid JSON"),
        (str(tmp_path / "missing.json"), "--fsdp_config .*missing.json.* does not exist"),
    ]:
        with pytest.raises(UsageError, match=message):
            read_fsdp_config(value)
    with pytest.raises(UsageError, match="--fsdp_config needs --fsdp"):
        tiny_vit(tmp_path, fsdp_config='{"version": 2}')


def test_the_plugin_takes_the_flags_then_the_launcher_then_our_defaults(monkeypatch):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    plugin = fsdp_plugin(parallelism_request(True, {}, {}))
    assert plugin.fsdp_version == 2 and plugin.auto_wrap_policy is transformer_auto_wrap_policy
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT" and plugin.reshard_after_forward is True
    assert plugin.activation_checkpointing is False  # the model's own checkpointing does it (sharding.py)
    policy = {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    options = {"reshard_after_forward": False, "mixed_precision_policy": policy}
    plugin = fsdp_plugin(parallelism_request(True, options, {}))
    assert plugin.reshard_after_forward is False
    assert plugin.mixed_precision_policy == MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    launcher = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "false",
                "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT", "FSDP_ACTIVATION_CHECKPOINTING": "true"}  # fmt: skip
    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    request = parallelism_request(False, {})
    assert request.fsdp_from == "the accelerate config (ACCELERATE_USE_FSDP=true)" and request.activation_checkpointing
    plugin = fsdp_plugin(request)
    assert plugin.reshard_after_forward is False and plugin.state_dict_type.name == "FULL_STATE_DICT"
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy  # not in the config: the model's layers
    assert parallelism_request(True, {}).fsdp_from == "--fsdp and the accelerate config (ACCELERATE_USE_FSDP=true)"
    refuse_before_start(request, on_cpu=True)  # version 2, nothing offloaded: honoured
    # cpu_ram_efficient_loading (accelerate config's default answer): the loop's, not Accelerate's
    assert not request.ram_efficient_loading
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")
    request = parallelism_request(False, {})
    assert request.ram_efficient_loading
    refuse_before_start(request, on_cpu=True)
    assert fsdp_plugin(request).cpu_ram_efficient_loading is False
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"  # the plugin wrote nothing into the environment
    assert not parallelism_request(True, {"cpu_ram_efficient_loading": False}).ram_efficient_loading
    assert parallelism_request(False, {}, {"FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}).ram_efficient_loading is False


# --------------------------------------------------------------------------------------------- units and ties
@pytest.mark.parametrize(
    "case_id, layers, tied",
    [
        ("vit-dense", ["ViTPlusLayer"], []),
        ("seq2seq-dense", ["Seq2SeqTransformerLayer"],
         [["model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head"]]),
        ("seq2seq-marian", ["Seq2SeqTransformerLayer"],
         [["model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head"]]),
        ("sparse-lm-dense", ["SparseTransformerLayer"], [["model.embeddings.embed_tokens", "lm_head"]]),
        ("image-lm-dense", ["SparseTransformerLayer"], []),
    ],
)  # fmt: skip
def test_units_are_the_layers_and_tied_weights_stay_together(case_id, layers, tied):
    """The layers of `_no_split_modules` that hold no embedding and no tied weight are the units (the embeddings'
    modules are not: accelerate 1.15 carves the input embedding out and fails inside a sharded unit)."""
    from tests.conftest import MODEL_CASES

    case = next(c for c in MODEL_CASES if c.id == case_id)
    model = case.model()
    assert layer_classes(model) == layers
    assert tied_module_groups(model) == tied


def test_layer_classes_that_would_split_a_tie_are_refused_by_name():
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from tests.conftest import MODEL_CASES

    model = next(c for c in MODEL_CASES if c.id == "sparse-lm-dense").model()
    for names, message in [
        (["SparseTransformerEmbeddings"], "hold model.embeddings.embed_tokens .* wrap SparseTransformerLayer instead"),
        (["LlamaDecoderLayer"], "'LlamaDecoderLayer', which SparseTransformerForCausalLM does not have"),
    ]:
        plugin = SimpleNamespace(auto_wrap_policy=transformer_auto_wrap_policy, transformer_cls_names_to_wrap=names)
        accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin))
        with pytest.raises(UsageError, match=message):
            prepare_model(accelerator, model)


# ------------------------------------------------------------------------------------------------ checkpoints
def test_a_checkpoint_of_another_layout_is_refused_by_name(tmp_path):
    """A DDP training state under FSDP, and the reverse, cannot be read (other files, other tensors): refused, naming
    both layouts, before anything is loaded."""
    stopped = train(tiny_vit(tmp_path, save_steps="1", stop_after_steps=1, max_steps=3))
    state_file = stopped.last_checkpoint / "training_state.json"
    state = json.loads(state_file.read_text())
    assert state["checkpoint_layout"] == "replicated"
    state["checkpoint_layout"] = "fsdp-sharded"  # as a sharded run writes it
    state_file.write_text(json.dumps(state))
    write_manifest(stopped.last_checkpoint)  # edited on purpose: a complete checkpoint of another layout
    message = r"holds FSDP2 shards in .* but this run reads the whole model .* resume it with the sharding it was"
    with pytest.raises(ValueError, match=message):
        train(tiny_vit(tmp_path, resume_from_checkpoint="latest", max_steps=3))
    from hf_vit_plus.training.checkpoints import check_same_layout

    with pytest.raises(ValueError, match="holds the whole model .* without --fsdp and without an FSDP accelerate"):
        check_same_layout({"checkpoint_layout": "replicated"}, "fsdp-sharded", tmp_path, CHECKPOINT_LAYOUTS)
    del state["checkpoint_layout"]  # saved before layouts were recorded: a DDP state
    with pytest.raises(ValueError, match="holds the whole model"):
        check_same_layout(state, "fsdp-sharded", tmp_path, CHECKPOINT_LAYOUTS)
    check_same_layout(state, "replicated", tmp_path, CHECKPOINT_LAYOUTS)
