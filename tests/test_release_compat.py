"""Checkpoints saved by version 0.1.0 (commit ded34c8; tests/fixtures/release_0_1, one tiny sparse model per family,
saved with that version's code) load with today's package and give the outputs they gave then."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures" / "release_0_1"
AUTO_HEADS = {
    "vit": "AutoModelForImageClassification",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "sparse-lm": "AutoModelForCausalLM",
}


@pytest.mark.parametrize("family", list(AUTO_HEADS))
def test_a_release_0_1_checkpoint_loads_and_gives_the_same_outputs(family):
    import hf_vit_plus  # noqa: F401  (today's classes, not the checkpoint's copy of the 0.1 code)

    folder = FIXTURES / family
    saved = load_file(str(folder / "expected.safetensors"))
    expected = saved.pop("expected_logits")
    model = getattr(transformers, AUTO_HEADS[family]).from_pretrained(folder).eval()
    assert type(model).__module__.startswith("hf_vit_plus.")
    with torch.no_grad():
        logits = model(**saved).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)


def test_a_release_0_1_grey_processor_still_makes_grey_input():
    from PIL import Image

    processor = transformers.AutoImageProcessor.from_pretrained(FIXTURES / "vit")
    image = Image.new("RGB", (20, 20), (200, 40, 10))
    assert processor(images=image, return_tensors="pt")["pixel_values"].shape == (1, 1, 16, 16)
