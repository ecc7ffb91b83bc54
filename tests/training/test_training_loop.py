"""The Accelerate training loop on one process: learning, gradient accumulation, exact resume, bad input, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_vit_plus.training.args import TrainingArguments, family_arguments
from hf_vit_plus.training.checkpoints import checkpoint_dirs, write_manifest
from hf_vit_plus.training.cli import parse_args
from hf_vit_plus.training.loop import train
from tests.utils import REPO_ROOT, TINY_VIT_OVERRIDES, run_report

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


def tiny_vit(tmp_path: Path, name: str = "run", **overrides) -> TrainingArguments:
    values = dict(
        output_dir=str(tmp_path / name),
        config_overrides=TINY_VIT_OVERRIDES,
        report_to="none",
        write_card=False,
        max_train_samples=96,
        max_eval_samples=64,
        per_device_train_batch_size=16,
        save_steps="none",
        logging_steps=1,
        num_train_epochs=1.0,
    )
    values.update(overrides)
    return family_arguments("vit", **values)


def test_vit_learns_digits_and_logs_to_tensorboard(tmp_path):
    args = tiny_vit(
        tmp_path,
        max_train_samples=None,
        max_eval_samples=None,
        per_device_train_batch_size=32,
        num_train_epochs=10.0,
        learning_rate=3e-3,
        logging_steps=40,
        report_to="tensorboard",
    )
    result = train(args)
    assert result.global_step == result.total_steps == 10 * (1437 // 32)
    # 10 classes: chance is 10%; a 2-block ViT of width 32 reaches over 85% in 10 epochs
    assert result.eval_metrics["accuracy"] >= 0.85, result.eval_metrics
    assert result.eval_metrics["samples"] == 360
    losses = [e["loss"] for e in result.log_history if "loss" in e]
    assert losses[-1] < 0.5 * losses[0]
    events = list((tmp_path / "run" / "logs").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file written"
    saved = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert saved["eval_accuracy"] == pytest.approx(result.eval_metrics["accuracy"])


def test_gradient_accumulation_equals_the_big_batch(tmp_path):
    """2 micro-batches of 16 accumulated == one batch of 32: the first update happens after two micro-batches."""
    accumulated = train(tiny_vit(tmp_path, "acc", per_device_train_batch_size=16, gradient_accumulation_steps=2))
    big = train(tiny_vit(tmp_path, "big", per_device_train_batch_size=32, gradient_accumulation_steps=1))
    assert accumulated.global_step == big.global_step == 3
    a = load_file(tmp_path / "acc" / "model.safetensors")
    b = load_file(tmp_path / "big" / "model.safetensors")
    initial = train(tiny_vit(tmp_path, "zero", max_steps=1, learning_rate=1e-12))
    z = load_file(tmp_path / "zero" / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(a[k], z[k]) for k in a), "training did not change the weights"
    assert initial.global_step == 1


def test_activation_checkpointing_gives_the_same_updates(tmp_path):
    plain = train(tiny_vit(tmp_path, "plain", max_steps=3))
    checkpointed = train(tiny_vit(tmp_path, "ckpt", max_steps=3, activation_checkpointing=True))
    a = load_file(tmp_path / "plain" / "model.safetensors")
    b = load_file(tmp_path / "ckpt" / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert [e["loss"] for e in plain.log_history if "loss" in e] == pytest.approx(
        [e["loss"] for e in checkpointed.log_history if "loss" in e], rel=1e-5
    )


def test_adamw_is_fused_on_plain_parameters_and_updates_as_the_per_tensor_loop(tmp_path):
    """torch's AdamW on the CPU defaults to its per-tensor loop (3.8 ms an update of the 805k-parameter Fashion-MNIST
    ViT, 0.8 ms fused): the families' optimiser takes the fused kernel where every trainable parameter is a plain
    tensor on the CPU or a CUDA GPU, and its updates are the loop's to rounding."""
    import copy

    from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification
    from hf_vit_plus.training.tasks import get_task, weight_decay_groups
    from hf_vit_plus.training.tasks.base import fused_optimizer_supported

    config = ViTPlusConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=32, num_labels=3)  # fmt: skip
    torch.manual_seed(0)
    model = ViTPlusForImageClassification(config)
    reference = copy.deepcopy(model)
    from hf_vit_plus.training.plan import preview_plan

    args = tiny_vit(tmp_path, learning_rate=1e-2)
    fused = get_task("vit").create_optimizer(model, preview_plan(args, get_task("vit")))
    assert fused.defaults["fused"] is True
    betas, eps = (args.adam_beta1, args.adam_beta2), args.adam_epsilon
    groups = weight_decay_groups(reference, args.weight_decay)
    loop = torch.optim.AdamW(groups, lr=args.learning_rate, betas=betas, eps=eps, foreach=False)
    pixels, labels = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    for _ in range(3):
        for net, optimizer in ((model, fused), (reference, loop)):
            net(pixel_values=pixels, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    for (name, got), expected in zip(model.named_parameters(), reference.parameters()):
        if name.endswith("k_proj.bias"):  # softmax ignores a key bias: its gradient is rounding, which Adam scales up
            continue
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=name)

    model.requires_grad_(False)
    assert not fused_optimizer_supported(model)  # nothing to update
    model.classifier.requires_grad_(True)
    assert fused_optimizer_supported(model)
    model.classifier.to("meta")  # a device without the fused kernel: torch's own default then
    assert not fused_optimizer_supported(model)


