"""Loading a saved model onto the GPU: `from_pretrained(path, device_map="auto")` (accelerate places the whole tiny
model on the first GPU, or on the CPU where there is none) and `dtype=torch.bfloat16`, for every family.

Tolerances: loaded in fp32, the logits equal the saved model's within 1e-5; in bf16, the loss within 3e-2 (relative,
or absolute below 1) of fp32's and the logits' cosine similarity with fp32's >= 0.99.
"""

from __future__ import annotations

import pytest
import torch

from tests.gpu.common import CUDA, DEVICES, FAMILY_CASES, case_ids, tiny_model
from tests.gpu.common import batch as make_batch

pytestmark = pytest.mark.gpu


def _saved(case, tmp_path):
    model = tiny_model(case, "cpu").eval()
    model.save_pretrained(tmp_path / "model")
    return model, tmp_path / "model"


def _outputs(model, case, device: str):
    with torch.no_grad():
        out = model(**make_batch(case, device))
    return out.loss.float().item(), out.logits[0].float().cpu()  # row 0: no padding in any family's batch


@pytest.mark.parametrize("case", FAMILY_CASES, ids=case_ids(FAMILY_CASES))
def test_device_map_auto(case, tmp_path):
    original, path = _saved(case, tmp_path)
    expected = "cuda" if CUDA else "cpu"
    model = type(original).from_pretrained(path, device_map="auto")
    assert {p.device.type for p in model.parameters()} == {expected}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert not model.training
    loss, logits = _outputs(model, case, expected)
    ref_loss, ref_logits = _outputs(original.to(expected), case, expected)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert abs(loss - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", FAMILY_CASES, ids=case_ids(FAMILY_CASES))
def test_bf16_weights_onto_the_device(case, device, tmp_path):
    original, path = _saved(case, tmp_path)
    model = type(original).from_pretrained(path, dtype=torch.bfloat16, device_map={"": device})
    floating = [p for p in model.parameters() if p.is_floating_point()]
    assert {p.device.type for p in floating} == {device} and {p.dtype for p in floating} == {torch.bfloat16}
    loss, logits = _outputs(model, case, device)
    ref_loss, ref_logits = _outputs(original.to(device), case, device)
    assert abs(loss - ref_loss) <= 3e-2 * max(1.0, abs(ref_loss)), (loss, ref_loss)
    finite = ref_logits.isfinite()  # the image model's start token is never a pixel: its logit is -inf
    assert torch.equal(logits.isfinite(), finite)
    cosine = torch.nn.functional.cosine_similarity(logits[finite], ref_logits[finite], dim=0)
    assert cosine >= 0.99, cosine
