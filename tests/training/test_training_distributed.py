"""Two processes on CPU (gloo): the library loop and transformers' Trainer give what one process gives with the
same global batch.

Two processes are started with `accelerate.debug_launcher` (fork, file rendezvous: no port to collide on), and
once with the README's `accelerate launch --multi_gpu` line. OMP_NUM_THREADS=1 keeps two processes on two cores.

Tolerance: gradients are averaged by an all-reduce in another summation order than one process's mean, so weights
agree to float32 rounding, amplified a little by Adam's normalisation: atol 2e-5 after 6 updates (observed 2.3e-6).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_vit_plus.training.args import family_arguments
from hf_vit_plus.training.loop import train
from tests.utils import REPO_ROOT, TINY_VIT_OVERRIDES, launch_processes

TINY = {
    "vit": TINY_VIT_OVERRIDES,
    "seq2seq": "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64,dropout=0.0",
    "sparse-lm": "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,sparse_stride=8",
}
WEIGHT_ATOL = 2e-5
LOSS_RTOL = 1e-4


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


def vit_args(output_dir: Path, batch: int, **overrides):
    values = dict(
        output_dir=str(output_dir),
        config_overrides=TINY_VIT_OVERRIDES,
        report_to="none",
        write_card=False,
        max_train_samples=128,
        max_eval_samples=63,  # odd: the last eval batch is padded on one process, and gather_for_metrics drops it
        per_device_train_batch_size=batch,
        per_device_eval_batch_size=16,
        save_steps="none",
        logging_steps=1,
        max_steps=6,
        learning_rate=3e-3,
    )
    values.update(overrides)
    return family_arguments("vit", **values)


# 32 examples, 2 global batches of 16: the 6 updates see each example 3 times, so the loss falls by more than the noise
# between batches (with 6 batches never seen before, whether the last loss is below the first is a coin toss).
REPEATED_SAMPLES = 32


def _train_on_each_rank(output_dir: str) -> None:
    from accelerate import PartialState

    result = train(vit_args(Path(output_dir), batch=8, max_train_samples=REPEATED_SAMPLES))
    rank = PartialState().process_index
    weights = {k: v.detach().contiguous() for k, v in result.model.state_dict().items()}
    save_file(weights, str(Path(output_dir) / f"rank{rank}.safetensors"))
    (Path(output_dir) / f"rank{rank}.json").write_text(
        json.dumps({"eval": result.eval_metrics, "losses": [e["loss"] for e in result.log_history if "loss" in e]})
    )


def test_two_processes_equal_one_process_with_the_same_global_batch(tmp_path):
    launch_processes(_train_on_each_rank, (str(tmp_path / "ddp"),), tmp_path / "ddp")
    rank0 = load_file(tmp_path / "ddp" / "rank0.safetensors")
    rank1 = load_file(tmp_path / "ddp" / "rank1.safetensors")
    for key in rank0:  # DDP keeps the replicas identical, bit for bit
        assert torch.equal(rank0[key], rank1[key]), key

    single = train(vit_args(tmp_path / "single", batch=16, max_train_samples=REPEATED_SAMPLES))
    single_weights = single.model.state_dict()
    worst = max((rank0[k] - single_weights[k]).abs().max().item() for k in rank0)
    assert worst < WEIGHT_ATOL, f"2 processes vs 1: max |diff| = {worst:.2e}"
    saved = load_file(tmp_path / "ddp" / "model.safetensors")  # written once, by the main process
    assert set(saved) <= set(rank0) and all(torch.equal(saved[k], rank0[k]) for k in saved)

    ddp = json.loads((tmp_path / "ddp" / "rank0.json").read_text())
    assert ddp["losses"] == pytest.approx([e["loss"] for e in single.log_history if "loss" in e], rel=LOSS_RTOL)
    # evaluation gathers each example exactly once
    assert ddp["eval"]["samples"] == single.eval_metrics["samples"] == 63
    assert ddp["eval"]["accuracy"] == pytest.approx(single.eval_metrics["accuracy"], abs=1e-6)
    # the curve went down: the runs learned something (same data, same order)
    assert sum(ddp["losses"][-2:]) < sum(ddp["losses"][:2]), ddp["losses"]


def _budgeted_on_each_rank(output_dir: str) -> None:
    """A one-minute budget where the processes' own clocks disagree (the main process's reads 10 s more each time,
    the other's 100 s): each stops where the main process's clock says, with its learning rates."""
    from accelerate import PartialState

    from hf_vit_plus.training import budget

    rank = torch.distributed.get_rank()  # the launcher's group; Accelerate's state is made by the run
    reads = iter(range(0, 10**6, 10 if rank == 0 else 100))
    budget.now = lambda: float(next(reads))
    result = train(vit_args(Path(output_dir), batch=8, max_steps=18, max_train_minutes=1.0))
    assert PartialState().process_index == rank
    rates = [e["learning_rate"] for e in result.log_history if "loss" in e]
    (Path(output_dir) / f"rank{rank}.json").write_text(json.dumps({"step": result.global_step, "rates": rates}))


def test_a_time_budget_stops_every_process_at_the_main_process_update(tmp_path):
    launch_processes(_budgeted_on_each_rank, (str(tmp_path / "ddp"),), tmp_path / "ddp")
    rank0, rank1 = (json.loads((tmp_path / "ddp" / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["step"] == rank1["step"] == 6  # 60 s at 10 s an update, on the main process's clock
    assert rank0["rates"] == rank1["rates"] and len(rank0["rates"]) == 6
    assert (tmp_path / "ddp" / "model.safetensors").is_file()


# ---------------------------------------------------------------------------------------------------- Trainer
def _available_families() -> list[str]:
    import importlib.util

    needed = {
        "vit": "hf_vit_plus.models.modeling_vit_plus",
        "seq2seq": "hf_vit_plus.models.modeling_seq2seq_transformer",
        "sparse-lm": "hf_vit_plus.models.modeling_sparse_transformer",
    }
    return [name for name, module in needed.items() if importlib.util.find_spec(module) is not None]


def _trainer_losses(family_name: str, output_dir: str, batch: int) -> None:
    """Fine-tune with transformers' Trainer on the family's data pieces; rank 0 writes the logged losses."""
    from accelerate import PartialState
    from transformers import Trainer, set_seed
    from transformers import TrainingArguments as HFTrainingArguments

    from hf_vit_plus.training.plan import preview_plan
    from hf_vit_plus.training.tasks import get_task

    family = get_task(family_name)
    args = family_arguments(family_name, output_dir=output_dir, config_overrides=TINY[family_name],
                            max_train_samples=64, max_eval_samples=8, block_size=32, vocab_size=300,
                            per_device_train_batch_size=batch)  # fmt: skip
    set_seed(0)
    data = family.load_data(args)
    plan = preview_plan(args, family, data)
    model, processor = family.build(plan, data)
    datasets = family.transform(data, processor, model, plan)
    trainer_args = HFTrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=batch,
        max_steps=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        remove_unused_columns=False,  # the transform reads the raw columns
        dataloader_drop_last=True,
        # the text models divide their summed loss by `num_items_in_batch` (all tokens of all processes); the ViT
        # loss is a per-example mean and ignores it
        average_tokens_across_devices=family_name != "vit",
    )
    trainer = Trainer(
        model=model,
        args=trainer_args,
        train_dataset=datasets["train"],
        data_collator=family.collate_fn(processor),
    )
    trainer.train()
    if PartialState().is_main_process:
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        (Path(output_dir) / "losses.json").write_text(json.dumps(losses))


@pytest.mark.parametrize("family_name", _available_families())
def test_trainer_two_processes_match_one(tmp_path, family_name):
    launch_processes(_trainer_losses, (family_name, str(tmp_path / "ddp"), 4), tmp_path / "ddp")
    two = json.loads((tmp_path / "ddp" / "losses.json").read_text())
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    _trainer_losses(family_name, str(tmp_path / "single"), 8)
    one = json.loads((tmp_path / "single" / "losses.json").read_text())
    assert len(one) == len(two) == 4
    assert two == pytest.approx(one, rel=LOSS_RTOL), (two, one)


def test_accelerate_launch_command_line(tmp_path):
    """The README's launch line: `accelerate launch --multi_gpu --num_processes 2 ...` runs gloo on CPU."""
    output_dir = tmp_path / "launched"
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "hf_vit_plus.cli", "train", "vit", "--output_dir", str(output_dir),
        "--config_overrides", TINY_VIT_OVERRIDES,
        "--report_to", "none", "--max_train_samples", "64", "--max_eval_samples", "16",
        "--per_device_train_batch_size", "8", "--max_steps", "2", "--save_steps", "none",
        "--write_card", "false",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "2 process(es), global batch 16" in output
    assert (output_dir / "model.safetensors").is_file()
    assert json.loads((output_dir / "eval_results.json").read_text())["eval_samples"] == 16