def test_torch_compile_trains_and_saves_the_models_own_weights(tmp_path):
    """--torch_compile (transformers' TrainingArguments name) compiles the prepared model for the updates; what is
    saved (the model, the EMA, the training states) keeps the model's own parameter names, so the folder loads
    without torch.compile and an eager run resumes a compiled one. (The first version wrapped the model with
    `torch.compile(model)`: every name started with `_orig_mod.`, and the saved folder loaded as untrained weights.)"""
    from transformers import AutoModelForImageClassification

    common = dict(max_steps=4, save_steps="2", ema_decay=0.9)
    eager = train(tiny_vit(tmp_path, "eager", **common))
    with run_report() as report:
        compiled = train(tiny_vit(tmp_path, "compiled", torch_compile=True, **common))
    assert "torch.compile: the first update compiles the model" in report.getvalue()
    expected = load_file(tmp_path / "eager" / "model.safetensors")
    got = load_file(tmp_path / "compiled" / "model.safetensors")
    assert got.keys() == expected.keys()
    for name in expected:  # the same updates as the eager run, to the compiler's rounding
        torch.testing.assert_close(got[name], expected[name], rtol=1e-3, atol=1e-4, msg=name)
    assert [e["loss"] for e in compiled.log_history if "loss" in e] == pytest.approx(
        [e["loss"] for e in eager.log_history if "loss" in e], rel=1e-3
    )
    loaded = AutoModelForImageClassification.from_pretrained(tmp_path / "compiled")
    for name, value in loaded.state_dict().items():
        torch.testing.assert_close(value, got[name], msg=name)
    halfway = compiled.last_checkpoint.parent / "checkpoint-2"
    resumed = train(tiny_vit(tmp_path, "resumed", resume_from_checkpoint=str(halfway), **common))  # eager
    assert resumed.global_step == 4
    for name, value in load_file(tmp_path / "resumed" / "model.safetensors").items():
        torch.testing.assert_close(value, got[name], rtol=1e-3, atol=1e-4, msg=name)


def _load_bin(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _assert_same_tree(a, b, where=""):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"tensors differ at {where}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same_tree(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_resume_mid_epoch_is_bitwise_identical(tmp_path):
    """Stopped after 4 updates (mid-epoch 1, with dropout and gradient accumulation), then resumed from 'latest':
    the weights, optimizer and scheduler state are bitwise those of an uninterrupted run."""
    common = dict(
        config_overrides=TINY_VIT_OVERRIDES + ",hidden_dropout_prob=0.1",
        gradient_accumulation_steps=2,
        num_train_epochs=3.0,  # 6 micro-batches = 3 updates per epoch, 9 in all
        save_steps="100",  # only the final state is saved (plus the stop)
    )
    full = train(tiny_vit(tmp_path, "full", **common))
    stopped = train(tiny_vit(tmp_path, "split", stop_after_steps=4, **common))
    assert stopped.interrupted and stopped.global_step == 4
    state = json.loads((stopped.last_checkpoint / "training_state.json").read_text())
    assert (state["epoch"], state["batches_in_epoch"]) == (1, 2)  # mid-epoch
    resumed = train(tiny_vit(tmp_path, "split", resume_from_checkpoint="latest", **common))
    assert resumed.global_step == full.global_step == 9
    final_full, final_resumed = full.last_checkpoint, resumed.last_checkpoint
    assert final_full.name == final_resumed.name == "checkpoint-9"
    _assert_same_tree(load_file(final_full / "model.safetensors"), load_file(final_resumed / "model.safetensors"))
    for name in ("optimizer.bin", "scheduler.bin"):
        _assert_same_tree(_load_bin(final_full / name), _load_bin(final_resumed / name), name)
    losses = [e["loss"] for e in full.log_history if "loss" in e]
    assert losses == [e["loss"] for e in resumed.log_history if "loss" in e]
    # the interrupted run's checkpoint is complete (no temporary folder left behind)
    assert not list((tmp_path / "split" / "checkpoints").glob(".tmp-*"))


# ---------------------------------------------------------------------------------------------------- bad input
def test_unknown_column_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"--image_column_name='photo'.*Available columns: \['image', 'label'\]"):
        train(tiny_vit(tmp_path, image_column_name="photo"))
    with pytest.raises(ValueError, match=r"--label_column_name='digit'"):
        train(tiny_vit(tmp_path, label_column_name="digit"))


