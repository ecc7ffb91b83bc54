"""DeepSpeed ZeRO-2 and ZeRO-3 on two CPU processes (DeepSpeed's CPU accelerator, gloo), through the library loop,
for the sparse-lm family: the runs are DeepSpeed's (the first lines say so), their losses match the DDP run's,
ZeRO-3 holds about half of the parameters per process, and the final model is one model.safetensors, gathered from
the shards, that from_pretrained loads. What DeepSpeed cannot do here is refused with one line.

Skipped without deepspeed (`make test-deepspeed` installs it into the venv and runs this file). Two processes are
forked with `accelerate.debug_launcher`, as in test_training_fsdp.py; the request comes as `accelerate launch` gives
it to each process (ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_ZERO_STAGE).

Tolerance: ZeRO reduces the gradients in buckets (a reduce-scatter under ZeRO-2/3) where DDP all-reduces, and
DeepSpeed clips and steps its flat fp32 partitions: the sums run in another order, amplified a little by Adam over
the updates. `LOSS_RTOL` bounds the losses' relative gap to DDP's; the gap measured is printed (see the README).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from safetensors.torch import load_file  # noqa: E402

from hf_vit_plus import SparseTransformerForCausalLM  # noqa: E402
from hf_vit_plus.errors import UsageError  # noqa: E402
from hf_vit_plus.training.loop import train  # noqa: E402
from tests.training.test_training_fsdp import run_args as fsdp_run_args  # noqa: E402
from tests.utils import launch_processes, run_report  # noqa: E402

LOSS_RTOL = 1e-4  # the target for FSDP2; measured: 0 (bitwise equal) over the 12 updates
STEPS = 12

pytestmark = [
    pytest.mark.usefixtures("fresh_accelerate_state"),  # tests/conftest.py
    # DeepSpeed 0.19 still calls torch.distributed's deprecated collectives (all_gather_into_tensor, ...)
    pytest.mark.filterwarnings(r"ignore:`torch\.distributed\.\w+` is deprecated:FutureWarning"),
]


def run_args(output_dir: Path, **overrides):
    """test_training_fsdp.py's run of the tiny sparse LM, for `STEPS` updates."""
    return fsdp_run_args("sparse-lm", output_dir, **{"max_steps": STEPS, **overrides})


@contextlib.contextmanager
def deepspeed_launcher(stage: int | None):
    """The variables `accelerate launch --use_deepspeed --zero_stage N` gives each process (none: a DDP launch)."""
    names = ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE")
    saved = {name: os.environ.pop(name, None) for name in names}
    if stage is not None:
        os.environ.update(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_ZERO_STAGE=str(stage))
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def _first_lines(printed: str) -> list[str]:
    """The run's first four lines (DeepSpeed may print before them, e.g. that it built its shared-memory op)."""
    lines = printed.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Distributed: ")), 0)
    return lines[start : start + 4]


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # the process group stays
    GradientState._reset_state()


def _runs(root: str) -> None:
    """In each of the two processes: DDP, ZeRO-2, ZeRO-3 (first lines, losses, the returned model), then a look at
    what a prepared ZeRO-3 run holds. Each process writes its report."""
    from hf_vit_plus.training.loop import set_up_run
    from hf_vit_plus.training.sharding import local_numel

    root_path = Path(root)
    report: dict = {}
    accumulate = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_grad_norm=0.5)
    for name, stage, overrides in (
        ("ddp", None, {}),
        ("zero2", 2, {}),
        ("zero3", 3, {}),
        ("ddp-accumulate", None, accumulate),
        ("zero3-accumulate", 3, accumulate),
    ):
        with deepspeed_launcher(stage), run_report() as printed:
            result = train(run_args(root_path / name, **overrides))
        report[name] = {
            "losses": [entry["loss"] for entry in result.log_history if "loss" in entry],
            "lines": _first_lines(printed.getvalue()),
            "model": None if result.model is None else type(result.model).__name__,
        }
        _reset_accelerate()
    with deepspeed_launcher(3):
        args = run_args(root_path / "look")
        run = set_up_run(args)
        params = list(run.model.parameters())
        report["zero3_held"] = sum(local_numel(p) for p in params)
        report["zero3_total"] = sum(p.ds_numel for p in params)
        report["zero3_partitioned"] = all(p.numel() == 0 for p in params if p.ds_numel > 1000)
        _reset_accelerate()
    rank = torch.distributed.get_rank()
    (root_path / f"report{rank}.json").write_text(json.dumps(report))


