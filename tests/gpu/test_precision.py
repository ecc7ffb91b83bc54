"""Each family trains in fp32, bf16 autocast and fp16 with a gradient scaler, on CUDA and on the CPU: one forward and
backward of a tiny model (a sparse pattern where the family has one: on CUDA its attention is flex_attention, with
its compiled backward), compared with the same model's fp32 step.

Tolerances (stated here, asserted below):
- fp32 on CUDA against fp32 on the CPU: loss within 1e-4 relative, gradients within 1e-3 relative (norm of the
  difference over the norm): the same arithmetic, other kernels and summation orders;
- bf16 autocast (8 bits of mantissa): loss within 3e-2 relative (or absolute, for a loss below 1), gradients' cosine
  similarity with fp32's >= 0.99 and relative error <= 0.15;
- fp16 autocast with `torch.amp.GradScaler` (11 bits): loss within 1e-2, gradients' cosine >= 0.995 and relative
  error <= 0.05 after unscaling; no overflow at the initial scale (the scale stays), and the step changes the
  weights and leaves them finite.
"""

from __future__ import annotations

import pytest
import torch

from tests.gpu.common import DEVICES, FAMILY_CASES, case_ids, cosine, gradients, relative_error, tiny_model
from tests.gpu.common import batch as make_batch

pytestmark = pytest.mark.gpu

PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}
LOSS_RTOL = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}
GRAD_COSINE = {"bf16": 0.99, "fp16": 0.995}
GRAD_RELATIVE = {"fp32": 1e-3, "bf16": 0.15, "fp16": 0.05}
INITIAL_SCALE = 2.0**10


def fp32_step(case, device: str):
    model = tiny_model(case, device)
    loss = model(**make_batch(case, device)).loss
    loss.backward()
    return loss.item(), gradients(model)


def assert_loss_close(loss: float, reference: float, precision: str) -> None:
    tolerance = LOSS_RTOL[precision] * max(1.0, abs(reference))
    assert abs(loss - reference) <= tolerance, f"{precision} loss {loss} against fp32's {reference}"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", FAMILY_CASES, ids=case_ids(FAMILY_CASES))
def test_one_training_step_in_each_precision_matches_fp32(case, device, precision):
    reference_loss, reference_grads = fp32_step(case, device)
    assert torch.isfinite(torch.tensor(reference_loss))
    if precision == "fp32":
        if device == "cpu":  # the reference itself: repeatable
            loss, grads = fp32_step(case, "cpu")
            assert loss == reference_loss and relative_error(grads, reference_grads) == 0.0
            return
        cpu_loss, cpu_grads = fp32_step(case, "cpu")
        assert_loss_close(reference_loss, cpu_loss, "fp32")
        assert relative_error(reference_grads, cpu_grads) <= GRAD_RELATIVE["fp32"]
        return

    model = tiny_model(case, device)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=INITIAL_SCALE, enabled=precision == "fp16")
    with torch.autocast(device, dtype=PRECISIONS[precision]):
        loss = model(**make_batch(case, device)).loss
    assert loss.dtype == torch.float32  # the loss is computed in fp32 under autocast
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grads = gradients(model)
    assert_loss_close(loss.item(), reference_loss, precision)
    assert cosine(grads, reference_grads) >= GRAD_COSINE[precision]
    assert relative_error(grads, reference_grads) <= GRAD_RELATIVE[precision]
    scaler.step(optimizer)
    scaler.update()
    if precision == "fp16":
        assert scaler.get_scale() == INITIAL_SCALE, "fp16 gradients overflowed: the scaler skipped the step"
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert changed, "the optimizer step changed no weight"
    assert all(torch.isfinite(p).all() for p in model.parameters())
