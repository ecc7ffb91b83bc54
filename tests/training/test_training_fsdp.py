"""FSDP2 on two CPU processes (gloo), through the library loop, for every family: the parameters, gradients and
optimizer state are really sharded, the run matches DDP, a run stopped mid-epoch resumes exactly, and the saved model
is one consolidated model.safetensors equal to the sharded model's full view.

Two processes are forked with `accelerate.debug_launcher` (as in test_training_distributed.py; these tests too run
first, in an interpreter of their own: see the Makefile). Each family forks once; each process runs DDP, FSDP, FSDP
stopped and FSDP resumed one after the other (Accelerate's process-wide state reset in between), then a step of a
freshly prepared sharded run that it inspects.

Tolerances: FSDP2 averages gradients by a reduce-scatter where DDP all-reduces, so the sums run in another order:
losses agree to float32 rounding, amplified a little by Adam over the 20 updates (`LOSS_RTOL`, the issue's target;
measured 8.5e-8 to 2.1e-7 relative), weights to `WEIGHT_ATOL` (measured 4e-7 to 1.1e-5, the ViT's the largest). A
resumed run is bitwise the uninterrupted one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hf_vit_plus
from hf_vit_plus.training.args import family_arguments
from hf_vit_plus.training.loop import train
from tests.utils import REPO_ROOT, TINY_VIT_OVERRIDES, launch_processes, run_report

LOSS_RTOL = 1e-4
WEIGHT_ATOL = 5e-5
STEPS = 20
STOP = 9  # the stopped run: mid-epoch for every family's data
# per family: tiny model and data, a global batch of 2 x 4
FAMILY_ARGS = {
    "vit": dict(config_overrides=TINY_VIT_OVERRIDES, max_train_samples=96, max_eval_samples=16),
    "seq2seq": dict(
        config_overrides="d_model=32,encoder_layers=2,decoder_layers=2,encoder_attention_heads=2,"
        "decoder_attention_heads=2,encoder_ffn_dim=64,decoder_ffn_dim=64",
        max_train_samples=96,
        max_eval_samples=8,
        vocab_size=300,
    ),  # fmt: skip
    "sparse-lm": dict(
        config_overrides="hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,sparse_stride=8",
        max_train_samples=96,
        max_eval_samples=8,
        block_size=32,
        vocab_size=300,
    ),  # fmt: skip
    "image-lm": dict(
        config_overrides="hidden_size=16,num_hidden_layers=2,num_attention_heads=2,intermediate_size=32",
        max_train_samples=96,
        max_eval_samples=8,
    ),  # fmt: skip
}

FAMILY_CLASSES = {
    "vit": "ViTPlusForImageClassification",
    "seq2seq": "Seq2SeqTransformerForConditionalGeneration",
    "sparse-lm": "SparseTransformerForCausalLM",
    "image-lm": "SparseTransformerForImageGeneration",
}

# the modules that share a weight in each family's model (the image model's embeddings are not tied)
TIED = {
    "vit": [],
    "seq2seq": [["model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head"]],
    "sparse-lm": [["model.embeddings.embed_tokens", "lm_head"]],
    "image-lm": [],
}

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


def run_args(family: str, output_dir: Path, **overrides):
    values = dict(
        output_dir=str(output_dir),
        report_to="none",
        write_card=False,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=STEPS,
        save_steps="none",
        logging_steps=1,
        learning_rate=3e-3,
        warmup_steps=2,
        **FAMILY_ARGS[family],
    )
    values.update(overrides)
    return family_arguments(family, **values)


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # the process group stays
    GradientState._reset_state()


def _losses(result) -> list[float]:
    return [entry["loss"] for entry in result.log_history if "loss" in entry]


def _four_runs_and_a_look(family: str, root: str) -> None:
    """In each of the two processes: DDP, FSDP, FSDP stopped at `STOP` and resumed; then one step of a freshly
    prepared sharded run, inspected. The main process writes what the test compares."""
    root_path = Path(root)
    report: dict = {}
    weights: dict[str, dict] = {}
    for name, overrides in (
        ("ddp", {}),
        ("fsdp", dict(fsdp=True)),
        ("stopped", dict(fsdp=True, save_steps="100", stop_after_steps=STOP)),
        ("resumed", dict(fsdp=True, save_steps="100", resume_from_checkpoint="latest")),
    ):
        output_dir = root_path / ("split" if name in ("stopped", "resumed") else name)
        result = train(run_args(family, output_dir, **overrides))
        report[name] = {"losses": _losses(result), "step": result.global_step, "stop": result.stop_reason}
        if name != "stopped" and torch.distributed.get_rank() == 0:
            weights[name] = {k: v.detach().clone().contiguous() for k, v in result.model.state_dict().items()}
        report[name]["model"] = None if result.model is None else type(result.model).__name__
        _reset_accelerate()
    try:  # the sharded state of the last run, resumed without sharding: refused by name before anything is read
        train(run_args(family, root_path / "split", save_steps="100", resume_from_checkpoint="latest", max_steps=24))
        report["ddp_resumes_sharded"] = "resumed"
    except ValueError as error:
        report["ddp_resumes_sharded"] = str(error)
    _reset_accelerate()
    report["look"] = _look_at_a_sharded_step(family, root_path / "look")
    rank = torch.distributed.get_rank()  # Accelerate's state is reset: ask the process group
    (root_path / f"report{rank}.json").write_text(json.dumps(report))
    for name, tensors in weights.items():
        save_file(tensors, str(root_path / f"{name}.safetensors"))


def _look_at_a_sharded_step(family: str, output_dir: Path) -> dict:
    """One update of a prepared FSDP run: what this process holds of each parameter, gradient and optimizer state;
    whether the tied weights are still one; and the gathered model against the full view of the shards."""
    from accelerate.utils import send_to_device

    from hf_vit_plus.training.loop import set_up_run
    from hf_vit_plus.training.sharding import local_bytes, local_numel, tied_module_groups, trained_model

    args = run_args(family, output_dir, fsdp=True)
    run = set_up_run(args)
    accelerator = run.accelerator
    # as the loop's training step takes it: on the device, then the family's device-side preparation (image batches
    # come from the loader as uint8 and are normalised there)
    batch = run.family.on_device(send_to_device(next(iter(run.train_dataloader)), accelerator.device), run.extras)
    loss = run.model(**batch).loss
    accelerator.backward(loss)
    grads = {name: [local_numel(p.grad), p.grad.numel(), p.grad.shape[0]] for name, p in run.model.named_parameters()}
    held = local_bytes(run.model, run.optimizer)
    run.optimizer.step()
    model = run.model
    look = {
        "params": {name: [local_numel(p), p.numel(), p.shape[0]] for name, p in model.named_parameters()},
        "grads": grads,
        "bytes": held | {"optimizer": local_bytes(model, run.optimizer)["optimizer"]},
        "tied": tied_module_groups(model),  # the modules that still share one parameter
        "units": sorted({type(m).__name__ for m in model.modules() if type(m).__name__.startswith("FSDP")}),
    }
    full = {name: p.full_tensor() for name, p in model.named_parameters()}  # collective
    plain, state_dict = trained_model(accelerator, model)  # collective
    if plain is not None:
        look["consolidated_equals_full_view"] = all(torch.equal(plain.state_dict()[k], v) for k, v in full.items())
        look["consolidated_class"] = type(plain).__name__
    _reset_accelerate()
    return look


@pytest.mark.parametrize("family", list(FAMILY_ARGS))
def test_fsdp_shards_matches_ddp_resumes_exactly_and_saves_one_model(tmp_path, family):
    launch_processes(_four_runs_and_a_look, (family, str(tmp_path)), tmp_path)
    reports = [json.loads((tmp_path / f"report{rank}.json").read_text()) for rank in (0, 1)]
    report = reports[0]

    # every tensor is split along its first dimension: each process holds its half (rounded up) and no more
    looks = [r["look"] for r in reports]
    for name, (local0, full, rows) in looks[0]["params"].items():
        local1 = looks[1]["params"][name][0]
        assert local0 + local1 == full, name
        assert max(local0, local1) <= -(-rows // 2) * (full // rows), (name, local0, local1, full)
    for look in looks:
        assert look["grads"] == look["params"]  # the gradients, sharded like their parameters
        held = look["bytes"]
        assert held["gradients"] == held["parameters"]
        assert held["optimizer"] == pytest.approx(2 * held["parameters"], rel=0.01)  # Adam's two moments
        total = sum(full for _, full, _ in look["params"].values())
        assert 0.45 < sum(local for local, _, _ in look["params"].values()) / total < 0.55
    assert looks[0]["consolidated_equals_full_view"]
    assert looks[0]["consolidated_class"] == FAMILY_CLASSES[family]
    assert looks[0]["tied"] == TIED[family]  # tied embeddings are still one parameter, sharded once

    # the same losses and weights as DDP after the same updates
    ddp, fsdp = report["ddp"], report["fsdp"]
    assert len(ddp["losses"]) == len(fsdp["losses"]) == STEPS
    assert fsdp["losses"] == pytest.approx(ddp["losses"], rel=LOSS_RTOL)
    ddp_weights, fsdp_weights = load_file(tmp_path / "ddp.safetensors"), load_file(tmp_path / "fsdp.safetensors")
    assert set(ddp_weights) == set(fsdp_weights)
    worst = max((ddp_weights[k] - fsdp_weights[k]).abs().max().item() for k in ddp_weights)
    loss_gap = max(abs(f - d) / abs(d) for f, d in zip(fsdp["losses"], ddp["losses"]))
    print(f"{family}: FSDP vs DDP after {STEPS} updates: loss rel {loss_gap:.1e}, weights max |diff| {worst:.1e}")
    assert worst < WEIGHT_ATOL, f"FSDP vs DDP after {STEPS} updates: max |diff| = {worst:.2e}"
    assert reports[1]["fsdp"]["model"] is None  # the gathered model lives on the main process

    # the saved model is the consolidated one, and from_pretrained loads it
    saved = load_file(tmp_path / "fsdp" / "model.safetensors")
    assert all(torch.equal(saved[k], fsdp_weights[k]) for k in saved)
    loaded = getattr(hf_vit_plus, FAMILY_CLASSES[family]).from_pretrained(tmp_path / "fsdp")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in fsdp_weights.items())

    # stopped mid-epoch and resumed from the sharded checkpoint: bitwise the uninterrupted run
    assert (report["stopped"]["step"], report["stopped"]["stop"]) == (STOP, "stop_after_steps")
    checkpoint = tmp_path / "split" / "checkpoints" / f"checkpoint-{STOP}"
    assert (checkpoint / "pytorch_model_fsdp_0").is_dir() and not (checkpoint / "model.safetensors").exists()
    state = json.loads((checkpoint / "training_state.json").read_text())
    assert state["checkpoint_layout"] == "fsdp-sharded" and state["batches_in_epoch"] > 0
    assert report["resumed"]["step"] == STEPS
    assert report["stopped"]["losses"] == fsdp["losses"][:STOP]
    assert report["resumed"]["losses"] == fsdp["losses"]  # the resumed log continues the checkpoint's
    resumed_weights = load_file(tmp_path / "resumed.safetensors")
    for key in fsdp_weights:
        assert torch.equal(resumed_weights[key], fsdp_weights[key]), key
    # a sharded state under DDP: refused, naming both layouts (the reverse: tests/training/test_sharding.py)
    refusal = report["ddp_resumes_sharded"]
    assert f"checkpoint-{STEPS}" in refusal and "holds FSDP2 shards" in refusal, refusal
    assert "without sharding" in refusal and "resume it with the sharding it was saved with" in refusal, refusal


# ------------------------------------------------------------------- activation checkpointing, mixed precision
def _checkpointing_and_precision(root: str) -> None:
    """FSDP runs of the language model: plain, with activation checkpointing, with bf16 parameters and bf16 or fp32
    gradient reduction. The main process writes the losses, the first lines and the saved weights' dtypes."""

    report = {}
    policy = '{"mixed_precision_policy": {"param_dtype": "bf16", "reduce_dtype": "fp32"}}'
    for name, overrides in (
        ("plain", {}),
        ("checkpointing", dict(activation_checkpointing=True)),
        ("bf16", dict(mixed_precision="bf16")),
        ("bf16-fp32-reduce", dict(fsdp_config=policy)),
    ):
        with run_report() as printed:
            result = train(run_args("sparse-lm", Path(root) / name, fsdp=True, max_steps=6, **overrides))
        if torch.distributed.get_rank() == 0:
            dtypes = sorted({str(v.dtype) for v in load_file(Path(root) / name / "model.safetensors").values()})
            report[name] = {"losses": _losses(result), "lines": printed.getvalue().splitlines()[:4], "dtypes": dtypes}
        _reset_accelerate()
    if torch.distributed.get_rank() == 0:
        (Path(root) / "report.json").write_text(json.dumps(report))


