"""The BLEU + chrF `evaluate` module; load it with `hf_vit_plus.metrics.load_translation_metric()`."""