def test_label_count_mismatch_is_named(tmp_path):
    from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification

    config = ViTPlusConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=64, num_labels=3)  # fmt: skip
    ViTPlusForImageClassification(config).save_pretrained(tmp_path / "three_classes")
    with pytest.raises(ValueError, match=r"10 classes but the model .*three_classes.* num_labels=3"):
        train(tiny_vit(tmp_path, model_name_or_path=str(tmp_path / "three_classes")))


def test_resume_refuses_missing_paths_and_other_models(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train(tiny_vit(tmp_path, resume_from_checkpoint=str(tmp_path / "nowhere")))
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        train(tiny_vit(tmp_path, "empty", resume_from_checkpoint="latest"))
    (tmp_path / "not_a_checkpoint").mkdir()
    with pytest.raises(ValueError, match="not a training checkpoint"):
        train(tiny_vit(tmp_path, resume_from_checkpoint=str(tmp_path / "not_a_checkpoint")))
    other = train(tiny_vit(tmp_path, "other", stop_after_steps=1))
    wider = TINY_VIT_OVERRIDES.replace("hidden_size=32", "hidden_size=64")
    with pytest.raises(ValueError, match=r"another model.*hidden_size: checkpoint=32, this run=64"):
        train(tiny_vit(tmp_path, config_overrides=wider, resume_from_checkpoint=str(other.last_checkpoint)))
    state = json.loads((other.last_checkpoint / "training_state.json").read_text())
    state["family"] = "seq2seq"
    (other.last_checkpoint / "training_state.json").write_text(json.dumps(state))
    write_manifest(other.last_checkpoint)  # edited on purpose: a complete checkpoint of another family
    with pytest.raises(ValueError, match="belongs to the 'seq2seq' family"):
        train(tiny_vit(tmp_path, resume_from_checkpoint=str(other.last_checkpoint)))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(per_device_train_batch_size=0), "--per_device_train_batch_size must be a positive integer"),
        (dict(save_steps="often"), "--save_steps must be"),
        (dict(mixed_precision="fp8"), "--mixed_precision must be one of"),
        (dict(push_to_hub=True), "--push_to_hub needs --hub_model_id"),
        (dict(train_dir="a", train_file="b.csv"), "either --train_dir"),
    ],
)
def test_bad_arguments(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_vit(tmp_path, **overrides)


def test_cli_parser_uses_family_defaults():
    vit = parse_args("vit", ["--output_dir", "x", "--max_steps", "5", "--activation_checkpointing"])
    assert (vit.family, vit.max_steps, vit.activation_checkpointing, vit.num_train_epochs) == ("vit", 5, True, 30.0)
    assert vit.learning_rate is None  # the --recipe's, when the run is planned
    assert set(vit.given) == {"output_dir", "max_steps", "activation_checkpointing"}
    s2s = parse_args("seq2seq", [])
    assert (s2s.adam_beta2, s2s.adam_epsilon, s2s.label_smoothing_factor) == (0.98, 1e-9, 0.1)  # the paper's
    # the paper's schedule scaled to the run (issue: the paper's factor with 200 warm-up updates learned nothing):
    # its peak learning rate, reached after a tenth of the updates
    assert (s2s.learning_rate, s2s.warmup_steps, s2s.warmup_ratio, s2s.max_grad_norm) == (1.25e-3, None, 0.1, 1.0)


def test_image_folder_user_data(tmp_path):
    """--train_dir: class names come from the folder names; a missing folder is named."""
    from hf_vit_plus.data.digits import load_digits_dataset

    digits = load_digits_dataset()["train"]
    names = digits.features["label"].names
    counts: dict[str, int] = {}
    for row in digits.select(range(200)):
        if row["label"] > 2:
            continue
        folder = tmp_path / "images" / names[row["label"]]
        folder.mkdir(parents=True, exist_ok=True)
        counts[names[row["label"]]] = counts.get(names[row["label"]], 0) + 1
        row["image"].save(folder / f"{counts[names[row['label']]]}.png")
    args = tiny_vit(
        tmp_path,
        train_dir=str(tmp_path / "images"),
        max_train_samples=None,
        max_steps=2,
        per_device_train_batch_size=8,
        config_overrides=TINY_VIT_OVERRIDES + ",image_size=8,patch_size=2",
    )
    result = train(args)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert sorted(config["id2label"].values()) == ["one", "two", "zero"]
    assert config["num_channels"] == 3 and result.global_step == 2
    with pytest.raises(FileNotFoundError, match="--train_dir .*missing.* does not exist"):
        train(tiny_vit(tmp_path, train_dir=str(tmp_path / "missing")))


def test_sigterm_saves_the_state_exits_143_and_resumes_exactly(tmp_path):
    """SIGTERM stops the run after the update under way with its state saved and exit status 143 (as a process that
    SIGTERM ended: `train ... && push ...` goes no further); `--resume_from_checkpoint latest` then continues it to
    the weights and optimizer state of a run that was never stopped."""
    from hf_vit_plus.cli import main
    from hf_vit_plus.training.cli import SIGTERM_EXIT_STATUS

    def flags(name: str, *more: str) -> list[str]:
        return [
            "train", "vit", "--output_dir", str(tmp_path / name), "--config_overrides", TINY_VIT_OVERRIDES,
            "--report_to", "none", "--max_steps", "1000", "--max_train_samples", "64", "--max_eval_samples", "16",
            "--per_device_train_batch_size", "16", "--save_steps", "none", "--write_card", "false", *more,
        ]  # fmt: skip

    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    command = [sys.executable, "-m", "hf_vit_plus.cli", *flags("stopped")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        for line in proc.stdout:  # the loop runs (the handler is installed before this line): stop it at once
            lines.append(line)
            if line.startswith("Training vit"):
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines) + out
    assert proc.returncode == SIGTERM_EXIT_STATUS == 143, output[-3000:]
    assert "SIGTERM" in output
    output_dir = tmp_path / "stopped"
    [checkpoint] = checkpoint_dirs(output_dir)
    state = json.loads((checkpoint / "training_state.json").read_text())
    stopped_at = state["global_step"]
    assert 1 <= stopped_at < 1000 and checkpoint.name == f"checkpoint-{stopped_at}"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "optimizer.bin").is_file()
    assert not (output_dir / "model.safetensors").exists()  # no final model: the run did not finish

    # Two updates more, from the saved state and from the start (--stop_after_steps keeps the run's schedule).
    later = str(stopped_at + 2)
    assert main(flags("stopped", "--resume_from_checkpoint", "latest", "--stop_after_steps", later)) == 0
    assert main(flags("never_stopped", "--stop_after_steps", later)) == 0
    resumed, never_stopped = (
        tmp_path / name / "checkpoints" / f"checkpoint-{later}" for name in ("stopped", "never_stopped")
    )
    _assert_same_tree(load_file(resumed / "model.safetensors"), load_file(never_stopped / "model.safetensors"))
    _assert_same_tree(_load_bin(resumed / "optimizer.bin"), _load_bin(never_stopped / "optimizer.bin"), "optimizer")


