"""The BLEU + chrF `evaluate` module shipped in the package loads from its path with no network and agrees with
sacrebleu called directly."""

from __future__ import annotations

import ast

import pytest
import sacrebleu

from hf_vit_plus.metrics import TRANSLATION_METRIC_PATH, load_translation_metric

HYPOTHESES = [
    "In the beginning God made the heavens and the earth.",
    "And the earth was without form and empty.",
    "Let there be light, and there was light.",
]
REFERENCES = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "And God said, Let there be light: and there was light.",
]


@pytest.fixture(scope="module")
def metric():
    return load_translation_metric()


def test_module_file_is_shipped_with_one_import_per_line():
    script = TRANSLATION_METRIC_PATH / "sacrebleu_metric.py"
    assert script.is_file()
    tree = ast.parse(script.read_text())
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert imports and all(isinstance(node, ast.Import) and len(node.names) == 1 for node in imports)


def test_identical_text_scores_100(metric):
    scores = metric.compute(predictions=REFERENCES, references=[[r] for r in REFERENCES])
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)
    assert scores["bleu_signature"].startswith("nrefs:1|")


def test_same_numbers_as_sacrebleu(metric):
    scores = metric.compute(predictions=HYPOTHESES, references=REFERENCES)  # plain strings: one reference each
    bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    chrf = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES])
    assert 0 < scores["bleu"] < 100 and 0 < scores["chrf"] < 100
    assert scores["bleu"] == pytest.approx(bleu.score, abs=1e-9)
    assert scores["chrf"] == pytest.approx(chrf.score, abs=1e-9)
    assert scores["precisions"] == pytest.approx(bleu.precisions)
    # Two references per sentence, streamed in batches.
    second = ["In the beginning God created heaven and earth."] + REFERENCES[1:]
    metric.add_batch(predictions=HYPOTHESES[:2], references=[[a, b] for a, b in zip(REFERENCES[:2], second[:2])])
    metric.add_batch(predictions=HYPOTHESES[2:], references=[[REFERENCES[2], second[2]]])
    multi = metric.compute()
    assert multi["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, second]).score, abs=1e-9)


def test_uneven_reference_counts_rejected(metric):
    with pytest.raises(ValueError, match="same, non-zero number of references"):
        metric.compute(predictions=HYPOTHESES[:2], references=[[REFERENCES[0]], [REFERENCES[1], REFERENCES[0]]])
