"""Learning-rate schedules and the optimiser of "Attention Is All You Need" (Vaswani et al., 2017, section 5.3).

The paper's "Noam" schedule gives an absolute learning rate:

    lr(step) = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5),   step = 1, 2, 3, ...

It grows linearly for `warmup_steps` updates, peaks at `d_model^-0.5 * warmup_steps^-0.5` on update number
`warmup_steps`, then decays with the inverse square root of the step.

`torch.optim.lr_scheduler.LambdaLR` multiplies the optimiser's base learning rate by the lambda, so build the
optimiser with `lr=1.0` (the default of `paper_adam`) to get the paper's absolute values; any other base rate
scales the whole curve. The schedule works from a plain loop (`optimizer.step(); scheduler.step()`) and from
`Seq2SeqTrainer(..., optimizers=(optimizer, scheduler))`, which steps it once per update the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_cosine_schedule_with_warmup

__all__ = ["NoamLambda", "get_noam_schedule", "get_warmup_cosine_schedule", "noam_lambda", "noam_rate", "paper_adam"]


def noam_rate(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """The paper's learning rate at update `step` (counted from 1)."""
    if step < 1:
        raise ValueError(f"step is counted from 1, got step={step}")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


class NoamLambda:
    """A picklable `lr_lambda` for `LambdaLR`: maps the scheduler's 0-based counter to `noam_rate(counter + 1)`.

    `LambdaLR` evaluates its lambda at 0 when it is built and after each `scheduler.step()` at 1, 2, ...; so the
    first optimiser update runs with the rate of step 1, as in the paper. A class rather than a closure so that
    `scheduler.state_dict()` (saved by Trainer checkpoints) keeps its settings.
    """

    def __init__(self, d_model: int, warmup_steps: int, factor: float = 1.0):
        if not isinstance(d_model, int) or isinstance(d_model, bool) or d_model <= 0:
            raise ValueError(f"d_model must be a positive int, got {d_model!r}")
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps <= 0:
            raise ValueError(f"warmup_steps must be a positive int, got {warmup_steps!r}")
        if not math.isfinite(factor) or factor <= 0:
            raise ValueError(f"factor must be a positive finite number, got {factor!r}")
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.factor = float(factor)

    def __call__(self, counter: int) -> float:
        return noam_rate(counter + 1, self.d_model, self.warmup_steps, self.factor)

    def __repr__(self) -> str:
        return f"NoamLambda(d_model={self.d_model}, warmup_steps={self.warmup_steps}, factor={self.factor})"


def noam_lambda(d_model: int, warmup_steps: int, factor: float = 1.0) -> NoamLambda:
    """The `lr_lambda` of the Noam schedule; see `NoamLambda`."""
    return NoamLambda(d_model, warmup_steps, factor)


def get_noam_schedule(
    optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int = 4000, factor: float = 1.0
) -> LambdaLR:
    """`LambdaLR` with the Noam schedule. With the optimiser's `lr=1.0` the rates are the paper's absolute values."""
    return LambdaLR(optimizer, noam_lambda(d_model, warmup_steps, factor))


def paper_adam(
    params: Iterable[torch.Tensor] | Iterable[dict],
    lr: float = 1.0,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
) -> torch.optim.Adam:
    """Adam with the paper's beta1 0.9, beta2 0.98, eps 1e-9. `lr=1.0` so that `get_noam_schedule` sets the rate."""
    return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def get_warmup_cosine_schedule(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, num_cycles: float = 0.5
) -> LambdaLR:
    """Linear warmup then cosine decay to 0 (transformers' `get_cosine_schedule_with_warmup`), with checked input."""
    if warmup_steps < 0 or total_steps <= 0 or warmup_steps > total_steps:
        raise ValueError(
            f"need 0 <= warmup_steps <= total_steps and total_steps > 0, got warmup_steps={warmup_steps}, "
            f"total_steps={total_steps}"
        )
    return get_cosine_schedule_with_warmup(optimizer, warmup_steps, total_steps, num_cycles=num_cycles)