def _attempt(markers: str) -> tuple[int, int]:
    """(this process's rank, how many times it ran before), recorded in `markers`."""
    rank = torch.distributed.get_rank()
    before = len(list(Path(markers).glob(f"rank{rank}-*")))
    (Path(markers) / f"rank{rank}-{before}").touch()
    return rank, before


def _killed_in_the_first_launch(markers: str, workdir: str) -> None:
    rank, before = _attempt(markers)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    (Path(workdir) / f"launch{before}-rank{rank}").touch()
    if rank == 0 and before == 0:
        os.kill(os.getpid(), signal.SIGSEGV)


def _failing(markers: str) -> None:
    _attempt(markers)
    raise AssertionError("a wrong result")


def test_a_process_killed_by_a_signal_is_launched_once_more_in_a_clean_folder(tmp_path):
    markers, workdir = tmp_path / "markers", tmp_path / "work"
    markers.mkdir()
    with pytest.warns(RuntimeWarning, match="_killed_in_the_first_launch: process 0 was killed by SIGSEGV"):
        launch_processes(_killed_in_the_first_launch, (str(markers), str(workdir)), workdir)
    assert sorted(p.name for p in workdir.iterdir()) == ["launch1-rank0", "launch1-rank1"]  # the first's were wiped
    assert (markers / "rank0-1").exists() and not (markers / "rank0-2").exists()


