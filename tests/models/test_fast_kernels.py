"""The C++ kernels of `hf_vit_plus.models.fast_kernels` against what they replace, at every instruction-set level
the running CPU has (`HF_VIT_PLUS_CPU_ISA`'s levels up to `cpu_isa.supported_isa()`, switched inside the process by
`fast_kernels.use_cpu_isa`: on an AVX-512 machine the AVX2 and portable paths run too): beam search's top-k of the
candidates (`topk_rows`) against `torch.topk`; the products (`int8_vnni_linear`, `fp32_packed_linear`) against their
Python definitions, int8 bit for bit; the fused attention kernels (`cache_attention`, `source_attention`) against the
decoder layer's Python attention. The engine's token-for-token checks at the generic level: `make test-generic`;
the source's compilation for aarch64: `test_the_source_compiles_for_aarch64`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from hf_vit_plus.models import fast_kernels
from hf_vit_plus.models.cpu_isa import ISA_LEVELS, supported_isa

LEVELS = ISA_LEVELS[: ISA_LEVELS.index(supported_isa()) + 1]


@pytest.fixture(scope="module")
def kernels():
    if not fast_kernels.cpp_fbgemm_ops():
        pytest.skip("the C++ kernels could not be built here (a C++ compiler and ninja are needed)")


@pytest.fixture(params=LEVELS)
def level(request, kernels):
    """Each test body runs with the C++ kernels, and the choices of kernel, at one level."""
    with fast_kernels.use_cpu_isa(request.param):
        yield request.param


def _assert_topk(x: torch.Tensor, k: int, vectorized: bool = True) -> None:
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


@pytest.mark.parametrize("length", [1, 7, 16, 17, 100, 4 * 1000 + 3])
def test_topk_rows_is_torch_topk(level, length):
    """Every k from 1 to the row's length (the tail after the last 16 or 8 values included), one row and many; and
    the plain loop (`vectorized=False`) at every level."""
    gen = torch.Generator().manual_seed(length)
    x = torch.randn(5, length, generator=gen)
    for k in sorted(k for k in {1, 2, 8, 16, length - 1, length} if 1 <= k <= length):
        _assert_topk(x, k)
        _assert_topk(x[:1], k)
        _assert_topk(x, k, vectorized=False)


def test_topk_rows_breaks_ties_by_the_smaller_index_and_ranks_nan_highest(level):
    gen = torch.Generator().manual_seed(0)
    ties = torch.randint(0, 4, (6, 300), generator=gen).float()  # few distinct values: every k cuts through ties
    for k in (1, 3, 8, 64, 300):
        _assert_topk(ties, k)
    x = torch.randn(6, 257, generator=gen)
    x[0, [5, 100, 256]] = float("nan")
    x[1, :] = float("nan")  # NaN everywhere: the k first
    x[2, 40:] = float("-inf")  # beam search's masked candidates
    x[3, [0, 31, 200]] = float("inf")
    x[4, :] = float("-inf")
    x[5, ::2] = 0.0
    x[5, 1::2] = -0.0
    for k in (1, 2, 3, 4, 8, 100, 257):
        _assert_topk(x, k)


def test_topk_rows_takes_beam_search_candidates_and_strided_rows(level):
    """Beam search's shape (batch 16 x 4 beams of an 8000-token vocabulary, 8 kept), log-probabilities, and a
    transposed (non-contiguous) input."""
    gen = torch.Generator().manual_seed(1)
    log_probs = torch.randn(16, 4 * 8000, generator=gen).log_softmax(dim=1)
    _assert_topk(log_probs, 8)
    _assert_topk(torch.randn(300, 9, generator=gen).t(), 4)
    # ascending rows: every value beats the heap's worst (the heap path's worst case); the threshold keeps the last k
    _assert_topk(torch.arange(1000.0).repeat(3, 1), 8)
    _assert_topk(torch.arange(1000.0).repeat(3, 1), 8, vectorized=False)


def test_topk_rows_refuses_what_it_does_not_compute(kernels):
    with pytest.raises(RuntimeError, match="2-D float"):
        fast_kernels.topk_rows(torch.randn(8), 2)
    with pytest.raises(RuntimeError, match="2-D float"):
        fast_kernels.topk_rows(torch.randn(2, 8, dtype=torch.float64), 2)
    for k in (0, 9):
        with pytest.raises(RuntimeError, match="k must be in"):
            fast_kernels.topk_rows(torch.randn(2, 8), k)


def test_beam_search_takes_the_kernel_where_the_cpu_runs_it(level):
    """FastDecoder's beam step calls `topk_rows` wherever the C++ kernels are built, at every level."""
    from hf_vit_plus import Seq2SeqTransformerForConditionalGeneration
    from hf_vit_plus.models.fast_decoding import FastDecoder
    from tests.models.test_fast_decoding import _config

    decoder = FastDecoder(Seq2SeqTransformerForConditionalGeneration(_config()).eval())
    assert decoder.fast_topk and fast_kernels.kernel_paths()["topk_rows"] == level