def test_zero2_and_zero3_train_like_ddp_shard_and_save_one_model(tmp_path):
    launch_processes(_runs, (str(tmp_path),), tmp_path)
    reports = [json.loads((tmp_path / f"report{rank}.json").read_text()) for rank in (0, 1)]
    report = reports[0]

    # the first lines say what is in effect
    assert report["ddp"]["lines"][0].startswith("Distributed: DDP"), report["ddp"]["lines"]
    for name, stage in (("zero2", 2), ("zero3", 3)):
        lines = report[name]["lines"]
        assert lines[0].startswith("Distributed: DeepSpeed [DEEPSPEED, gloo on CPU], 2 processes"), lines
        assert lines[1].startswith(f"Sharding: DeepSpeed ZeRO stage {stage}: "), lines
        assert lines[2] == "Precision: fp32", lines
        assert lines[3].startswith("Global batch: 8 = 4 per process x 2 processes"), lines

    # the same losses as DDP after the same updates
    ddp = report["ddp"]["losses"]
    assert len(ddp) == STEPS
    for name in ("zero2", "zero3"):
        losses = report[name]["losses"]
        assert len(losses) == STEPS
        gap = max(abs(a - b) / abs(b) for a, b in zip(losses, ddp))
        print(f"{name} vs DDP after {STEPS} updates: loss rel {gap:.1e}")
        assert losses == pytest.approx(ddp, rel=LOSS_RTOL)

    # gradient accumulation and clipping: the run's values, in DeepSpeed's config, train as DDP does with them
    lines = report["zero3-accumulate"]["lines"]
    assert lines[3].startswith("Global batch: 8 = 2 per process x 2 processes x 2 accumulation steps"), lines
    losses, ddp_losses = report["zero3-accumulate"]["losses"], report["ddp-accumulate"]["losses"]
    assert len(losses) == len(ddp_losses) == STEPS
    gap = max(abs(a - b) / abs(b) for a, b in zip(losses, ddp_losses))
    print(f"zero3 vs DDP, 2 accumulation steps, clipping 0.5, after {STEPS} updates: loss rel {gap:.1e}")
    assert losses == pytest.approx(ddp_losses, rel=LOSS_RTOL)

    # ZeRO-3: each process holds about half of the parameters, the big ones only as partitions
    held = [r["zero3_held"] for r in reports]
    total = report["zero3_total"]
    print(f"ZeRO-3 parameters held per process: {[f'{h / total:.1%}' for h in held]}")
    assert all(0.45 < h / total < 0.56 for h in held), (held, total)
    assert all(r["zero3_partitioned"] for r in reports)

    # one model.safetensors, gathered on the main process, that from_pretrained loads
    assert report["zero3"]["model"] == "SparseTransformerForCausalLM" and reports[1]["zero3"]["model"] is None
    ddp_model = SparseTransformerForCausalLM.from_pretrained(tmp_path / "ddp")
    ddp_saved = load_file(tmp_path / "ddp" / "model.safetensors")
    for name in ("zero2", "zero3"):
        saved = load_file(tmp_path / name / "model.safetensors")
        assert set(saved) == set(ddp_saved), name  # the same tensors, a tied weight once
        loaded = SparseTransformerForCausalLM.from_pretrained(tmp_path / name)
        assert loaded.lm_head.weight is loaded.model.embeddings.embed_tokens.weight  # tied
        for key, value in loaded.state_dict().items():
            if key in saved:
                assert torch.equal(value, saved[key]), (name, key)
            assert value.shape == ddp_model.state_dict()[key].shape
        worst = max((v - ddp_model.state_dict()[k]).abs().max().item() for k, v in loaded.state_dict().items())
        print(f"{name} vs DDP weights: max |diff| {worst:.1e}")
        assert worst < 1e-3, (name, worst)


# ----------------------------------------------------------------------------------------- what is refused
@pytest.mark.parametrize(
    "environ, overrides, expected",
    [
        ({}, dict(save_steps="epoch"), "--save_steps epoch (the default)"),
        ({}, dict(save_steps="5"), "--save_steps 5"),
        ({}, dict(stop_after_steps=3), "--stop_after_steps"),
        ({}, dict(resume_from_checkpoint="latest"), "--resume_from_checkpoint"),
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "1"}, {}, "ZeRO stage 1"),
        ({"ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu"}, {}, "offload optimizer to cpu"),
        ({"ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu"}, {}, "offload parameters to cpu"),
        ({}, dict(mixed_precision="bf16"), "asks for bf16 under DeepSpeed on the CPU"),
        ({"WORLD_SIZE": "1"}, {}, "this run has one process and ZeRO shards over processes"),
    ],
)
def test_what_deepspeed_cannot_honour_here_is_refused_in_one_line(tmp_path, monkeypatch, environ, overrides, expected):
    from hf_vit_plus.training.sharding import deepspeed_plugin, parallelism_request

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as a process of `accelerate launch --num_processes 2` sees it
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    args = run_args(tmp_path, **overrides)
    with pytest.raises(UsageError) as error:
        deepspeed_plugin(parallelism_request(False), args, on_cpu=True)
    message = str(error.value)
    assert "\n" not in message and message.startswith("the accelerate config (ACCELERATE_USE_DEEPSPEED=true) asks")
    assert expected in message, message
    if "step" in expected or "resume" in expected:
        assert "weights_only=False" in message and "--save_steps none" in message, message


def test_the_run_s_batch_accumulation_and_clipping_go_into_the_deepspeed_config(tmp_path, monkeypatch):
    from hf_vit_plus.training.sharding import deepspeed_plugin, parallelism_request

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as a process of `accelerate launch --num_processes 2` sees it
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    args = run_args(tmp_path, per_device_train_batch_size=3, gradient_accumulation_steps=2, max_grad_norm=0.5)
    config = deepspeed_plugin(parallelism_request(False), args, on_cpu=True).deepspeed_config
    assert config["train_micro_batch_size_per_gpu"] == 3
    assert config["gradient_accumulation_steps"] == 2
    assert config["gradient_clipping"] == 0.5
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    # a DeepSpeed config that says otherwise is refused, naming both
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "1.0")
    with pytest.raises(UsageError, match=r"sets gradient_clipping to 1.0 and the run asks for --max_grad_norm 0.5"):
        deepspeed_plugin(parallelism_request(False), args, on_cpu=True)