def test_a_process_that_fails_is_not_launched_again(tmp_path):
    from torch.multiprocessing.spawn import ProcessRaisedException

    with pytest.raises(ProcessRaisedException, match="a wrong result"):
        launch_processes(_failing, (str(tmp_path),), tmp_path)
    assert not list(tmp_path.glob("rank*-1"))


def _refused_on_each_rank(output_dir: str) -> None:
    from hf_vit_plus.errors import UsageError

    rank = torch.distributed.get_rank()
    try:
        train(vit_args(Path(output_dir), batch=8, max_steps=2))
        outcome = "trained"
    except UsageError as error:
        outcome = str(error)
    (Path(output_dir) / f"outcome{rank}.txt").write_text(outcome)


def test_a_folder_another_run_holds_is_refused_on_every_process(tmp_path):
    """The main process finds the folder's lock held by a live run (this test's process): every process of the run
    stops with the same refusal, none waits at a barrier for the others."""
    import socket
    from datetime import datetime

    from hf_vit_plus.training.run_lock import LOCK_FILE_NAME

    output_dir = tmp_path / "run"
    output_dir.mkdir()
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": datetime.now().astimezone().isoformat()}
    (output_dir / LOCK_FILE_NAME).write_text(json.dumps(holder))
    launch_processes(_refused_on_each_rank, (str(output_dir),), tmp_path)
    outcomes = [(output_dir / f"outcome{rank}.txt").read_text() for rank in (0, 1)]
    assert outcomes[0] == outcomes[1] and f"pid {os.getpid()}" in outcomes[0], outcomes
    assert not (output_dir / "model.safetensors").exists()


