"""Training on one GPU: transformers' `Trainer` with `bf16=True` and `hf-vit-plus train --mixed_precision bf16`, for
every family; FSDP2 over NCCL where the machine has two GPUs, and on one process the refusal to "shard" alone.

The CPU cells are the same runs on the CPU (`use_cpu`, `--use_cpu`): bf16 autocast exists there too. Tolerance: the
first step's bf16 loss within 3e-2 (relative, or absolute below 1) of the initial model's fp32 loss on that batch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from hf_vit_plus.cli import main
from tests.gpu.common import CUDA, DEVICES, FAMILY_CASES, case_ids, tiny_model
from tests.utils import REPO_ROOT, run_report

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_accelerate_state")]

BF16_LOSS_RTOL = 3e-2
STEPS = 3
# `hf-vit-plus train` per family: tiny models with heads of 16 dimensions (flex_attention's CUDA minimum) and data
FAMILY_ARGS = {
    "vit": ["--config_overrides", "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64",
            "--max_train_samples", "64", "--max_eval_samples", "16"],
    "seq2seq": ["--config_overrides", "d_model=32,encoder_layers=2,decoder_layers=2,encoder_attention_heads=2,"
                "decoder_attention_heads=2,encoder_ffn_dim=64,decoder_ffn_dim=64",
                "--max_train_samples", "64", "--max_eval_samples", "8", "--vocab_size", "300"],
    "sparse-lm": ["--config_overrides", "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,"
                  "intermediate_size=64,sparse_stride=8",
                  "--max_train_samples", "64", "--max_eval_samples", "8", "--block_size", "32"],
    "image-lm": ["--config_overrides", "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64",
                 "--max_train_samples", "64", "--max_eval_samples", "8"],
}  # fmt: skip


def _dataset(case, rows: int = 8):
    from datasets import Dataset

    inputs = case.inputs(batch=rows, labels=True)
    return inputs, Dataset.from_dict({k: v.tolist() for k, v in inputs.items()}).with_format("torch")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", FAMILY_CASES, ids=case_ids(FAMILY_CASES))
def test_trainer_in_bf16(case, device, tmp_path):
    import transformers

    inputs, rows = _dataset(case)
    model = tiny_model(case, device)
    with torch.no_grad():
        fp32_loss = model(**{k: v.to(device) for k, v in inputs.items()}).loss.item()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=len(rows), max_steps=STEPS, learning_rate=1e-3,
        bf16=True, use_cpu=device == "cpu", report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
        seed=0, dataloader_drop_last=False, average_tokens_across_devices=False,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
    assert trainer.args.device.type == device and trainer.accelerator.mixed_precision == "bf16"
    result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert result.global_step == STEPS and len(losses) == STEPS
    assert all(torch.isfinite(torch.tensor(losses)))
    assert abs(losses[0] - fp32_loss) <= BF16_LOSS_RTOL * max(1.0, abs(fp32_loss)), (losses[0], fp32_loss)
    assert next(trainer.model.parameters()).device.type == device
    assert any(not torch.equal(p.detach(), before[name]) for name, p in trainer.model.named_parameters())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(FAMILY_ARGS))
def test_the_train_command_in_bf16(family, device, tmp_path):
    out = tmp_path / "run"
    argv = ["train", family, "--output_dir", str(out), "--mixed_precision", "bf16", "--max_steps", str(STEPS),
            "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--logging_steps", "1",
            "--report_to", "none", "--save_steps", "none", *FAMILY_ARGS[family]]  # fmt: skip
    if device == "cpu":
        argv.append("--use_cpu")
    with run_report() as report:
        status = main(argv)
    lines = report.getvalue().splitlines()
    assert status == 0, report.getvalue()[-3000:]
    where = "CPU" if device == "cpu" else "cuda"
    assert f"Distributed: one process, no data parallelism [NO on {where}], 1 process on 1 machine" in lines
    assert "Precision: bf16 autocast; weights, gradients and optimizer state fp32" in lines
    assert (out / "model.safetensors").is_file()
    metrics = json.loads((out / "eval_results.json").read_text())
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.endswith("loss"))


@pytest.mark.parametrize("device", DEVICES)
def test_fsdp_in_one_process_is_refused(device, tmp_path, capsys):
    """One process cannot shard: `--fsdp` on one GPU (or the CPU) is one line and status 2, before any training."""
    argv = ["train", "vit", "--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--fsdp", "--report_to",
            "none", "--save_steps", "none", *FAMILY_ARGS["vit"]]  # fmt: skip
    if device == "cpu":
        argv.append("--use_cpu")
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2
    [line] = err.strip().splitlines()
    assert "--fsdp asks to shard the model with FSDP, but this run has one process" in line, line
    assert not (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.skipif(not CUDA or torch.cuda.device_count() < 2, reason="FSDP2 over NCCL needs at least 2 CUDA GPUs")
@pytest.mark.parametrize("family", ["vit", "sparse-lm"])
def test_fsdp2_over_nccl_on_two_gpus(family, tmp_path):
    """`torchrun --nproc_per_node 2 -m hf_vit_plus.cli train FAMILY --fsdp --mixed_precision bf16`: two processes,
    NCCL, sharded, one consolidated model saved."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    assert torchrun, "torchrun is missing from this environment"
    out = tmp_path / "run"
    cmd = [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "hf_vit_plus.cli", "train", family, "--fsdp",
           "--mixed_precision", "bf16", "--output_dir", str(out), "--max_steps", str(STEPS), "--report_to", "none",
           "--save_steps", "none", "--per_device_train_batch_size", "4", *FAMILY_ARGS[family]]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "FSDP2" in log and "nccl" in log and "2 processes" in log, log[-3000:]
    assert (out / "model.safetensors").is_file()
