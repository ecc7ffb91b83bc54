"""The two checks of every run (`hf_vit_plus.training.learning`): a final evaluation not clearly better than the task's
trivial baseline ends the run with one warning line and a card that says so (exit status 0), and a diverging loss
stops the run at the update where it diverged, saving nothing after it (exit status 1)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from hf_vit_plus.training.args import family_arguments
from hf_vit_plus.training.checkpoints import checkpoint_dirs
from hf_vit_plus.training.learning import (
    DivergenceGuard,
    LearningMetric,
    check_learning,
    majority_accuracy,
    sequence_keys,
    unigram_bits,
)
from hf_vit_plus.training.loop import train
from hf_vit_plus.training.tasks import get_task
from tests.utils import REPO_ROOT, TINY_VIT_OVERRIDES

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py

ACCURACY = LearningMetric("accuracy", "majority_class_accuracy", True, "the majority class")
BITS = LearningMetric("bits_per_token", "unigram_bits_per_token", False, "a unigram model")


class _OneProcess:
    """What `DivergenceGuard.diverged` asks of an Accelerator on one process."""

    @staticmethod
    def gather(tensor):
        return tensor


# ------------------------------------------------------------------------------------------------- the verdicts
def test_an_accuracy_must_close_part_of_the_gap_above_the_baseline():
    baselines = {"majority_class_accuracy": 0.2}
    assert check_learning(ACCURACY, {"accuracy": 0.9}, baselines).learned
    verdict = check_learning(ACCURACY, {"accuracy": 0.21}, baselines)  # needs 0.2 + 5% of 0.8 = 0.24
    assert not verdict.learned
    assert "accuracy 0.21" in verdict.message and "the majority class (0.2" in verdict.message
    assert "--learning_rate" in verdict.message and "\n" not in verdict.message
    assert verdict.card_text.startswith("On the evaluation split its eval accuracy 0.21 is not clearly above")
    assert not check_learning(ACCURACY, {"accuracy": math.nan}, baselines).learned


def test_bits_must_be_clearly_below_the_baseline():
    baselines = {"unigram_bits_per_token": 4.0}
    assert check_learning(BITS, {"bits_per_token": 2.5}, baselines).learned
    assert not check_learning(BITS, {"bits_per_token": 3.9}, baselines).learned  # needs <= 3.8
    assert "below a unigram model" in check_learning(BITS, {"bits_per_token": 4.5}, baselines).message


def test_an_output_that_ignores_the_input_has_not_learned_whatever_its_score():
    rule = LearningMetric("exact_match", "most_common_target_exact_match", True, "the commonest target")
    metrics = {"exact_match": 0.3, "output_variety": 0.002}
    verdict = check_learning(rule, metrics, {"most_common_target_exact_match": 0.0})
    assert not verdict.learned and "barely depends on the input" in verdict.message


def test_no_rule_or_no_baseline_gives_no_verdict():
    assert check_learning(None, {"accuracy": 0.1}, {}) is None
    assert check_learning(ACCURACY, {"accuracy": 0.1}, {}) is None  # a user's data set without labels to count


def test_the_baselines_are_the_trivial_models():
    assert majority_accuracy([1, 1, 2, 3], [1, 2, 1, 1]) == 0.75
    ids = [torch.tensor([[0, 0, 1, 1]])]
    # counts 2+1, 2+1 over 2 tokens (add-one): p = 1/2 each; the first token of each row is not scored
    assert unigram_bits(ids, [torch.tensor([[1, 0, 1]])], 2) == pytest.approx(1.0)
    skewed = unigram_bits([torch.tensor([[0] * 99 + [1]])], [torch.tensor([[0] * 50])], 2)
    assert skewed < 0.05


def test_sequence_keys_ignore_padding_and_tell_sequences_apart():
    a = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 8, 0, 0]])
    b = torch.tensor([[5, 6, 7]])
    keys = sequence_keys(a, pad=0)
    assert keys[0] != keys[1] and keys[0] == sequence_keys(b, pad=0)[0]


# --------------------------------------------------------------------------------------------------- the guard
def test_a_non_finite_loss_is_named_by_its_update():
    guard = DivergenceGuard(torch.device("cpu"))
    for step, loss in enumerate([2.0, 1.5, math.nan, 1.0], start=1):
        guard.note(torch.tensor(loss), step)
    message = guard.diverged(_OneProcess, 4, mean_loss=math.nan)
    assert message.startswith("Training diverged at update 3: the training loss became non-finite")
    assert "--learning_rate" in message and "--warmup_ratio" in message


def test_a_loss_that_grows_past_the_factor_stops_but_noise_does_not():
    guard = DivergenceGuard(torch.device("cpu"))
    assert guard.diverged(_OneProcess, 10, 2.3) is None
    assert guard.diverged(_OneProcess, 20, 0.05) is None
    assert guard.diverged(_OneProcess, 30, 0.4) is None  # 8x its best, but 0.35 nats: noise of a fitted model
    message = guard.diverged(_OneProcess, 40, 3.2)
    assert message.startswith("Training diverged by update 40: the mean training loss 3.2 grew past 3x its best")
    assert DivergenceGuard(torch.device("cpu"), factor=0).diverged(_OneProcess, 1, math.nan) is None  # switched off


# --------------------------------------------------------------------------------------------------- real runs
def _tiny_vit(tmp_path, name, **values):
    defaults = dict(
        config_overrides=TINY_VIT_OVERRIDES,
        report_to="none",
        max_train_samples=96,
        max_eval_samples=64,
        per_device_train_batch_size=16,
        logging_steps=1,
        num_train_epochs=1.0,
    )
    return family_arguments("vit", output_dir=str(tmp_path / name), **{**defaults, **values})


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hf_vit_plus.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )


TINY_CLI = [
    "--config_overrides", TINY_VIT_OVERRIDES, "--max_train_samples", "96", "--max_eval_samples", "64",
    "--per_device_train_batch_size", "16", "--report_to", "none", "--num_train_epochs", "1",
]  # fmt: skip


def test_a_run_that_learns_nothing_says_so_in_one_line_and_in_its_card(tmp_path):
    run = _cli("train", "vit", "--output_dir", str(tmp_path / "zero"), "--learning_rate", "0", *TINY_CLI)
    assert run.returncode == 0, run.stderr[-2000:]
    warnings = [line for line in run.stderr.splitlines() if "did not learn" in line]
    assert len(warnings) == 1, run.stderr[-2000:]
    assert "eval accuracy" in warnings[0] and "majority class" in warnings[0] and "--learning_rate" in warnings[0]
    card = (tmp_path / "zero" / "README.md").read_text()
    assert "This model did not learn its task." in card
    results = json.loads((tmp_path / "zero" / "eval_results.json").read_text())
    assert 0 < results["eval_baseline_majority_class_accuracy"] < 0.5


def test_a_run_that_learns_has_no_warning(tmp_path):
    result = train(_tiny_vit(tmp_path, "learns", max_train_samples=None, max_eval_samples=None,
                             per_device_train_batch_size=32, num_train_epochs=4.0, learning_rate=3e-3))  # fmt: skip
    assert result.learning is not None and result.learning.learned, result.eval_metrics
    assert "did not learn" not in (tmp_path / "learns" / "README.md").read_text()


def test_a_diverging_run_stops_at_its_update_and_keeps_the_last_checkpoint(tmp_path):
    """The loss becomes NaN at update 5: the run stops there, the checkpoint of update 4 is as it was, nothing of
    update 5 or later is written."""
    family = get_task("vit")
    original = family.training_loss
    calls = []

    def poisoned(model, batch, extras):
        calls.append(1)
        loss = original(model, batch, extras)
        return loss * math.nan if len(calls) >= 5 else loss

    family.training_loss = poisoned
    try:
        result = train(_tiny_vit(tmp_path, "nan", save_steps="2", num_train_epochs=2.0), family=family)
    finally:
        del family.training_loss
    assert result.stop_reason == "diverged" and result.global_step == 5
    saved = checkpoint_dirs(tmp_path / "nan")
    assert [path.name for path in saved] == ["checkpoint-2", "checkpoint-4"]
    assert not (tmp_path / "nan" / "model.safetensors").exists()


def test_the_command_line_stops_a_diverging_run_with_one_line_and_status_1(tmp_path):
    run = _cli("train", "vit", "--output_dir", str(tmp_path / "boom"), "--learning_rate", "1e4",
               "--max_grad_norm", "0", "--warmup_ratio", "0", "--logging_steps", "1", *TINY_CLI)  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if "Training diverged" in line]
    assert len(lines) == 1 and "update" in lines[0] and "--learning_rate" in lines[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "boom" / "model.safetensors").exists()