def test_the_kernel_paths_follow_the_level(level):
    """`kernel_paths` names the level's path of each kernel, the products' Python definitions at the generic level
    (F.linear, torch._int_mm), and what `FastLinear` runs follows it; the C++ side refuses a level it does not know
    or the CPU lacks, and keeps the one it had."""
    paths = fast_kernels.kernel_paths()
    assert set(paths) == set(fast_kernels.CPP_KERNEL_NAMES) and fast_kernels.cpp_kernels().level == level
    assert paths["cache_attention"] == paths["source_attention"] == paths["topk_rows"] == level
    vnni = fast_kernels.cpp_kernels().vnni
    int8 = {"avx512": "avx512_vnni" if vnni else "avx2", "avx2": "avx2"}.get(level, "python")
    assert paths["int8_vnni_linear"] == int8
    assert paths["fp32_packed_linear"] == (level if level != "generic" else "python")
    linear = torch.nn.Linear(32, 48)
    assert fast_kernels.FastLinear(linear, "float32").packed_float32 == fast_kernels.PACKED_FLOAT32_ROWS.get(level)
    assert (fast_kernels.FastLinear(linear, "int8-dynamic").cpp_int8 is None) == (level == "generic")
    assert torch.ops.hf_vit_plus_cpp.cpu_kernels()[0] == ISA_LEVELS.index(level)
    widest = ISA_LEVELS.index(supported_isa())
    for wrong in {widest + 1, 3, -1}:
        with pytest.raises(RuntimeError, match="asks for more than this CPU has|is not one of"):
            torch.ops.hf_vit_plus_cpp.set_cpu_isa(wrong)
    assert torch.ops.hf_vit_plus_cpp.cpu_kernels()[0] == ISA_LEVELS.index(level)


