"""The C++ kernel of `hf_vit_plus.models.fast_kernels` that beam search calls outside the products: the top-k of the
candidates (`topk_rows`), against `torch.topk`, with the AVX-512 comparisons and with the plain loop."""

from __future__ import annotations

import pytest
import torch

from hf_vit_plus.models import fast_kernels

VECTORIZED = [pytest.param(True, id="avx512-where-the-cpu-has-it"), pytest.param(False, id="plain-loop")]


@pytest.fixture(scope="module")
def kernels():
    if not fast_kernels.cpp_fbgemm_ops():
        pytest.skip("the C++ kernels could not be built here (a C++ compiler and ninja are needed)")


def _assert_topk(x: torch.Tensor, k: int, vectorized: bool) -> None:
    """The values of torch.topk, bit for bit (NaN where it has NaN), and the indices of a stable descending sort:
    torch.topk's where the row's values are distinct, the smaller index first among equal values."""
    values, indices = fast_kernels.topk_rows(x, k, vectorized)
    expected_values, expected_indices = torch.topk(x, k, dim=1)
    assert values.shape == indices.shape == (x.shape[0], k) and indices.dtype == torch.long
    torch.testing.assert_close(values, expected_values, rtol=0, atol=0, equal_nan=True)
    stable = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(indices, stable), (x, k, indices, stable)
    distinct = torch.tensor([row.unique().numel() == row.numel() and not row.isnan().any() for row in x])
    assert torch.equal(indices[distinct], expected_indices[distinct])


@pytest.mark.parametrize("vectorized", VECTORIZED)
@pytest.mark.parametrize("length", [1, 7, 16, 17, 100, 4 * 1000 + 3])
def test_topk_rows_is_torch_topk(kernels, vectorized, length):
    """Every k from 1 to the row's length (the tail after the last 16 values included), one row and many."""
    gen = torch.Generator().manual_seed(length)
    x = torch.randn(5, length, generator=gen)
    for k in sorted(k for k in {1, 2, 8, 16, length - 1, length} if 1 <= k <= length):
        _assert_topk(x, k, vectorized)
        _assert_topk(x[:1], k, vectorized)


@pytest.mark.parametrize("vectorized", VECTORIZED)
def test_topk_rows_breaks_ties_by_the_smaller_index_and_ranks_nan_highest(kernels, vectorized):
    gen = torch.Generator().manual_seed(0)
    ties = torch.randint(0, 4, (6, 300), generator=gen).float()  # few distinct values: every k cuts through ties
    for k in (1, 3, 8, 64, 300):
        _assert_topk(ties, k, vectorized)
    x = torch.randn(6, 257, generator=gen)
    x[0, [5, 100, 256]] = float("nan")
    x[1, :] = float("nan")  # NaN everywhere: the k first
    x[2, 40:] = float("-inf")  # beam search's masked candidates
    x[3, [0, 31, 200]] = float("inf")
    x[4, :] = float("-inf")
    x[5, ::2] = 0.0
    x[5, 1::2] = -0.0
    for k in (1, 2, 3, 4, 8, 100, 257):
        _assert_topk(x, k, vectorized)


@pytest.mark.parametrize("vectorized", VECTORIZED)
def test_topk_rows_takes_beam_search_candidates_and_strided_rows(kernels, vectorized):
    """Beam search's shape (batch 16 x 4 beams of an 8000-token vocabulary, 8 kept), log-probabilities, and a
    transposed (non-contiguous) input."""
    gen = torch.Generator().manual_seed(1)
    log_probs = torch.randn(16, 4 * 8000, generator=gen).log_softmax(dim=1)
    _assert_topk(log_probs, 8, vectorized)
    _assert_topk(torch.randn(300, 9, generator=gen).t(), 4, vectorized)


def test_topk_rows_refuses_what_it_does_not_compute(kernels):
    with pytest.raises(RuntimeError, match="2-D float"):
        fast_kernels.topk_rows(torch.randn(8), 2)
    with pytest.raises(RuntimeError, match="2-D float"):
        fast_kernels.topk_rows(torch.randn(2, 8, dtype=torch.float64), 2)
    for k in (0, 9):
        with pytest.raises(RuntimeError, match="k must be in"):
            fast_kernels.topk_rows(torch.randn(2, 8), k)


def test_beam_search_takes_the_kernel_where_the_cpu_runs_it(kernels):
    """FastDecoder's beam step calls `topk_rows` where the C++ AVX-512 kernels run (`cpp_avx512_kernels`)."""
    from hf_vit_plus import Seq2SeqTransformerForConditionalGeneration
    from hf_vit_plus.models.fast_decoding import FastDecoder
    from tests.models.test_fast_decoding import _config

    decoder = FastDecoder(Seq2SeqTransformerForConditionalGeneration(_config()).eval())
    assert decoder.fast_topk == fast_kernels.cpp_avx512_kernels()[1]
