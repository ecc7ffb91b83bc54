"""`--max_train_minutes`: a run that ends on the clock.

A run's length is set in updates (`--max_steps`, `--num_train_epochs`), and so are the values that depend on it: the
learning-rate schedule, and with `--recipe` the regularisers, the warm-up and the EMA's horizon. How long those
updates take is the machine's business: on a shared 2-core VM the same run took 89 to 109 s within minutes, and a
45-minute benchmark row calibrated on short probes trained 51 to 66 minutes (README, ViT section). With a time
budget the run ends at its last update or when the budget is spent, whichever comes first, and the schedule runs at
max(update, the budget's share spent x the updates foreseen): a run that falls behind its updates still warms up and
anneals to the schedule's end inside the budget (budgeted training, Li et al., ICLR 2020, "Budgeted Training:
Rethinking Deep Neural Network Training Under Resource Constraints": a schedule that decays to zero at the budget).
The values decided from the run's length stay those of the updates foreseen.

The clock counts training time only (from the first update, evaluations at the end excluded, every evaluation
during the run included), continues across a resume (the training state records it), and is the main process's on
every process, so that processes stop at the same update and step with the same learning rate.
"""

from __future__ import annotations

import time

import torch


def now() -> float:
    """The clock's time source (seconds; tests replace it)."""
    return time.perf_counter()


class TrainingClock:
    """Seconds of training of a run, across its resumes; with a budget, the share of it spent."""

    def __init__(self, budget_minutes: float | None = None, elapsed: float = 0.0):
        if budget_minutes is not None and not budget_minutes > 0:
            raise ValueError(f"the time budget must be > 0 minutes, got {budget_minutes!r}")
        self.budget = None if budget_minutes is None else 60.0 * float(budget_minutes)
        self.elapsed = float(elapsed)  # seconds at the last tick
        self._origin: float | None = None

    def start(self) -> None:
        """Start (or continue, after a resume set `elapsed`) counting."""
        self._origin = now() - self.elapsed

    def tick(self, accelerator=None) -> float:
        """Read the clock (the main process's, on every process of a run with a budget: a broadcast)."""
        if self._origin is None:
            self.start()
        seconds = now() - self._origin
        if self.budget is not None and accelerator is not None and accelerator.num_processes > 1:
            from accelerate.utils import broadcast

            seconds = broadcast(torch.tensor([seconds], device=accelerator.device, dtype=torch.float32)).item()
        self.elapsed = seconds
        return seconds

    @property
    def share(self) -> float:
        """The budget's share spent at the last tick (0 without a budget)."""
        return 0.0 if self.budget is None else min(1.0, self.elapsed / self.budget)

    @property
    def spent(self) -> bool:
        return self.budget is not None and self.elapsed >= self.budget


def follow_the_clock(scheduler, total_steps: int, clock: TrainingClock):
    """Make `scheduler` (a `LambdaLR`, as every schedule of the training families is) take its value at
    max(update, `clock.share` x `total_steps`): the schedule as it was while the updates keep up with the clock,
    reaching its end when the budget is spent where they do not."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:
        raise ValueError(
            f"--max_train_minutes needs a schedule of the update (a LambdaLR), got {type(scheduler).__name__}."
        )

    def on_the_clock(schedule):
        def at(step: int) -> float:  # a function, so LambdaLR's state_dict does not try to save it
            behind = clock.share * total_steps
            return schedule(step if step >= behind else behind)

        return at

    scheduler.lr_lambdas = [on_the_clock(schedule) for schedule in lambdas]
    return scheduler


__all__ = ["TrainingClock", "follow_the_clock"]
