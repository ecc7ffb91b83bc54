"""BLEU and chrF with sacrebleu, as an `evaluate` metric that loads from this folder with no network:

    metric = evaluate.load("path/to/sacrebleu_metric")      # or hf_vit_plus.metrics.load_translation_metric()
    metric.compute(predictions=["the cat sat"], references=[["the cat sat"]])
    # {"score": 100.0, "counts": [...], "totals": [...], "precisions": [...], "bp": 1.0, "sys_len": 3, "ref_len": 3,
    #  "bleu": 100.0, "chrf": 100.0, "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|...", ...}

It stands in for the Hub's `sacrebleu` metric (`evaluate.load("sacrebleu")`, which transformers' translation
scripts read as `result["score"]`): it returns every key that metric returns, with the same values and arguments
(`smooth_method`, `smooth_value`, `force`, `lowercase`, `tokenize`, `use_effective_order`), plus its own (`bleu`,
the same number as `score`; chrF; the signatures). Scores are corpus-level, on sacrebleu's 0-100 scale; the
signatures say how they were computed (report them with the numbers). `evaluate` parses this file's imports: keep
one import per line.
"""

import datasets
import evaluate
import sacrebleu

_DESCRIPTION = """Corpus BLEU (Papineni et al., 2002) and chrF (Popovic, 2015) computed by sacrebleu (Post, 2018)
on detokenised text, with sacrebleu's standard tokenisation, so scores are comparable across papers."""

_CITATION = """@inproceedings{post-2018-call,
  title = "A Call for Clarity in Reporting {BLEU} Scores",
  author = "Post, Matt",
  booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
  year = "2018",
  pages = "186--191",
}"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of hypothesis strings.
    references: list with, for each prediction, one reference string or a list of reference strings (the same
        number of references for every prediction).
    smooth_method, smooth_value, force, use_effective_order: as sacrebleu's `corpus_bleu` (defaults "exp", None,
        False, False).
    tokenize: sacrebleu tokeniser for BLEU ("13a" default, "intl", "char", "zh", "none", ...).
    lowercase: compute BLEU on lowercased text.
    chrf_word_order: 0 for chrF (default), 2 for chrF++.
Returns:
    the `sacrebleu` metric's keys: score (corpus BLEU, 0-100), counts and totals (matching and total n-grams, 1 to
    4), precisions (1- to 4-gram), bp (brevity penalty), sys_len, ref_len; and this module's own: bleu (= score),
    chrf (0-100), bleu_signature, chrf_signature, brevity_penalty (= bp).
"""


class SacreBleuMetric(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Sequence(datasets.Value("string")),
                    }
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            reference_urls=["https://github.com/mjpost/sacrebleu"],
        )

    def _compute(
        self,
        predictions,
        references,
        smooth_method="exp",
        smooth_value=None,
        force=False,
        lowercase=False,
        tokenize=None,
        use_effective_order=False,
        chrf_word_order=0,
    ):
        if len(predictions) == 0:
            raise ValueError("predictions is empty: BLEU needs at least one sentence")
        references = [[ref] if isinstance(ref, str) else list(ref) for ref in references]
        counts = {len(refs) for refs in references}
        if len(counts) != 1 or 0 in counts:
            raise ValueError(f"every prediction needs the same, non-zero number of references, got counts {counts}")
        # sacrebleu wants one stream per reference position: streams[k][i] is the k-th reference of sentence i.
        streams = [list(stream) for stream in zip(*references)]
        bleu_metric = sacrebleu.metrics.BLEU(
            tokenize=tokenize or "13a",
            lowercase=lowercase,
            force=force,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            effective_order=use_effective_order,
        )
        chrf_metric = sacrebleu.metrics.CHRF(word_order=chrf_word_order)
        bleu = bleu_metric.corpus_score(predictions, streams)
        chrf = chrf_metric.corpus_score(predictions, streams)
        return {
            # the keys of the `sacrebleu` metric this module stands in for
            "score": bleu.score,
            "counts": list(bleu.counts),
            "totals": list(bleu.totals),
            "precisions": list(bleu.precisions),
            "bp": bleu.bp,
            "sys_len": bleu.sys_len,
            "ref_len": bleu.ref_len,
            # its own
            "bleu": bleu.score,
            "chrf": chrf.score,
            "bleu_signature": str(bleu_metric.get_signature()),
            "chrf_signature": str(chrf_metric.get_signature()),
            "brevity_penalty": bleu.bp,
        }
