"""The accuracy `evaluate` module (a stand-in for the Hub's `accuracy`); see `hf_vit_plus.metrics`."""
