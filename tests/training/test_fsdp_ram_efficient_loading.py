"""FSDP2's cpu_ram_efficient_loading (the answer `accelerate config` gives by default) on two CPU processes (gloo):
only the main process reads the pretrained weights, the other builds the model on the meta device and receives its
shards; the run trains exactly as one where every process reads the weights. Then the configs that `accelerate
config` writes with its default answers, for FSDP and DeepSpeed ZeRO-2/3, built with accelerate's config classes and
launched with `accelerate launch --config_file`.

Two processes are forked with `accelerate.debug_launcher` (see test_training_fsdp.py; this file too runs first, in an
interpreter of its own: see the Makefile's DISTRIBUTED_TESTS).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.training.test_training_fsdp import _env, _reset_accelerate, run_args
from tests.utils import launch_processes

STEPS = 8
FAMILY = "seq2seq"  # a tied weight (one matrix, four modules) and non-persistent buffers (the position tables)
TIED = [["model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head"]]

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


def _save_pretrained(root: Path) -> Path:
    """A tiny seq2seq model, its weights drawn with a seed of their own, saved with its tokenizer (the 'pretrained'
    checkpoint). Built in the test's process: no autograd, so the processes can still be forked."""
    from hf_vit_plus.training.plan import preview_plan
    from hf_vit_plus.training.tasks import get_task

    family = get_task(FAMILY)
    args = run_args(FAMILY, root / "unused")
    data = family.load_data(args)
    model, tokenizer = family.build(preview_plan(args, family, data), data)
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for value in model.state_dict().values():  # the tied matrix once per name: the last draw stays
            value.copy_(torch.randn(value.shape, generator=generator) * 0.05)
    path = root / "pretrained"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@contextlib.contextmanager
def _launcher_asks(efficient: bool):
    """FSDP_CPU_RAM_EFFICIENT_LOADING, as `accelerate launch` gives it from fsdp_cpu_ram_efficient_loading."""
    saved = os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING")
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = str(efficient).lower()
    try:
        yield
    finally:
        os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING")
        if saved is not None:
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = saved


@contextlib.contextmanager
def _counting_reads(auto_class, reads: list):
    """Count the calls of `auto_class.from_pretrained` (the only place the loop reads a saved model's weights)."""
    original = auto_class.__dict__["from_pretrained"]

    def counting(cls, *args, **kwargs):
        reads.append(1)
        return original.__func__(cls, *args, **kwargs)

    auto_class.from_pretrained = classmethod(counting)
    try:
        yield
    finally:
        auto_class.from_pretrained = original


def _with_and_without(root: str, pretrained: str) -> None:
    """In each process: fine-tune `pretrained` under FSDP2 with every process reading it, then with
    cpu_ram_efficient_loading; then a look at a freshly prepared run of the latter. Each process writes its report."""
    from hf_vit_plus import Seq2SeqTransformerForConditionalGeneration
    from hf_vit_plus.training.loop import set_up_run, train
    from hf_vit_plus.training.sharding import tied_module_groups
    from hf_vit_plus.training.tasks import get_task

    root_path, family = Path(root), get_task(FAMILY)
    report: dict = {}
    for name, efficient in (("every", False), ("main", True)):
        reads: list = []
        with _launcher_asks(efficient), _counting_reads(family.auto_model_class, reads):
            result = train(run_args(FAMILY, root_path / name, fsdp=True, model_name_or_path=pretrained,
                                    max_steps=STEPS))  # fmt: skip
        report[name] = {"losses": [e["loss"] for e in result.log_history if "loss" in e], "reads": len(reads)}
        _reset_accelerate()
    with _launcher_asks(True):
        args = run_args(FAMILY, root_path / "look", fsdp=True, model_name_or_path=pretrained)
        run = set_up_run(args, family)
    model = run.accelerator.unwrap_model(run.model)
    reference = Seq2SeqTransformerForConditionalGeneration.from_pretrained(pretrained)  # each process reads it here
    weights, buffers = reference.state_dict(), dict(reference.named_buffers())
    full = {name: param.full_tensor() for name, param in model.named_parameters()}  # collective
    held = [id(p) for group in run.optimizer.param_groups for p in group["params"]]
    report["look"] = {
        "weights": sorted(name for name, value in full.items() if not torch.equal(value, weights[name])),
        "buffers": sorted(name for name, value in model.named_buffers() if not torch.equal(value, buffers[name])),
        "buffer_names": sorted(buffers),
        "meta": [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta],
        "tied": tied_module_groups(model),
        "optimizer_holds_the_parameters": sorted(held) == sorted(id(p) for p in model.parameters() if p.requires_grad),
    }
    _reset_accelerate()
    rank = torch.distributed.get_rank()
    (root_path / f"report{rank}.json").write_text(json.dumps(report))