def _rank_1_saves_late(output_dir: str) -> None:
    """Process 1 starts writing its part of each checkpoint (its random states) a second after the main process."""
    from accelerate import Accelerator

    original = Accelerator.save_state

    def late(self, *args, **kwargs):
        if torch.distributed.get_rank() == 1:
            time.sleep(1.0)
        return original(self, *args, **kwargs)

    Accelerator.save_state = late
    train(vit_args(Path(output_dir), batch=8, max_steps=2, save_steps="2"))


def test_the_manifest_is_written_after_every_process_has_written_its_files(tmp_path):
    """A CI run (oldest releases) found a checkpoint whose manifest recorded process 1's random states as 0 bytes: the
    main process wrote the manifest while the other was still writing. Each checkpoint's manifest lists every process's
    files, and the checkpoint matches it."""
    from hf_vit_plus.training.checkpoints import MANIFEST_FILE, checkpoint_problem

    launch_processes(_rank_1_saves_late, (str(tmp_path / "run"),), tmp_path / "run")
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-2"
    listed = json.loads((checkpoint / MANIFEST_FILE).read_text())["files"]
    for rank in (0, 1):
        name = f"random_states_{rank}.pkl"
        assert listed.get(name, {}).get("size") == (checkpoint / name).stat().st_size > 0, (name, listed.get(name))
    assert checkpoint_problem(checkpoint) is None


def _diverge_on_rank_1(output_dir: str) -> None:
    import math

    from accelerate import PartialState

    from hf_vit_plus.training.tasks import get_task

    family = get_task("vit")
    original, calls = family.training_loss, []

    def poisoned(model, batch, extras):  # the loss of process 1 becomes NaN at its third update
        calls.append(1)
        loss = original(model, batch, extras)
        return loss * math.nan if PartialState().process_index == 1 and len(calls) >= 3 else loss

    family.training_loss = poisoned
    result = train(vit_args(Path(output_dir), batch=8, logging_steps=2), family=family)
    rank = PartialState().process_index
    # the run wrote nothing, so its lock took back the folder it had created: the report makes it again
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / f"rank{rank}.json").write_text(
        json.dumps({"stop_reason": result.stop_reason, "global_step": result.global_step})
    )


def test_a_loss_that_diverges_on_one_process_stops_every_process_at_the_same_update(tmp_path):
    launch_processes(_diverge_on_rank_1, (str(tmp_path / "nan"),), tmp_path / "nan")
    for rank in (0, 1):
        seen = json.loads((tmp_path / "nan" / f"rank{rank}.json").read_text())
        # the NaN of update 3 is read at the next logged update, 4: every process stops there, nothing saved
        assert seen == {"stop_reason": "diverged", "global_step": 4}, (rank, seen)
    assert not (tmp_path / "nan" / "model.safetensors").exists()


