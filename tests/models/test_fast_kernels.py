"""The C++ kernels of `hf_vit_plus.models.fast_kernels` against what they replace: beam search's top-k of the
candidates (`topk_rows`) against `torch.topk`, with the AVX-512 comparisons and with the plain loop; the AVX-512
products (`int8_vnni_linear`, `fp32_packed_linear`) against their Python definitions; the fused attention kernels
(`cache_attention`, `source_attention`) against the decoder layer's Python attention."""

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


needs_avx512 = pytest.mark.skipif(
    not fast_kernels.cpp_avx512_kernels()[1], reason="the C++ AVX-512 kernels run on CPUs with AVX-512 only"
)


@needs_avx512
@pytest.mark.parametrize("rows", [1, 2, 3, 17, 64])
def test_the_avx512_products_compute_the_python_definitions(kernels, rows):
    """`int8_vnni_linear`: FastLinear's Python definition of dynamic int8 (each row quantized over its own range),
    bit for bit; `fp32_packed_linear`: F.linear's products (another order of the sums), for widths that are not a
    multiple of the 64-column groups too."""
    torch.manual_seed(rows)
    for out_features, in_features in ((64, 32), (100, 48), (8000 // 50, 256)):
        linear = torch.nn.Linear(in_features, out_features)
        x = torch.randn(rows, in_features)
        with torch.no_grad():
            if fast_kernels.cpp_avx512_kernels()[0]:
                int8 = fast_kernels.FastLinear(linear, "int8-dynamic")
                assert int8.vnni
                vnni = int8(x)
                int8.vnni = False  # the Python definition
                assert torch.equal(vnni, int8(x)), (rows, out_features, in_features)
            packed = torch.ops.hf_vit_plus_cpp.fp32_packed_linear.default(x, linear.weight, linear.bias)
            torch.testing.assert_close(packed, torch.nn.functional.linear(x, linear.weight, linear.bias))


@needs_avx512
@pytest.mark.parametrize("beams", [1, 4])
def test_the_fused_attention_kernels_compute_the_python_attention(kernels, beams):
    """`cache_attention` (over positions 0..position only, through beam search's cache history) and
    `source_attention` (padded sources masked) against the decoder layer's Python attention."""
    from hf_vit_plus import Seq2SeqTransformerForConditionalGeneration
    from hf_vit_plus.models.fast_decoding import FastDecoderLayer
    from tests.models.test_fast_decoding import _config

    torch.manual_seed(beams)
    model = Seq2SeqTransformerForConditionalGeneration(_config()).eval()
    layer = FastDecoderLayer(model.model.decoder.layers[0], "float32")
    assert layer.fused_attention
    batch, length, source, dim = 3, 9, 7, model.config.d_model
    rows = batch * beams
    hidden = torch.randn(rows, dim)
    keys, values = torch.randn(rows, length, dim), torch.randn(rows, length, dim)
    history = torch.randint(0, rows, (rows, length)) if beams > 1 else None
    cross_keys, cross_values = torch.randn(batch, source, dim), torch.randn(batch, source, dim)
    bias = torch.zeros(batch, source)
    bias[0, 5:] = float("-inf")
    with torch.no_grad():
        for position in (0, 4, length - 1):
            outputs = []
            for fused in (True, False):
                layer.fused_attention = fused
                cache = (keys.clone(), values.clone())
                own = layer.self_attention(hidden, torch.tensor(position), *cache, history)
                outputs.append((own, layer.cross_attention(hidden, cross_keys, cross_values, bias), cache))
            (fused_own, fused_cross, fused_cache), (own, cross, cache) = outputs
            torch.testing.assert_close(fused_own, own, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(fused_cross, cross, rtol=1e-5, atol=1e-5)
            assert torch.equal(fused_cache[0], cache[0]) and torch.equal(fused_cache[1], cache[1])
