"""Metrics shipped inside the package as `evaluate` modules, so they load with no network.

Each stands in for a Hub metric that scripts load by name and returns every key that metric returns (plus its own):
`sacrebleu_metric` for `sacrebleu` (with chrF), `accuracy_metric` for `accuracy`. `write_metric_stand_ins(folder)`
puts them where `evaluate.load("sacrebleu")` / `evaluate.load("accuracy")` look before the Hub (`folder/NAME/NAME.py`,
relative to the working directory), so transformers' example scripts run offline unchanged from that folder.

`evaluate` is imported only when a metric is loaded: importing it takes 10+ seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TRANSLATION_METRIC_PATH = Path(__file__).resolve().parent / "sacrebleu_metric"
ACCURACY_METRIC_PATH = Path(__file__).resolve().parent / "accuracy_metric"
# Hub metric name -> the module file that stands in for it
STAND_INS = {
    "sacrebleu": TRANSLATION_METRIC_PATH / "sacrebleu_metric.py",
    "accuracy": ACCURACY_METRIC_PATH / "accuracy_metric.py",
}

__all__ = [
    "ACCURACY_METRIC_PATH",
    "STAND_INS",
    "TRANSLATION_METRIC_PATH",
    "load_translation_metric",
    "write_metric_stand_ins",
]


def write_metric_stand_ins(folder: str | Path = ".", names: list[str] | None = None) -> list[Path]:
    """Copy the bundled metric stand-ins where `evaluate.load(NAME)` finds them.

    Each stand-in goes to `folder/NAME/NAME.py`, where `evaluate.load(NAME)` finds a metric when the working directory
    is `folder`.

    Args:
        folder: the folder to write into.
        names: the metrics to copy; default: all of `STAND_INS`.

    Returns:
        The files written.

    Raises:
        ValueError: a name with no stand-in.
    """
    written = []
    for name in names or list(STAND_INS):
        if name not in STAND_INS:
            raise ValueError(f"No stand-in for the metric {name!r}; there are {sorted(STAND_INS)}.")
        target = Path(folder) / name / f"{name}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STAND_INS[name], target)
        written.append(target)
    return written


def load_translation_metric(**kwargs):
    """`evaluate.load` of the bundled BLEU + chrF metric (see `sacrebleu_metric/sacrebleu_metric.py`).

    Args:
        **kwargs: passed to `evaluate.load` (e.g. `experiment_id`, `num_process`).

    Returns:
        The `evaluate.EvaluationModule` that computes BLEU and chrF.
    """
    from ..utils.extras import require

    require("train", "BLEU / chrF", ("sacrebleu",))
    import evaluate

    return evaluate.load(str(TRANSLATION_METRIC_PATH), **kwargs)
