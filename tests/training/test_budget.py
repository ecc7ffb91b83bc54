"""`--max_train_minutes` (`hf_vit_plus.training.budget`): a run that ends on the clock, its schedule following the
clock where the updates fall behind it, and the clock carried across a resume. The clock is replaced by one that
advances 10 s each time it is read (once when the run starts, once after each update), so that the tests do not
depend on the machine's speed."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hf_vit_plus.errors import UsageError
from hf_vit_plus.training import budget
from hf_vit_plus.training.budget import TrainingClock, follow_the_clock
from hf_vit_plus.training.loop import train
from tests.training.test_training_loop import tiny_vit


@pytest.fixture
def ten_seconds_a_read(monkeypatch):
    reads = iter(range(0, 10**6, 10))
    monkeypatch.setattr(budget, "now", lambda: float(next(reads)))


def _rates(result) -> list[float]:
    return [entry["learning_rate"] for entry in result.log_history if "loss" in entry]


COMMON = dict(num_train_epochs=3.0, save_steps="none")  # 96 images in batches of 16: 6 updates an epoch, 18 in all


def test_a_schedule_on_the_clock_takes_the_later_of_the_update_and_the_time():
    clock = TrainingClock(budget_minutes=1.0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = follow_the_clock(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / 100), 100, clock)
    schedule = scheduler.lr_lambdas[0]
    assert schedule(10) == pytest.approx(0.9) and clock.share == 0.0  # no time spent: the update's value
    clock.elapsed = 30.0  # half the budget: the schedule's value at update 50 until the updates pass it
    assert schedule(10) == pytest.approx(0.5) and schedule(70) == pytest.approx(0.3)
    clock.elapsed = 90.0
    assert clock.spent and clock.share == 1.0 and schedule(10) == pytest.approx(0.0)
    assert scheduler.state_dict()["lr_lambdas"] == [None]  # nothing of the clock in the saved schedule
    with pytest.raises(ValueError, match="the time budget must be > 0 minutes, got 0"):
        TrainingClock(budget_minutes=0)
    with pytest.raises(ValueError, match="needs a schedule of the update \\(a LambdaLR\\), got StepLR"):
        follow_the_clock(torch.optim.lr_scheduler.StepLR(optimizer, 1), 100, clock)


def test_a_run_ends_when_its_budget_is_spent_and_anneals_on_the_clock(tmp_path, ten_seconds_a_read):
    """One minute at 10 s an update: 6 of the 18 updates foreseen, each update's learning rate the schedule's value
    at max(update, 18 x the share of the minute spent before it), then the final evaluation and model as a run that
    reached its last update."""
    reference = train(tiny_vit(tmp_path, "reference", **COMMON))  # the same schedule, step by step
    assert reference.global_step == 18
    budgeted = train(tiny_vit(tmp_path, "budgeted", max_train_minutes=1.0, write_card=True, **COMMON))
    assert budgeted.global_step == 6 and budgeted.total_steps == 18 and budgeted.stop_reason == "finished"
    by_update = dict(zip(range(1, 19), _rates(reference)))
    assert _rates(budgeted) == [by_update[max(k, 3 * (k - 1))] for k in range(1, 7)]  # updates 1, 3, 6, 9, 12, 15
    assert budgeted.log_history[-1]["step"] == 6 and "eval_accuracy" in budgeted.log_history[-1]
    assert (tmp_path / "budgeted" / "model.safetensors").is_file()
    card = (tmp_path / "budgeted" / "README.md").read_text()  # the updates made beside those foreseen
    assert "| updates_made | 6 |" in card and "| epochs_made | 1 |" in card and "| max_train_minutes | 1 |" in card


def test_a_budgeted_run_resumes_with_its_clock(tmp_path, monkeypatch):
    """Stopped after 2 updates (20 s), resumed: the clock goes on from 20 s, so the run ends at update 6 with the
    learning rates and weights of the uninterrupted budgeted run."""
    args = {**COMMON, "max_train_minutes": 1.0, "save_steps": "100"}

    def fresh_clock():
        reads = iter(range(0, 10**6, 10))
        monkeypatch.setattr(budget, "now", lambda: float(next(reads)))

    fresh_clock()
    whole = train(tiny_vit(tmp_path, "whole", **args))
    fresh_clock()
    stopped = train(tiny_vit(tmp_path, "split", stop_after_steps=2, **args))
    state = json.loads((stopped.last_checkpoint / "training_state.json").read_text())
    assert stopped.global_step == 2 and state["train_seconds"] == 20.0
    fresh_clock()
    resumed = train(tiny_vit(tmp_path, "split", resume_from_checkpoint="latest", **args))
    assert whole.global_step == resumed.global_step == 6
    assert _rates(whole) == _rates(resumed)
    first, second = (load_file(tmp_path / name / "model.safetensors") for name in ("whole", "split"))
    assert all(torch.equal(first[key], second[key]) for key in first)


def test_the_budget_must_be_positive(tmp_path):
    with pytest.raises(UsageError, match="--max_train_minutes must be > 0, got -5"):
        train(tiny_vit(tmp_path, max_train_minutes=-5))
