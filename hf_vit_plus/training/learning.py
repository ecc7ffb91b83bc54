"""Did the run learn, and is it still learning? Two checks of every training run.

The learning check (`check_learning`), at the end of a run: the final evaluation against the task's trivial
baseline measured on the same split, the number a model reaches without learning anything from its input (the
majority class's accuracy, a unigram model's bits, the exact match of always answering the commonest target). A
model not clearly better than it did not learn: the run ends with one warning line naming the metric, the baseline
and what to try, and the model card says so. The exit status stays 0: the warning is the signal.

"Clearly better" means closing at least `LEARNED_SHARE` of the gap from the baseline to a perfect score (accuracies
and exact matches, perfect at 1), or at least `LEARNED_SHARE` below the baseline (bits and losses). An
encoder-decoder is also asked whether its output depends on its input: a model answering (nearly) the same sequence
to every input has not learned, whatever its exact match (`MIN_OUTPUT_VARIETY`).

The divergence guard (`DivergenceGuard`), during a run: a training loss that becomes non-finite, or whose logged mean
grows past `DIVERGENCE_FACTOR` times its best (and at least `DIVERGENCE_MARGIN` nats above it), stops the run before
anything more is saved, with one line naming the update.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

LEARNED_SHARE = 0.05  # of the gap to a perfect score (higher-is-better), or of the baseline (lower-is-better)
MIN_OUTPUT_VARIETY = 0.5  # distinct outputs / distinct references below this: the output ignores the input
DIVERGENCE_FACTOR = 3.0  # a logged mean training loss above this many times its best ...
DIVERGENCE_MARGIN = 1.0  # ... and this many nats above it stops the run (as does a non-finite loss)
TRY = (
    "check the learning rate (--learning_rate: lower it if the loss rose or stalled), the warm-up (--warmup_ratio) "
    "and the length of the run (more epochs)"
)


@dataclass(frozen=True)
class LearningMetric:
    """How a family's learning is judged: its evaluation `metric`, the `baseline` (a key of the run's baselines or of
    the metrics themselves) and which direction is better."""

    metric: str
    baseline: str
    higher_is_better: bool
    baseline_text: str  # what the baseline is, in the warning ("the majority class")


@dataclass(frozen=True)
class LearningCheck:
    """The verdict of `check_learning`: `learned`, and when not, the one line that says why."""

    learned: bool
    metric: str
    value: float
    baseline: float
    message: str | None = None  # the warning line when not learned
    detail: str | None = None  # what the line says of the metric and the baseline

    @property
    def card_text(self) -> str | None:
        """The model card's sentence (None when it learned), after "This model did not learn its task."."""
        if self.learned:
            return None
        advice = f"Do not use it as a trained model; to train it again, {TRY}."
        return f"On the evaluation split its {self.detail}. {advice}"


def check_learning(rule: LearningMetric | None, metrics: dict, baselines: dict) -> LearningCheck | None:
    """Compare the final evaluation `metrics` with the `rule`'s baseline (in `baselines` or `metrics`); None when the
    family has no rule or the run measured neither number (a user's data with no baseline)."""
    if rule is None:
        return None
    value = metrics.get(rule.metric)
    baseline = baselines.get(rule.baseline, metrics.get(rule.baseline))
    if value is None or baseline is None:
        return None
    value, baseline = float(value), float(baseline)
    if rule.higher_is_better:
        needed = baseline + LEARNED_SHARE * (1.0 - baseline)
        learned = math.isfinite(value) and value >= needed
    else:
        needed = baseline * (1.0 - LEARNED_SHARE)
        learned = math.isfinite(value) and value <= needed
    reason = ""
    variety = metrics.get("output_variety")
    if variety is not None and variety < MIN_OUTPUT_VARIETY:
        learned = False
        reason = f"; its output barely depends on the input ({variety:.0%} as many distinct outputs as references)"
    if learned:
        return LearningCheck(True, rule.metric, value, baseline)
    relation = "above" if rule.higher_is_better else "below"
    detail = (
        f"eval {rule.metric} {value:.4g} is not clearly {relation} {rule.baseline_text} ({baseline:.4g}; learning "
        f"needs {needed:.4g}){reason}"
    )
    message = f"The model did not learn: {detail}: {TRY}."
    return LearningCheck(False, rule.metric, value, baseline, message, detail)


# ------------------------------------------------------------------------------------------------------- baselines
def majority_accuracy(train_labels: Sequence, eval_labels: Sequence) -> float:
    """The accuracy on `eval_labels` of always answering the commonest of `train_labels`."""
    if not len(eval_labels):
        return 0.0
    commonest = Counter(train_labels).most_common(1)[0][0]
    return sum(label == commonest for label in eval_labels) / len(eval_labels)


