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


# What the Hub's `sacrebleu` metric returns (evaluate's docs: its Example 1); transformers' translation scripts read
# `score`. The stand-in returned `bleu` alone: run_translation.py failed with KeyError: 'score'.
SACREBLEU_KEYS = ["score", "counts", "totals", "precisions", "bp", "sys_len", "ref_len"]


def test_a_stand_in_returns_the_keys_and_values_of_the_metric_it_replaces(metric):
    scores = metric.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES])
    assert set(SACREBLEU_KEYS) <= set(scores), sorted(scores)
    bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])  # the Hub metric's computation
    assert scores["score"] == pytest.approx(bleu.score, abs=1e-9) and scores["bleu"] == scores["score"]
    assert (scores["counts"], scores["totals"], scores["bp"]) == (list(bleu.counts), list(bleu.totals), bleu.bp)
    assert (scores["sys_len"], scores["ref_len"]) == (bleu.sys_len, bleu.ref_len)
    lowered = metric.compute(predictions=HYPOTHESES, references=REFERENCES, lowercase=True, use_effective_order=True)
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], lowercase=True, use_effective_order=True)
    assert lowered["score"] == pytest.approx(expected.score, abs=1e-9)


def test_stand_ins_load_by_the_hub_metric_names_from_the_working_directory(tmp_path, monkeypatch):
    """transformers' example scripts call `evaluate.load("sacrebleu")` / `evaluate.load("accuracy")`: a folder
    prepared with `write_metric_stand_ins` serves them offline."""
    import evaluate

    from hf_vit_plus.metrics import write_metric_stand_ins

    written = write_metric_stand_ins(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == ["accuracy/accuracy.py",
                                                                          "sacrebleu/sacrebleu.py"]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    bleu = evaluate.load("sacrebleu").compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES])
    assert bleu["score"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-9)
    accuracy = evaluate.load("accuracy")
    assert accuracy.compute(predictions=[0, 1, 1, 2], references=[0, 1, 0, 2]) == {"accuracy": 0.75}
    assert accuracy.compute(predictions=[0, 1, 1], references=[0, 1, 0], normalize=False) == {"accuracy": 2.0}
    with pytest.raises(ValueError, match="No stand-in for the metric 'rouge'"):
        write_metric_stand_ins(tmp_path, ["rouge"])


def test_uneven_reference_counts_rejected(metric):
    with pytest.raises(ValueError, match="same, non-zero number of references"):
        metric.compute(predictions=HYPOTHESES[:2], references=[[REFERENCES[0]], [REFERENCES[1], REFERENCES[0]]])
