"""Accuracy as an `evaluate` metric that loads from this folder with no network, standing in for the Hub's `accuracy`
metric (`evaluate.load("accuracy")`, which transformers' image-classification and language-modeling scripts load):

    metric = evaluate.load("path/to/accuracy_metric")
    metric.compute(predictions=[0, 1, 1], references=[0, 1, 0])   # {"accuracy": 0.6666666666666666}

Same key, arguments (`normalize`, `sample_weight`) and value as that metric (scikit-learn's `accuracy_score`).
`evaluate` parses this file's imports: keep one import per line.
"""

import datasets
import evaluate
from sklearn.metrics import accuracy_score

_DESCRIPTION = """The proportion of correct predictions: (TP + TN) / (TP + TN + FP + FN)."""

_CITATION = """@article{scikit-learn,
  title = {Scikit-learn: Machine Learning in {P}ython},
  author = {Pedregosa, F. and Varoquaux, G. and Gramfort, A. and others},
  journal = {Journal of Machine Learning Research},
  volume = {12},
  pages = {2825--2830},
  year = {2011}
}"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted labels (integers).
    references: true labels (integers).
    normalize: False returns the number of correct predictions instead of their proportion.
    sample_weight: weight of each prediction.
Returns:
    accuracy: the proportion (or, with normalize=False, the number) of correct predictions.
"""


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}
            ),
            reference_urls=["https://scikit-learn.org/stable/modules/generated/sklearn.metrics.accuracy_score.html"],
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        score = accuracy_score(references, predictions, normalize=normalize, sample_weight=sample_weight)
        return {"accuracy": float(score)}