def unigram_bits(train_ids: Iterable[Sequence[int]], eval_ids: Iterable[Sequence[int]], vocab_size: int) -> float:
    """Bits per token on `eval_ids` of a unigram model of `train_ids` (add-one smoothing over `vocab_size`): what a
    language model reaches by learning the token frequencies alone. The first token of each sequence is not scored,
    as the language model's evaluation does not score it."""
    counts = torch.ones(vocab_size, dtype=torch.float64)
    for ids in train_ids:
        counts += torch.bincount(torch.as_tensor(ids, dtype=torch.long).flatten(), minlength=vocab_size)[:vocab_size]
    log_p = torch.log2(counts / counts.sum())
    total, scored = 0.0, 0
    for ids in eval_ids:
        ids = torch.as_tensor(ids, dtype=torch.long)
        ids = ids[..., 1:].flatten()
        total -= log_p[ids].sum().item()
        scored += ids.numel()
    return total / max(1, scored)


def sequence_keys(sequences: torch.Tensor, pad: int | None = None) -> torch.Tensor:
    """One int64 key per row of `sequences` (B, T), `pad` tokens left out: equal sequences get equal keys whatever
    their padding, different ones (almost surely) different keys; gathered across processes to count distinct
    outputs."""
    weights = _key_weights()
    tokens = sequences.long().cpu()
    width = tokens.shape[1]
    if width > _KEY_WIDTH:
        raise ValueError(f"sequences of {width} tokens; at most {_KEY_WIDTH} are keyed.")
    kept = tokens != pad if pad is not None else torch.ones_like(tokens, dtype=torch.bool)
    return ((tokens + 1) * weights[:width] * kept).sum(-1)


_KEY_WIDTH = 8192


@functools.cache
def _key_weights() -> torch.Tensor:
    return torch.randint(1, 2**61, (_KEY_WIDTH,), generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------------------------------------------ divergence
class DivergenceGuard:
    """Watches the training loss. `note(loss, step)` each micro-batch (no synchronisation: the first update with a
    non-finite loss is kept on the device); `diverged(...)` at the updates where the loop reads the loss anyway (log,
    evaluation, save, last), which returns the line that stops the run, or None."""

    def __init__(self, device: torch.device, factor: float = DIVERGENCE_FACTOR, check_finite: bool = True):
        self.first_bad = torch.zeros((), dtype=torch.long, device=device)
        self.best = math.inf
        self.factor = factor
        self.check_finite = check_finite  # False under fp16 loss scaling: the scaler skips non-finite updates

    def note(self, loss: torch.Tensor, step: int) -> None:
        if self.check_finite and self.factor:
            bad = (self.first_bad == 0) & ~torch.isfinite(loss.detach()).all()
            self.first_bad = torch.where(bad, torch.full_like(self.first_bad, step), self.first_bad)

    def diverged(self, accelerator, step: int, mean_loss: float | None = None) -> str | None:
        """The stop line when the loss diverged (agreed by all processes), else None. `mean_loss`: the logged mean
        training loss of the updates since the last log line, when this update logs one."""
        if not self.factor:
            return None
        first_bad = 0
        if self.check_finite:  # the earliest update any process saw go non-finite
            seen = [int(update) for update in accelerator.gather(self.first_bad.reshape(1)).tolist() if update]
            first_bad = min(seen, default=0)
        if first_bad:
            return f"Training diverged at update {first_bad}: the training loss became non-finite; {self._advice()}"
        # a non-finite mean comes from a non-finite loss, named above (or the fp16 scaler's to skip)
        if mean_loss is None or not math.isfinite(mean_loss):
            return None
        limit = max(self.factor * self.best, self.best + DIVERGENCE_MARGIN)
        if math.isfinite(self.best) and mean_loss > limit:
            return (
                f"Training diverged by update {step}: the mean training loss {mean_loss:.4g} grew past "
                f"{self.factor:g}x its best ({self.best:.4g}); {self._advice()}"
            )
        self.best = min(self.best, mean_loss)
        return None

    @staticmethod
    def _advice() -> str:
        return (
            "the run stopped, saving nothing more: try a lower --learning_rate or a longer warm-up (--warmup_ratio)."
        )


__all__ = [
    "DIVERGENCE_FACTOR",
    "DIVERGENCE_MARGIN",
    "LEARNED_SHARE",
    "MIN_OUTPUT_VARIETY",
    "DivergenceGuard",
    "LearningCheck",
    "LearningMetric",
    "check_learning",
    "majority_accuracy",
    "sequence_keys",
    "unigram_bits",
]