def test_only_the_main_process_reads_the_weights_and_the_run_is_the_same(tmp_path):
    pretrained = _save_pretrained(tmp_path)
    launch_processes(_with_and_without, (str(tmp_path), str(pretrained)), tmp_path)
    reports = [json.loads((tmp_path / f"report{rank}.json").read_text()) for rank in (0, 1)]

    # every process reads the checkpoint without the flag; with it, the main process alone
    assert [r["every"]["reads"] for r in reports] == [1, 1]
    assert [r["main"]["reads"] for r in reports] == [1, 0]
    # the same updates: the losses equal those of the run where every process read the weights
    every, main = reports[0]["every"]["losses"], reports[0]["main"]["losses"]
    assert len(every) == len(main) == STEPS
    gap = max(abs(m - e) / abs(e) for m, e in zip(main, every))
    print(f"cpu_ram_efficient_loading vs every process reading, {STEPS} updates: largest relative loss gap {gap:.1e}")
    assert main == every  # the same operations on the same weights: equal bit for bit (measured: gap 0)
    # on every process, once prepared: the pretrained weights (the shards' full view), the buffers (non-persistent
    # ones too), the tied embedding still one parameter, nothing left on meta, the optimizer on the sharded parameters
    for report in reports:
        look = report["look"]
        assert look["weights"] == [] and look["buffers"] == [] and look["meta"] == [], look
        assert [name for name in look["buffer_names"] if name.endswith("embed_positions")], look  # non-persistent
        assert look["tied"] == TIED
        assert look["optimizer_holds_the_parameters"]
    # the saved model loads, and is the run's without the flag
    from transformers import AutoModelForSeq2SeqLM

    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "main")
    saved_every = load_file(tmp_path / "every" / "model.safetensors")
    for name, value in loaded.state_dict().items():
        if name in saved_every:
            torch.testing.assert_close(value, saved_every[name], rtol=0, atol=1e-6)
    assert loaded.lm_head.weight is loaded.model.shared.weight is loaded.model.encoder.embed_tokens.weight


# ------------------------------------------------------------------------- the configs `accelerate config` writes
def _questionnaire(monkeypatch, answers: dict) -> object:
    """The ClusterConfig that accelerate's own questionnaire (`accelerate config`: `get_cluster_input`) builds when
    every question gets its default answer, but those of `answers` (the start of a question -> a menu's choice or a
    typed answer). DeepSpeed counts as installed (the questionnaire asserts it): what a machine with it writes."""
    from accelerate.commands.config import cluster
    from accelerate.commands.menu import BulletMenu

    def answer(prompt: str):
        return next((value for start, value in answers.items() if prompt.strip().startswith(start)), None)

    def choose(menu, default_choice=0):
        chosen = answer(menu.prompt)
        return default_choice if chosen is None else menu.choices.index(chosen)

    monkeypatch.setattr("builtins.input", lambda prompt="": answer(prompt) or "")  # "": the default
    monkeypatch.setattr(BulletMenu, "run", choose)
    monkeypatch.setattr(cluster, "is_deepspeed_available", lambda: True)
    return cluster.get_cluster_input()


MULTI_GPU = {"Which type of machine": "multi-GPU", "How many GPU(s)": "2"}  # then `accelerate launch` on the CPU


@pytest.mark.parametrize(
    "name, answers",
    [
        ("fsdp", {"Do you want to use FullyShardedDataParallel": "yes"}),
        ("zero2", {"Do you want to use DeepSpeed": "yes"}),
        ("zero3", {"Do you want to use DeepSpeed": "yes", "What should be your DeepSpeed's ZeRO": 3}),
    ],
)
def test_the_configs_accelerate_config_writes_by_default_run_or_are_refused_in_one_line(
    tmp_path, monkeypatch, name, answers
):
    """`accelerate config` with the default answers (FSDP2, cpu_ram_efficient_loading yes, the model's layers;
    DeepSpeed ZeRO-2, or 3, nothing offloaded), launched on 2 CPU processes to fine-tune a saved model: it trains,
    or (DeepSpeed not installed) stops with one line saying so."""
    import importlib.util

    config = _questionnaire(monkeypatch, {**MULTI_GPU, **answers})
    if name == "fsdp":
        assert config.fsdp_config["fsdp_version"] == 2 and config.fsdp_config["fsdp_cpu_ram_efficient_loading"]
    else:
        assert config.deepspeed_config["zero_stage"] == int(name[-1])
    path = tmp_path / f"{name}.yaml"
    config.to_yaml_file(path)
    monkeypatch.undo()  # input() and the menu as they were
    pretrained = _save_pretrained(tmp_path)
    output_dir = tmp_path / "run"
    train = [
        "-m", "hf_vit_plus.cli", "train", FAMILY, "--model_name_or_path", str(pretrained), "--output_dir",
        str(output_dir), "--max_steps", "2", "--save_steps", "none", "--max_train_samples", "32",
        "--max_eval_samples", "8", "--per_device_train_batch_size", "4", "--report_to", "none", "--write_card",
        "false",
    ]  # fmt: skip
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path), *train]
    proc = subprocess.run(launch, capture_output=True, text=True, env=_env(), timeout=600)
    output = proc.stdout + proc.stderr
    if name != "fsdp" and importlib.util.find_spec("deepspeed") is None:
        # accelerate launch stops before any process starts (its own ImportError); hf-vit-plus train, given the
        # variables accelerate's launcher makes of this config, refuses it in one line
        assert proc.returncode != 0 and "DeepSpeed is not installed" in output, output[-3000:]
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
        from accelerate.utils.launch import prepare_deepspeed_cmd_env

        args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(launch[3:]))
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)  # as launch_command sets
        variables = {k: v for k, v in prepare_deepspeed_cmd_env(args)[1].items() if k.startswith("ACCELERATE_")}
        assert variables["ACCELERATE_USE_DEEPSPEED"] == "true"
        proc = subprocess.run([sys.executable, *train], capture_output=True, text=True, env={**_env(), **variables})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        [line] = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert line.endswith("asks for DeepSpeed, which is not installed (pip install deepspeed)."), line
        return
    assert proc.returncode == 0, output[-4000:]
    assert (output_dir / "model.safetensors").exists()
    if name == "fsdp":
        sharding = next(line for line in proc.stderr.splitlines() if line.startswith("Sharding: "))
        assert sharding.endswith("pretrained weights: read by the main process only, sent to the others"), sharding
    else:
        assert f"DeepSpeed ZeRO stage {name[-1]}" in output, output[-3000:]