def test_bf16_mixed_precision_trains(tmp_path):
    result = train(tiny_vit(tmp_path, mixed_precision="bf16", max_steps=3))
    losses = [e["loss"] for e in result.log_history if "loss" in e]
    assert len(losses) == 3 and all(0 < loss < 10 for loss in losses)
    weights = load_file(tmp_path / "run" / "model.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())  # autocast: the master weights stay fp32


def test_text_columns_are_checked(tmp_path):
    (tmp_path / "pairs.csv").write_text("question,answer\n1,one\n2,two\n3,three\n")
    text_args = dict(output_dir=str(tmp_path / "t"), report_to="none", train_file=str(tmp_path / "pairs.csv"))
    with pytest.raises(ValueError, match=r"Cannot guess the --source_column.*'question', 'answer'"):
        train(family_arguments("seq2seq", **text_args))
    with pytest.raises(ValueError, match=r"Unknown column --target_column='words'"):
        train(family_arguments("seq2seq", source_column="question", target_column="words", **text_args))
    (tmp_path / "lines.jsonl").write_text('{"body": "hello"}\n{"body": "world"}\n')
    text_args["train_file"] = str(tmp_path / "lines.jsonl")
    with pytest.raises(ValueError, match=r"Unknown column --text_column='text_'.*\['body'\]"):
        train(family_arguments("sparse-lm", text_column="text_", **text_args))
    with pytest.raises(ValueError, match="expected one of the extensions"):
        train(family_arguments("sparse-lm", **dict(text_args, train_file=__file__)))


TINY_SEQ2SEQ = (
    "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64"
)


def test_seq2seq_stop_and_resume_reuses_the_trained_tokenizer(tmp_path):
    common = dict(
        output_dir=str(tmp_path / "s2s"),
        config_overrides=TINY_SEQ2SEQ,
        report_to="none",
        write_card=False,
        max_train_samples=128,
        max_eval_samples=16,
        max_steps=6,
        save_steps="none",
        logging_steps=1,
    )
    stopped = train(family_arguments("seq2seq", stop_after_steps=2, **common))
    assert (stopped.last_checkpoint / "processor" / "tokenizer.json").is_file()
    resumed = train(family_arguments("seq2seq", resume_from_checkpoint="latest", **common))
    assert resumed.global_step == 6 and not resumed.interrupted
    saved = json.loads((tmp_path / "s2s" / "tokenizer.json").read_text())
    in_checkpoint = json.loads((stopped.last_checkpoint / "processor" / "tokenizer.json").read_text())
    assert saved["model"]["vocab"] == in_checkpoint["model"]["vocab"]
    assert set(resumed.eval_metrics) >= {"loss", "perplexity", "token_accuracy", "exact_match"}


# ------------------------------------------------------------------------------------------------ regressions
def test_fine_tuning_a_saved_vit(tmp_path):
    """--model_name_or_path of a saved ViT (it crashed: the labels went to the model's __init__); with
    --ignore_mismatched_sizes a head of another size is replaced."""
    from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification

    for num_labels in (10, 3):
        config = ViTPlusConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64, num_labels=num_labels)  # fmt: skip
        saved, run = tmp_path / f"saved{num_labels}", f"tuned{num_labels}"
        ViTPlusForImageClassification(config).save_pretrained(saved)
        result = train(tiny_vit(tmp_path, run, config_overrides=None, model_name_or_path=str(saved),
                                ignore_mismatched_sizes=num_labels != 10, max_steps=1))  # fmt: skip
        assert result.global_step == 1
        tuned = json.loads((tmp_path / run / "config.json").read_text())
        assert tuned["id2label"]["0"] == "zero" and len(tuned["id2label"]) == 10