def test_activation_checkpointing_and_mixed_precision_combine_with_sharding(tmp_path):
    launch_processes(_checkpointing_and_precision, (str(tmp_path),), tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    plain = report["plain"]["losses"]
    # recomputation (the model's own, non-reentrant, inside the sharded layers) changes no number
    assert report["checkpointing"]["losses"] == pytest.approx(plain, rel=1e-6)
    assert report["checkpointing"]["lines"][3].endswith("activation checkpointing: on")
    assert report["plain"]["lines"][2] == "Precision: fp32"
    assert report["bf16"]["lines"][2] == (
        "Precision: FSDP2 mixed precision: compute bf16, gradient reduction bf16; weights and optimizer state fp32 "
        "(sharded)"
    )
    assert "compute bf16, gradient reduction fp32" in report["bf16-fp32-reduce"]["lines"][2]
    for name in ("bf16", "bf16-fp32-reduce"):
        assert report[name]["losses"] == pytest.approx(plain, rel=2e-2), name  # bf16's 8 bits of mantissa
        assert report[name]["losses"] != plain
        assert report[name]["dtypes"] == ["torch.float32"]  # the sharded master weights are fp32


# -------------------------------------------------------------------------------------- through accelerate launch
FSDP_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_machines: 1
num_processes: 2
machine_rank: 0
mixed_precision: 'no'
use_cpu: true
rdzv_backend: static
same_network: true
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_cpu_ram_efficient_loading: false
  fsdp_offload_params: false
  fsdp_activation_checkpointing: false
"""
LM_FLAGS = [
    "--config_overrides", FAMILY_ARGS["sparse-lm"]["config_overrides"], "--max_train_samples", "64",
    "--max_eval_samples", "8", "--block_size", "32", "--per_device_train_batch_size", "4", "--report_to", "none",
    "--write_card", "false",
]  # fmt: skip


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    return dict(env, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))


def _launch(config: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), *flags,
            "-m", "hf_vit_plus.cli", "train", "sparse-lm"]  # fmt: skip


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_accelerate_config_shards_on_cpu_on_one_machine_and_on_two(tmp_path):
    """The issue's run: an accelerate config with distributed_type FSDP, fsdp_version 2 and use_cpu true, launched on
    2 processes, was plain DDP (the same weights, bit for bit). Now it shards, says so in its first lines and saves
    sharded checkpoints. Then the README's multi-machine recipe, as far as one machine goes: two launchers
    (--num_machines 2 --machine_rank 0|1 --main_process_ip 127.0.0.1), one process each, one run: the same run."""
    config = tmp_path / "fsdp.yaml"
    config.write_text(FSDP_CONFIG)
    one = tmp_path / "one"
    proc = subprocess.run(
        _launch(config) + ["--output_dir", str(one), "--max_steps", "4", "--save_steps", "2", *LM_FLAGS,
                           "--write_card", "true"],
        capture_output=True, text=True, env=_env(), timeout=600,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]  # the run's report is its INFO log
    lines = lines[next((i for i, line in enumerate(lines) if line.startswith("Distributed: ")), 0) :]
    assert lines[0].startswith("Distributed: FSDP2") and "2 processes on 1 machine" in lines[0], lines[:4]
    assert lines[1].startswith("Sharding: parameters, gradients and optimizer state split over 2 processes")
    assert lines[2] == "Precision: fp32" and lines[3].startswith("Global batch: 8 = 4 per process x 2 processes")
    assert (one / "checkpoints" / "checkpoint-2" / "pytorch_model_fsdp_0").is_dir()
    # the folder hf-vit-plus push uploads: the consolidated model, its card, and from_pretrained opens it
    from transformers import AutoModelForCausalLM

    from hf_vit_plus.hub.card import validate_card_metadata

    assert not validate_card_metadata(one / "README.md", require_datasets=False)

    reloaded = AutoModelForCausalLM.from_pretrained(one, trust_remote_code=False)
    assert type(reloaded).__name__ == "SparseTransformerForCausalLM"
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in load_file(one / "model.safetensors").items())

    two = tmp_path / "two"
    port = str(_free_port())
    launchers = [
        subprocess.Popen(
            _launch(
                config,
                "--num_machines",
                "2",
                "--num_processes",
                "2",
                "--machine_rank",
                str(rank),
                "--main_process_ip",
                "127.0.0.1",
                "--main_process_port",
                port,
            )
            + ["--output_dir", str(two), "--max_steps", "4", "--save_steps", "2", *LM_FLAGS],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(),
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outputs = [launcher.communicate(timeout=600)[0] for launcher in launchers]
    for launcher, output in zip(launchers, outputs):
        assert launcher.returncode == 0, output[-4000:]
        assert "FSDP2" in output and "2 processes on 2 machines" in output, output[-4000:]
        assert "Removed shared tensor" not in output  # no per-save chatter (the DDP run: test_training_distributed)
    assert json.loads((two / "eval_results.json").read_text()) == json.loads((one / "eval_results.json").read_text())
    one_weights, two_weights = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert all(torch.equal(one_weights[k], two_weights[k]) for k in one_weights)


def test_sigterm_during_sharded_training_saves_and_says_it_stopped(tmp_path):
    """SIGTERM on one process stops both after the same update with a complete sharded state saved; the first
    process exits 143 (the other 0, so that the launcher, which ends a machine's other processes when one fails,
    never cuts the first one off), and the launcher exits non-zero."""
    import psutil

    config = tmp_path / "fsdp.yaml"
    config.write_text(FSDP_CONFIG)
    output_dir = tmp_path / "sigterm"
    command = _launch(config) + ["--output_dir", str(output_dir), "--num_train_epochs", "1000", "--save_steps",
                                 "none", *LM_FLAGS]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    lines = []
    try:
        for line in proc.stdout:  # wait until the loop runs (the handler is installed before this line)
            lines.append(line)
            if line.startswith("Training sparse-lm"):
                break
        time.sleep(3)
        worker = [p for p in psutil.Process(proc.pid).children(recursive=True) if "hf_vit_plus.cli" in p.cmdline()]
        worker[-1].send_signal(signal.SIGTERM)  # one process, as a scheduler's preemption may reach one first
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines) + out
    assert proc.returncode != 0, output[-4000:]
    assert re.search(r"Root Cause.*\n.*\n.*\n.*\n +rank +: 0 .*\n +exitcode +: 143 ", output), output[-4000:]
    assert "Stopped at update" in output and "SIGTERM" in output
    checkpoints = sorted((output_dir / "checkpoints").glob("checkpoint-*"))
    assert len(checkpoints) == 1, output[-3000:]
    state = json.loads((checkpoints[0] / "training_state.json").read_text())
    assert state["checkpoint_layout"] == "fsdp-sharded" and state["global_step"] >= 1
    assert (checkpoints[0] / "pytorch_model_fsdp_0").is_dir() and (checkpoints[0] / "optimizer_0").is_dir()
    assert (checkpoints[0] / "manifest.json").is_file()  # written last: the state is complete
    assert not (output_dir / "model.safetensors").exists()  # no final model: the run did not finish


def _full_disk_while_sharded(root: str) -> None:
    """Two FSDP2 processes; from the second checkpoint on, a file-size limit (a real OS limit: writes fail with EFBIG)
    stops every write of a shard. Each process reports what it raised."""
    import resource
    import signal

    from hf_vit_plus.training import checkpoints
    from hf_vit_plus.training.disk import OutOfSpaceError

    original = checkpoints.save_checkpoint
    calls = []

    def limited(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first checkpoint is written whole, the second meets the limit
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (256, resource.RLIM_INFINITY))
        return original(*args, **kwargs)

    import hf_vit_plus.training.loop as loop

    loop.save_checkpoint = limited
    rank = torch.distributed.get_rank()
    try:
        train(run_args("sparse-lm", Path(root) / "run", fsdp=True, save_steps="2", max_steps=6))
        raised = None
    except OutOfSpaceError as error:
        raised = {"message": str(error), "main_process": error.main_process}
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        loop.save_checkpoint = original
    (Path(root) / f"full{rank}.json").write_text(json.dumps(raised))


def test_a_full_disk_under_fsdp_stops_every_process_with_one_line(tmp_path):
    """Under FSDP2 every process writes its shards: when one cannot, all stop (no process waits at a barrier for
    ever), only the main process has the line to print, and no half-written checkpoint is left."""
    launch_processes(_full_disk_while_sharded, (str(tmp_path),), tmp_path)
    reports = [json.loads((tmp_path / f"full{rank}.json").read_text()) for rank in (0, 1)]
    assert all(report is not None for report in reports), reports
    assert [report["main_process"] for report in reports] == [True, False]
    assert "Could not write checkpoint-4" in reports[0]["message"] and "checkpoint-2" in reports[0]["message"]
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-2"]
    assert not [p for p in run.rglob("*") if p.name.startswith(".tmp")]


# ------------------------------------------------------------------------------------------------------- LoRA
def _lora_under_fsdp(root: str) -> None:
    """LoRA on the language model (tied embeddings) under FSDP2: a run stopped at a sharded checkpoint, then resumed
    from it to the end; the main process writes the trained adapter's weights and what each run returned."""
    root_path = Path(root)
    report = {}
    for name, overrides in (("stopped", dict(stop_after_steps=2)), ("resumed", dict(resume_from_checkpoint="latest"))):
        args = family_arguments(
            "sparse-lm", output_dir=str(root_path / "lora"), model_name_or_path=str(root_path / "base"), lora_r=4,
            fsdp=True, max_steps=4, save_steps="2", report_to="none", per_device_train_batch_size=4,
            per_device_eval_batch_size=4, max_train_samples=64, max_eval_samples=8, block_size=32, logging_steps=1,
            learning_rate=3e-2, **overrides,
        )  # fmt: skip
        result = train(args)
        report[name] = {"step": result.global_step, "stop": result.stop_reason,
                        "model": None if result.model is None else type(result.model).__name__}  # fmt: skip
        if name == "resumed" and torch.distributed.get_rank() == 0:
            state = result.model.state_dict()
            adapter = {k: v.detach().clone().contiguous() for k, v in state.items() if "lora_" in k}
            save_file(adapter, str(root_path / "trained_lora.safetensors"))
        _reset_accelerate()
    (root_path / f"lora{torch.distributed.get_rank()}.json").write_text(json.dumps(report))


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft 0.21's read
def test_lora_under_fsdp_saves_its_adapter_and_reloads(tmp_path):
    """LoRA under FSDP2 failed at the final save: the consolidated copy of the model was rebuilt from its config alone
    ("TypeError: ... missing ... 'peft_config'"). The run saves a sharded checkpoint, resumes from it and saves the
    adapter folder, which PEFT loads onto the base model with the trained weights."""
    from peft import PeftModel

    from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM
    from hf_vit_plus.data.text import byte_tokenizer

    config = SparseTransformerConfig(vocab_size=259, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, sparse_stride=8,
                                     sparse_summary_size=2, pad_token_id=0, eos_token_id=1)  # fmt: skip
    torch.manual_seed(0)
    SparseTransformerForCausalLM(config).save_pretrained(tmp_path / "base")
    byte_tokenizer().save_pretrained(tmp_path / "base")
    launch_processes(_lora_under_fsdp, (str(tmp_path),), tmp_path)
    reports = [json.loads((tmp_path / f"lora{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["stopped"]["step"] for r in reports] == [2, 2] and [r["resumed"]["step"] for r in reports] == [4, 4]
    assert reports[0]["resumed"]["model"].startswith("PeftModel") and reports[1]["resumed"]["model"] is None
    folder = tmp_path / "lora"
    assert {"adapter_model.safetensors", "adapter_config.json", "README.md"} <= {p.name for p in folder.iterdir()}
    assert not (folder / "model.safetensors").exists()  # an adapter, not a whole model
    trained = load_file(tmp_path / "trained_lora.safetensors")
    saved = load_file(folder / "adapter_model.safetensors")
    assert saved and any(v.abs().sum() > 0 for k, v in saved.items() if "lora_B" in k)  # B starts at zero
    reloaded = PeftModel.from_pretrained(SparseTransformerForCausalLM.from_pretrained(tmp_path / "base"), folder)
    state = {k: v for k, v in reloaded.state_dict().items() if "lora_" in k}
    assert state.keys() == trained.keys()
    for name, tensor in trained.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=0, msg=name)