def _descendants(pid: int) -> list[int]:
    """The processes under `pid` (read from /proc)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _rank_of(pid: int) -> int | None:
    try:
        variables = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [int(v[5:]) for v in variables if v.startswith(b"RANK=")]
    return ranks[0] if ranks else None


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the launched processes through /proc")
def test_a_process_that_stops_answering_ends_the_run_within_the_timeout_naming_it(tmp_path):
    """A machine that stops answering without closing its connections (power, network) left the others waiting for the
    process group's 30 minutes. With --ddp_timeout 10, `accelerate launch` of 2 processes whose rank 1 is stopped
    (SIGSTOP) after its first checkpoint: rank 0 ends within the timeout and the few seconds it waits for answers,
    with one line naming process 1; the complete checkpoints are intact."""
    from hf_vit_plus.training.checkpoints import checkpoint_problem, complete_checkpoint_dirs
    from hf_vit_plus.training.peers import ANSWER_SECONDS

    timeout = 10
    output_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "hf_vit_plus.cli", "train", "vit", "--output_dir", str(output_dir),
        "--config_overrides", TINY_VIT_OVERRIDES, "--report_to", "none", "--max_train_samples", "256",
        "--max_eval_samples", "16", "--per_device_train_batch_size", "8", "--num_train_epochs", "1000",
        "--save_steps", "2", "--write_card", "false", "--ddp_timeout", str(timeout),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    log = tmp_path / "launch.log"
    with log.open("w") as sink:
        launcher = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    stopped = None
    try:
        deadline = time.monotonic() + 300
        while not list(output_dir.glob("checkpoints/checkpoint-*/manifest.json")):
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        ranks = {pid: _rank_of(pid) for pid in _descendants(launcher.pid)}
        stopped = next(pid for pid, rank in ranks.items() if rank == 1)
        main = next(pid for pid, rank in ranks.items() if rank == 0)
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        while Path(f"/proc/{main}").exists() and (Path(f"/proc/{main}/stat").read_text().split()[2] != "Z"):
            assert time.monotonic() - start < timeout + ANSWER_SECONDS + 60, log.read_text()[-3000:]
            time.sleep(0.2)
        ended = time.monotonic() - start
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGKILL)  # what the launcher would do after its own grace period
        try:
            launcher.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    output = log.read_text()
    lines = [line for line in output.splitlines() if "stopped answering" in line]
    assert len(lines) == 1, output[-3000:]
    assert "Process 1 (on " in lines[0] and f"--ddp_timeout {timeout} s" in lines[0], lines[0]
    assert "Traceback" not in output.split("stopped answering")[0][-2000:]  # rank 0 ends with the line alone
    # within the timeout, the wait for answers (at most half the timeout) and the time to start waiting
    assert ended < timeout + timeout / 2 + 15, (ended, output[-2000:])
    complete = complete_checkpoint_dirs(output_dir)
    assert complete and all(checkpoint_problem(path) is None for path in complete)
    assert str(complete[-1]) in lines[0]
    assert launcher.returncode != 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_two_machine_run_saves_its_checkpoints_quietly(tmp_path):
    """Two `accelerate launch --num_machines 2` on loopback, one process each, a language model with tied weights and a
    checkpoint at every update: no "Removed shared tensor {'lm_head.weight'} while saving" (accelerate's, once per
    save and process: 600 lines in a 2-machine run) and no other per-save line."""
    output_dir = tmp_path / "run"
    port = str(_free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    launchers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "accelerate.commands.launch",
                "--multi_gpu",
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
                "--mixed_precision",
                "no",
                "--dynamo_backend",
                "no",
                "-m",
                "hf_vit_plus.cli",
                "train",
                "sparse-lm",
                "--output_dir",
                str(output_dir),
                "--config_overrides",
                TINY["sparse-lm"],
                "--max_train_samples",
                "64",
                "--max_eval_samples",
                "8",
                "--block_size",
                "32",
                "--per_device_train_batch_size",
                "4",
                "--max_steps",
                "3",
                "--save_steps",
                "1",
                "--report_to",
                "none",
                "--write_card",
                "false",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outputs = [launcher.communicate(timeout=600)[0] for launcher in launchers]
    for launcher, output in zip(launchers, outputs):
        assert launcher.returncode == 0, output[-4000:]
        assert "Removed shared tensor" not in output and "[RANK" not in output, output[-4000:]
    assert "2 processes on 2 machines" in outputs[0], outputs[0][-3000:]
    assert (output_dir / "checkpoints" / "checkpoint-3").is_dir() and (output_dir / "model.safetensors").is_file()