def test_train_runs_outside_the_main_thread(tmp_path):
    """Signals belong to the main thread: a run in another thread (a notebook or service worker) must not fail when
    it gives the SIGTERM handler back (it raised ValueError at the end of every run)."""
    import threading

    results, errors = [], []

    def run():
        try:
            results.append(train(tiny_vit(tmp_path, max_steps=1)))
        except Exception as error:  # reported by the assertion below
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not errors and results[0].global_step == 1, errors


def test_a_seq2seq_config_folder_gets_the_runs_label_smoothing_and_vocabulary(tmp_path):
    """A fresh seq2seq model from a --config_name folder is sized for the tokenizer and uses
    --label_smoothing_factor, as one from a preset or the default config does (the folder's values were kept)."""
    from hf_vit_plus import Seq2SeqTransformerConfig
    from hf_vit_plus.training.tasks import get_task

    Seq2SeqTransformerConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                             decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=5000,
                             label_smoothing=0.0).save_pretrained(tmp_path / "config")  # fmt: skip
    args = family_arguments("seq2seq", output_dir=str(tmp_path / "run"), config_name=str(tmp_path / "config"),
                            label_smoothing_factor=0.2, max_train_samples=200, vocab_size=300)  # fmt: skip
    from hf_vit_plus.training.plan import preview_plan

    family = get_task("seq2seq")
    data = family.load_data(args)
    model, tokenizer = family.build(preview_plan(args, family, data), data)
    assert model.config.label_smoothing == 0.2 and model.config.vocab_size == len(tokenizer)
    assert model.config.d_model == 32