def test_a_cap_wider_than_the_cpu_is_one_error(kernels, monkeypatch):
    monkeypatch.setattr("hf_vit_plus.models.cpu_isa.supported_isa", lambda: "generic")
    with pytest.raises(ValueError, match="HF_VIT_PLUS_CPU_ISA='avx2' asks for more than this CPU has"):
        with fast_kernels.use_cpu_isa("avx2"):
            pass


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 17, 64])
def test_the_products_compute_the_python_definitions(level, rows):
    """`int8_vnni_linear` (VNNI, vpmaddubsw or plain loops): FastLinear's Python definition of dynamic int8 (each
    row quantized over its own range), bit for bit, with products at the ends of the int8 range (a row's -127 against
    weights of 127 and -127: vpmaddubsw's pairs at their largest); `fp32_packed_linear`: F.linear's products (another
    order of the sums), for widths that are not a multiple of the column groups (64 at AVX-512, 16 below) and depths
    that are not a multiple of 4."""
    torch.manual_seed(rows)
    for out_features, in_features in ((64, 32), (100, 48), (8000 // 50, 256), (9, 1030)):
        linear = torch.nn.Linear(in_features, out_features)
        x = torch.randn(rows, in_features)
        x[:, :2] = -x.abs().amax(dim=1, keepdim=True) * 1.5
        with torch.no_grad():
            linear.weight[0, :2] = linear.weight[0].abs().max()
            linear.weight[1, :2] = -linear.weight[1].abs().max()
            int8 = fast_kernels.FastLinear(linear, "int8-dynamic")
            assert int8.weight[0, 0] == 127 and int8.weight[1, 0] == -127
            assert (int8.cpp_int8 is not None) == (level != "generic")
            cpp = torch.ops.hf_vit_plus_cpp.int8_vnni_linear.default(x, int8.weight, int8.scale, int8.bias)
            int8.cpp_int8 = None  # the Python definition
            assert torch.equal(cpp, int8(x)), (rows, out_features, in_features)
            for bias in (linear.bias, None):
                packed = torch.ops.hf_vit_plus_cpp.fp32_packed_linear.default(x, linear.weight, bias)
                torch.testing.assert_close(packed, torch.nn.functional.linear(x, linear.weight, bias))


def test_int8_without_native_products_takes_our_kernel_where_it_runs(level, monkeypatch):
    """Precision "int8" on a CPU without native int8 products (AVX2): our kernel's vpmaddubsw path at the row counts of
    `CPP_INT8_ROWS` (measured faster than FBGEMM's int8), FBGEMM's (or weight-only) int8 at the others."""
    monkeypatch.setattr(fast_kernels, "cpu_has_fast_int8_products", lambda: False)
    int8 = fast_kernels.FastLinear(torch.nn.Linear(32, 48), "int8")
    rows = fast_kernels.CPP_INT8_ROWS.get(level)
    fallback = "int8-fbgemm" if fast_kernels.fbgemm_int8_available() else "int8-weight-only"
    for count in (1, 4, 16, 64):
        ours = rows is not None and count >= rows[0] and (rows[1] is None or count <= rows[1])
        assert int8.kernel(count) == ("int8-dynamic" if ours else fallback), (level, count)


@pytest.mark.parametrize("beams", [1, 4])
def test_the_fused_attention_kernels_compute_the_python_attention(level, beams):
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


def _dense_attention(query, keys, values, bias, heads, scaling):
    """softmax(q . k * scaling + bias) v per head, in float64: query (R, D), keys and values (R, L, D), bias (R, L)."""
    rows, length, dim = keys.shape
    q = query.double().view(rows, heads, 1, dim // heads)
    k = keys.double().view(rows, length, heads, dim // heads).transpose(1, 2)
    v = values.double().view(rows, length, heads, dim // heads).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)).squeeze(2) * scaling + bias.double().unsqueeze(1)  # (R, H, L)
    return (scores.softmax(-1).unsqueeze(-1) * v).sum(2).reshape(rows, dim).float()


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64, 96, 128, 160])
def test_the_attention_kernels_at_every_head_size_and_length(level, head_dim):
    """`cache_attention` and `source_attention` against a dense float64 softmax attention, for heads of 1 to 10
    vectors (in registers or in memory), lengths around the kernels' blocks of 4 keys and 16 scores (the tails),
    scores from far below the exponential's range to large (float32 scores of tens: a tolerance of 1e-4), padded
    sources and a NaN query row (NaN out, as softmax gives)."""
    gen = torch.Generator().manual_seed(head_dim)
    heads = 2
    dim = heads * head_dim
    for length in (1, 3, 4, 5, 15, 16, 17, 33):
        rows = 3
        query = torch.randn(rows, dim, generator=gen) * 3
        keys = torch.randn(rows, length + 2, dim, generator=gen)
        values = torch.randn(rows, length + 2, dim, generator=gen)
        query[2] *= 10  # scores far apart: most exponentials below float32's normal range
        position = torch.tensor(length - 1)
        out = fast_kernels.cache_attention(query, keys, values, position, None, heads, 0.125)
        zeros = torch.zeros(rows, length)
        expected = _dense_attention(query, keys[:, :length], values[:, :length], zeros, heads, 0.125)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        bias = torch.zeros(rows, length)
        bias[0, length // 2 + 1 :] = float("-inf")
        out = fast_kernels.source_attention(
            query, keys[:, :length].contiguous(), values[:, :length].contiguous(), bias, heads, 0.125
        )
        expected = _dense_attention(query, keys[:, :length], values[:, :length], bias, heads, 0.125)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        query[1, :head_dim] = float("nan")
        out = fast_kernels.cache_attention(query, keys, values, position, None, heads, 0.125)
        assert out[1, :head_dim].isnan().all() and not out[1, head_dim:].isnan().any()


def _aarch64_headers() -> Path | None:
    """The include/ folder of torch's aarch64 wheel of this torch's version, as `make aarch64-check` unpacks it
    (HF_VIT_PLUS_AARCH64_TORCH_INCLUDE, else .cache/aarch64/torch-<version>/include); None where it is not there."""
    version = torch.__version__.split("+")[0]
    default = Path(__file__).resolve().parents[2] / ".cache" / "aarch64" / f"torch-{version}" / "include"
    folder = Path(os.environ.get("HF_VIT_PLUS_AARCH64_TORCH_INCLUDE", default))
    return folder if (folder / "torch" / "library.h").is_file() else None


def test_the_source_compiles_for_aarch64():
    """An ARM64 user's first call is not a compile error: `fast_kernels.cpp` (its intrinsics behind `__x86_64__`, the
    portable paths in plain C++) passes the cross compiler's syntax and type checks against the headers of torch's
    aarch64 wheel. Skipped without Debian's g++-aarch64-linux-gnu or those headers (`make aarch64-check` gets both)."""
    compiler = shutil.which("aarch64-linux-gnu-g++")
    headers = _aarch64_headers()
    if compiler is None or headers is None:
        pytest.skip("needs aarch64-linux-gnu-g++ and torch's aarch64 headers (make aarch64-check)")
    source = Path(fast_kernels.__file__).with_name(fast_kernels.CPP_SOURCE)
    command = [compiler, "-std=c++20", "-fsyntax-only", "-O2", "-Wall", "-Werror=return-type"]
    command += ["-isystem", str(headers), "-isystem", str(headers / "torch" / "csrc" / "api" / "include")]
    done = subprocess.run([*command, str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


def test_the_engine_runs_the_paths_of_the_cap(kernels):
    """Under `HF_VIT_PLUS_CPU_ISA` (`make test-generic` sets it to generic), the C++ kernels and the engine's choices
    run at the capped level, not at the CPU's widest."""
    from hf_vit_plus.models.cpu_isa import cpu_isa

    assert fast_kernels.cpp_kernels().level == cpu_isa()
    assert fast_kernels.kernel_paths()["cache_attention"] == cpu_isa()
