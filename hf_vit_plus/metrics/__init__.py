"""Metrics shipped inside the package as `evaluate` modules, so they load with no network.

`evaluate` is imported only when a metric is loaded: importing it takes 10+ seconds.
"""

from __future__ import annotations

from pathlib import Path

TRANSLATION_METRIC_PATH = Path(__file__).resolve().parent / "sacrebleu_metric"

__all__ = ["TRANSLATION_METRIC_PATH", "load_translation_metric"]


def load_translation_metric(**kwargs):
    """`evaluate.load` of the bundled BLEU + chrF metric (see `sacrebleu_metric/sacrebleu_metric.py`).

    Keyword arguments go to `evaluate.load` (e.g. `experiment_id`, `num_process`).
    """
    import evaluate

    return evaluate.load(str(TRANSLATION_METRIC_PATH), **kwargs)
