"""`hf_vit_plus.models.fast_decoding`: `generate(custom_generate=FastDecoding(...))` runs each token as one compiled
graph and gives the tokens of eager `generate` in float32, for greedy decoding and beam search.

Most checks run the same steps uncompiled (`backend="eager"`: the graph's code, in a second); two tests compile with
AOTInductor (the default backend, about ten seconds per step on a tiny model) and check that one compiled step serves
other source and output lengths. The model is briefly trained on a toy task (reversing the source), so that its
predictions are varied and sequences end at different lengths.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from hf_vit_plus import Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.generation import decompose_row_matmuls
from hf_vit_plus.models.fast_decoding import FastDecoder, FastDecoding
from hf_vit_plus.models.fast_kernels import (
    SMALL_ROWS,
    FastLinear,
    OutputScreen,
    fbgemm_fp16_available,
    fbgemm_fp16_linear_op,
    fbgemm_int8_available,
    fbgemm_int8_linear_op,
    fbgemm_pack_counts,
    python_fp16_fbgemm_linear_op,
    python_int8_fbgemm_linear_op,
    quantize_rows,
)
from tests.models.test_seq2seq_modeling import BOS, EOS, PAD, VOCAB, tiny_config


def _config(**overrides) -> Seq2SeqTransformerConfig:
    """The seq2seq tests' tiny config, twice as wide (a translation the tests train in a few seconds)."""
    return tiny_config(**{"d_model": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, **overrides})


def _reversal_batch(gen: torch.Generator, batch: int):
    """Sources of 3-8 tokens, right-padded; targets: the source reversed, then EOS."""
    src = torch.full((batch, 8), PAD)
    labels = torch.full((batch, 9), -100)
    for row in range(batch):
        length = int(torch.randint(3, 9, (1,), generator=gen))
        tokens = torch.randint(3, VOCAB, (length,), generator=gen)
        src[row, :length] = tokens
        labels[row, :length] = tokens.flip(0)
        labels[row, length] = EOS
    return src, (src != PAD).long(), labels


def _train(model, steps: int = 120):
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        src, mask, labels = _reversal_batch(gen, batch=64)
        loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return _train(Seq2SeqTransformerForConditionalGeneration(_config()))


@pytest.fixture(scope="module")
def marian_like():
    """Marian's options (swish, sines then cosines, an output bias, the pad token as the decoder start), pre-norm."""
    torch.manual_seed(1)
    config = _config(
        activation_function="swish",
        sinusoid_layout="halves",
        add_final_logits_bias=True,
        decoder_start_token_id=PAD,
        normalize_before=True,
    )
    model = Seq2SeqTransformerForConditionalGeneration(config)
    with torch.no_grad():
        model.final_logits_bias.normal_(std=0.5)
    return _train(model, steps=60)


@pytest.fixture(scope="module")
def batch():
    src, mask, _ = _reversal_batch(torch.Generator().manual_seed(123), batch=8)
    return src, mask


def _generate(model, batch, **settings) -> torch.Tensor:
    src, mask = batch
    with torch.no_grad():
        return model.generate(src, attention_mask=mask, **settings)


def _assert_same(model, batch, fast, **settings):
    eager = _generate(model, batch, **settings)
    out = _generate(model, batch, custom_generate=fast, **settings)
    assert out.shape == eager.shape, (settings, out, eager)
    assert torch.equal(out, eager), (settings, out, eager)
    return eager


SETTINGS = {
    "greedy": dict(num_beams=1, max_new_tokens=12),
    "greedy, min_new_tokens": dict(num_beams=1, max_new_tokens=12, min_new_tokens=6),
    "greedy, max_length": dict(num_beams=1, max_length=7),
    "greedy, two eos ids, forced bos": dict(num_beams=1, eos_token_id=[EOS, 9], forced_bos_token_id=5, max_length=11),
    "beam": dict(num_beams=4, max_new_tokens=12),
    "beam, returned sequences, penalty": dict(num_beams=3, num_return_sequences=3, length_penalty=0.6, max_length=14),
    "beam, early_stopping=True": dict(num_beams=4, early_stopping=True, max_new_tokens=10),
    "beam, never, penalty > 0": dict(num_beams=4, early_stopping="never", length_penalty=1.3, max_new_tokens=10),
    "beam, min_length, two eos ids": dict(num_beams=3, min_length=5, eos_token_id=[EOS, 7], max_new_tokens=12),
    "beam, bad words, forced eos": dict(num_beams=2, bad_words_ids=[[5], [7]], forced_eos_token_id=EOS, max_length=9),
    "beam, max_length": dict(num_beams=5, max_length=6),
}


# The fused step's tokens against generate's over SETTINGS, with the other engines: test_decoding_engines.py.


def test_marian_options_and_pre_norm(marian_like, batch):
    fast = FastDecoding(backend="eager")
    for settings in (SETTINGS["greedy"], SETTINGS["beam, returned sequences, penalty"]):
        _assert_same(marian_like, batch, fast, **settings)


def test_the_compiled_steps_give_the_tokens_of_generate_at_every_length(model, batch):
    """AOTInductor compiles one greedy step (2 rows: through the output screen, where FBGEMM has float16 products)
    and one beam step (8 x 3 rows); both then serve other source and output lengths without compiling again. (The
    greedy step of many rows is compiled in the FBGEMM int8 test below and in the torch.compile test. Nothing kept on
    disk: the steps built are those of this test alone; test_step_cache.py checks the kept ones.)"""
    fast = FastDecoding(step_cache=False)
    src, mask = batch
    pair = (src[:2], mask[:2])
    _assert_same(model, pair, fast, **SETTINGS["greedy"])
    _assert_same(model, batch, fast, num_beams=3, max_new_tokens=12, length_penalty=0.6)
    steps = fast.decoding_state(model).steps.runners
    assert len(steps) == 2
    for cut, new_tokens in ((5, 4), (8, 20)):
        _assert_same(model, (pair[0][:, :cut], pair[1][:, :cut]), fast, num_beams=1, max_new_tokens=new_tokens)
        shorter = (src[:, :cut], mask[:, :cut])
        _assert_same(model, shorter, fast, num_beams=3, max_new_tokens=new_tokens, length_penalty=0.6)
    assert len(fast.decoding_state(model).steps.runners) == 2
    if fbgemm_fp16_available():
        assert fast.screened_steps > 0 and fast.screen_fallbacks == 0


def test_aoti_flat_call_returns_what_the_loaded_package_returns():
    """`compat.aoti_flat_call` (the compiled steps' call, without pytree's flattening per token) gives the loaded
    package's own outputs, in the same nesting of tuples and lists, for inputs nested the same way."""
    from hf_vit_plus.models.compat import aoti_flat_call
    from hf_vit_plus.models.fast_decoding import aoti_compile

    class Nested(torch.nn.Module):
        def forward(self, x, pair):
            y, rest = pair
            return x + 1, [y * 2, (x @ rest[0], rest[0].sum())]

    args = (torch.randn(3, 4), (torch.randn(4), [torch.randn(4, 5)]))
    runner = aoti_compile(Nested(), args)
    flat = aoti_flat_call(runner)
    assert flat is not None  # torch 2.14's and 2.15's loaders have boxed_run and get_call_spec
    for _ in range(2):
        out, expected = flat(*args), runner(*args)
        assert type(out) is tuple and type(out[1]) is list and type(out[1][1]) is tuple
        assert torch.utils._pytree.tree_structure(out) == torch.utils._pytree.tree_structure(expected)
        for a, b in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(expected)):
            assert torch.equal(a, b)


def test_aoti_flat_call_leaves_what_it_does_not_rebuild_to_the_runner():
    """Inputs go to the loader as pytree orders them (tensors only); a runner without the loader's entry points, or
    outputs other than tuples and lists of leaves (a dict), keep the runner's own call (None)."""
    from torch.utils import _pytree

    from hf_vit_plus.models.compat import aoti_flat_call

    class Loader:
        def __init__(self, outputs):
            self.outputs, self.inputs = outputs, None

        def get_call_spec(self):
            return ["", _pytree.treespec_dumps(_pytree.tree_structure(self.outputs))]

        def boxed_run(self, inputs):
            self.inputs = list(inputs)
            return _pytree.tree_leaves(self.outputs)

    class Runner:
        def __init__(self, outputs):
            self.loader = Loader(outputs)

    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    runner = Runner((a, [b, (c,)]))
    out = aoti_flat_call(runner)(a, (b, [c, 3]), [])
    assert type(out) is tuple and type(out[1]) is list and type(out[1][1]) is tuple
    assert out[0] is a and out[1][0] is b and out[1][1][0] is c
    assert [t is u for t, u in zip(runner.loader.inputs, (a, b, c))] == [True] * 3
    assert aoti_flat_call(Runner({"logits": a})) is None
    assert aoti_flat_call(object()) is None


@pytest.mark.parametrize("rows", [1, 16])
def test_fast_decoding_generate_runs_the_encoder_and_gives_the_tokens_of_generate(model, rows):
    """`FastDecoding.generate` (the encoder's products in the decoding precision too): float32 gives eager
    `generate`'s tokens, greedy and beam 4, at batch 1 and 16; int8 at least 80% of them (as the decoder alone)."""
    src, mask, _ = _reversal_batch(torch.Generator().manual_seed(7), batch=rows)
    fast, int8 = FastDecoding(backend="eager"), FastDecoding(precision="int8", backend="eager")
    for settings in (SETTINGS["greedy"], SETTINGS["beam"]):
        eager = _generate(model, (src, mask), **settings)
        out = fast.generate(model, src, mask, **settings)
        assert out.shape == eager.shape and torch.equal(out, eager), (settings, out, eager)
        out = int8.generate(model, src, mask, **settings)
        length = min(out.shape[1], eager.shape[1])
        agreement = (out[:, :length] == eager[:, :length]).float().mean()
        assert out.shape[0] == rows and agreement > 0.8, (settings, agreement)


@pytest.mark.slow
def test_the_torch_compile_backend_gives_the_tokens_of_generate(model, batch):
    fast = FastDecoding(backend="compile")
    _assert_same(model, batch, fast, **SETTINGS["greedy"])
    _assert_same(model, batch, fast, **SETTINGS["beam"])


needs_fbgemm = pytest.mark.skipif(not fbgemm_int8_available(), reason="this torch has no FBGEMM (x86 builds have it)")


@pytest.mark.parametrize(
    "precision",
    ["bfloat16", "int8", "int8-weight-only", "int8-dynamic", pytest.param("int8-fbgemm", marks=needs_fbgemm)],
)
def test_reduced_precisions_decode_close_to_float32(model, batch, precision):
    """bf16 and int8 weights are not float32's: they must decode the task nearly as well (the README measures them
    on real translation); here at least 80% of float32's tokens, greedy and beam."""
    fast = FastDecoding(precision=precision, backend="eager")
    for settings in (dict(num_beams=1, max_new_tokens=10, min_new_tokens=10), dict(num_beams=3, max_new_tokens=10)):
        reference = _generate(model, batch, **settings)
        out = _generate(model, batch, custom_generate=fast, **settings)
        assert out.shape[0] == reference.shape[0] and out.max() < VOCAB
        length = min(out.shape[1], reference.shape[1])
        agreement = (out[:, :length] == reference[:, :length]).float().mean()
        assert agreement > 0.8, (precision, settings, agreement)


def test_int8_weights_and_the_products(model):
    linear = model.model.decoder.layers[0].fc1
    q, scale = quantize_rows(linear.weight)
    assert q.dtype == torch.int8 and q.abs().max() == 127
    torch.testing.assert_close(q.float() * scale[:, None], linear.weight, atol=scale.max().item(), rtol=0)
    x = torch.randn(3, linear.in_features)
    reference = linear(x).detach()
    checks = [("float32", 1e-6), ("bfloat16", 0.05), ("int8-weight-only", 0.05), ("int8", 0.1)]
    checks += [("int8-fbgemm", 0.1)] if fbgemm_int8_available() else []
    for precision, tolerance in checks:
        out = FastLinear(linear, precision)(x)
        assert (out - reference).abs().max() <= tolerance * reference.abs().max(), precision
    assert FastLinear(linear, "float32").weight.data_ptr() == linear.weight.data_ptr()  # no copy in float32
    assert FastLinear(linear, "int8").nbytes() < FastLinear(linear, "float32").nbytes() / 3


@pytest.mark.parametrize("native", [True, False])
def test_int8_and_bf16_use_their_own_products_only_where_the_cpu_has_them(monkeypatch, model, native):
    """Regression: "int8" ran dynamic int8 (`torch._int_mm`) at every row count, a slow loop on CPUs without VNNI
    (12-140x slower than float32 products on the AVX2 CI CPU; the SWORD beam search took 830 s against 121 s
    weight-only), and "bfloat16" ran bf16 GEMMs where they are reference loops too. Then, on those CPUs, "int8" ran
    the weight-only loop at every row count, slower than float32 too (25 against 83 tokens/s at opus-mt sizes): it
    now takes FBGEMM's int8 linear there (weight-only only where torch has no FBGEMM)."""
    from hf_vit_plus.models import fast_decoding, fast_kernels

    monkeypatch.setattr(fast_kernels, "cpu_has_fast_int8_products", lambda: native)
    monkeypatch.setattr(fast_decoding, "cpu_has_fast_int8_products", lambda: native)
    monkeypatch.setattr(fast_kernels, "cpu_has_native_bf16_products", lambda: native)
    monkeypatch.setattr(fast_kernels, "cpp_int8_rows", lambda: None)  # not our C++ int8 (tested on its own)
    linear = model.model.decoder.layers[0].fc1
    without_native = "int8-fbgemm" if fbgemm_int8_available() else "int8-weight-only"
    for rows in (1, 64):
        assert FastLinear(linear, "int8").kernel(rows) == ("int8-dynamic" if native else without_native)
    assert FastLinear(linear, "bfloat16").kernel(64) == ("bfloat16" if native else "bfloat16-rows")
    assert FastLinear(linear, "bfloat16").kernel(1) == "bfloat16-rows"
    assert FastLinear(linear, "int8-dynamic").kernel(64) == "int8-dynamic"  # asked for by name: as asked
    x = torch.randn(64, linear.in_features)
    reference = linear(x).detach()
    for precision in ("int8", "bfloat16"):
        out = FastLinear(linear, precision)(x)
        assert (out - reference).abs().max() <= 0.1 * reference.abs().max(), precision
    monkeypatch.setattr(fast_kernels, "fbgemm_int8_available", lambda: False)
    monkeypatch.setattr(fast_decoding, "fbgemm_int8_available", lambda: False)
    assert FastLinear(linear, "int8").kernel(1) == ("int8-dynamic" if native else "int8-weight-only")


@pytest.mark.parametrize("native", [True, False])
def test_int8_says_when_it_is_slower_than_float32_on_this_cpu(monkeypatch, model, batch, native):
    """Regression: on a CPU without native int8 products (the AVX2 CI CPU) "int8" decoded 3.3x more slowly than
    float32 (25 against 83 tokens/s at opus-mt sizes) without a word; it now warns, once per FastDecoding, and not
    where int8 products are native or for float32."""
    import warnings

    from hf_vit_plus.models import fast_decoding, fast_kernels

    monkeypatch.setattr(fast_kernels, "cpu_has_fast_int8_products", lambda: native)
    monkeypatch.setattr(fast_decoding, "cpu_has_fast_int8_products", lambda: native)
    monkeypatch.setattr(fast_kernels, "fbgemm_int8_available", lambda: False)  # "int8" weight-only without native
    monkeypatch.setattr(fast_decoding, "fbgemm_int8_available", lambda: False)  # "int8" weight-only without native
    monkeypatch.setattr(fast_kernels, "cpp_int8_rows", lambda: None)  # and not our C++ int8 (fast: silent)
    settings = dict(num_beams=1, max_new_tokens=3)
    for precision in ("int8", "int8-weight-only", "float32"):
        fast = FastDecoding(precision=precision, backend="eager")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _generate(model, batch, custom_generate=fast, **settings)
            _generate(model, batch, custom_generate=fast, **settings)
        slow = [w for w in caught if "decodes more slowly than precision='float32'" in str(w.message)]
        expected = 1 if precision != "float32" and not native else 0
        assert len(slow) == expected, (precision, [str(w.message) for w in caught])
        if slow:
            assert f"precision={precision!r}" in str(slow[0].message) and "VNNI or AMX" in str(slow[0].message)
    if fbgemm_int8_available():  # "int8" takes FBGEMM's products on CPUs without native ones: the fast int8, silent
        monkeypatch.setattr(fast_kernels, "fbgemm_int8_available", lambda: True)
        monkeypatch.setattr(fast_decoding, "fbgemm_int8_available", lambda: True)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            _generate(model, batch, custom_generate=FastDecoding(precision="int8", backend="eager"), **settings)


@needs_fbgemm
def test_fbgemm_int8_products_are_per_row_and_close_to_float32(model):
    """The "int8-fbgemm" product maps each row onto [0, 1] before FBGEMM quantizes the activations per tensor: a
    row's product is the same whatever else is in a batch of several rows (bit for bit), close to its product alone
    (FBGEMM's own per-tensor range, which for one row is per row) and close to float32, also for rows far from
    zero-centred."""
    linear = model.model.decoder.layers[0].fc1
    fast = FastLinear(linear, "int8-fbgemm")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, linear.in_features, generator=gen) * torch.tensor([[0.01], [1], [100], [1], [1], [3]])
    x[3] += 5.0  # all positive
    x[4] = x[4].abs().neg()  # all negative
    out = fast(x)
    for row in range(x.shape[0]):
        other = (row + 1) % x.shape[0]
        assert torch.equal(fast(x[[row, other]])[:1], out[row : row + 1]), row
        reference = linear(x[row : row + 1]).detach()
        for product in (out[row : row + 1], fast(x[row : row + 1])):
            error = (product - reference).norm() / reference.norm()
            assert error < 0.05, (row, error)
    assert fast.kernel(1) == fast.kernel(64) == "int8-fbgemm"
    assert fbgemm_int8_linear_op() is fbgemm_int8_linear_op()  # defined once per process


@pytest.fixture(params=["cpp", "python"])
def kernels(request, monkeypatch):
    """The FBGEMM ops' kernels under test: the C++ ones (`cpp_fbgemm_ops`, skipped where they cannot be built) or
    the Python ones."""
    from hf_vit_plus.models import fast_kernels

    if request.param == "cpp":
        request.getfixturevalue("cpp_kernels")
    else:
        monkeypatch.setattr(fast_kernels, "cpp_fbgemm_ops", lambda: False)
    return request.param


@pytest.fixture
def cpp_kernels():
    """The C++ kernels of the FBGEMM ops (skipped where they cannot be built)."""
    from hf_vit_plus.models import fast_kernels

    if not fast_kernels.cpp_fbgemm_ops():
        pytest.skip("the C++ kernels could not be built here (a C++ compiler and ninja are needed)")


@needs_fbgemm
def test_fbgemm_int8_runs_inside_the_compiled_step_and_packs_each_weight_once(model, batch, kernels):
    """The AOTInductor-compiled step calls FBGEMM through the custom op (C++ or Python kernel): it decodes as the
    uncompiled step does, packs each weight once (not per token), and its packed weights go with the decoder. No
    warning: it is the fast int8."""
    import gc
    import warnings

    settings = dict(num_beams=1, max_new_tokens=8, min_new_tokens=8)
    eager = _generate(model, batch, custom_generate=FastDecoding(precision="int8-fbgemm", backend="eager"), **settings)
    gc.collect()
    before = fbgemm_pack_counts()
    fast = FastDecoding(precision="int8-fbgemm")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        out = _generate(model, batch, custom_generate=fast, **settings)
    # per layer: Q/K/V stacked, O, cross Q, cross K/V stacked (once per input), cross O, FFN; the output projection
    products = len(model.model.decoder.layers) * 7 + 1
    after = fbgemm_pack_counts()
    assert after["int8_live"] == before["int8_live"] + products
    assert after["int8_made"] == before["int8_made"] + products
    out = _generate(model, batch, custom_generate=fast, **settings)
    assert fbgemm_pack_counts() == after
    assert (out == eager).float().mean() > 0.95
    reference = _generate(model, batch, **settings)
    assert (out == reference).float().mean() > 0.8
    del fast
    gc.collect()
    # torch 2.14's torch.export / AOTInductor keeps the exported graph module, which holds the step's tensors, alive
    # after the decoder is gone (measured: the decoder is freed, the graph module survives gc); 2.15 frees it
    if torch.__version__ >= (2, 15):
        assert fbgemm_pack_counts()["int8_live"] == before["int8_live"]


@needs_fbgemm
def test_the_cpp_kernels_compute_the_python_kernels_products_bit_for_bit(cpp_kernels):
    """The C++ kernels of the FBGEMM ops (built once per torch install) call the same FBGEMM products as the Python
    kernels: equal outputs, bit for bit, for one row and several, square and wide and tall weights; a weight changed
    in place is packed again."""
    int8, fp16 = fbgemm_int8_linear_op(), fbgemm_fp16_linear_op()
    assert int8 is not python_int8_fbgemm_linear_op() and fp16 is not python_fp16_fbgemm_linear_op()
    gen = torch.Generator().manual_seed(0)
    for out_features, in_features, rows in [(64, 64, 1), (300, 96, 3), (40, 520, 1), (40, 520, 7)]:
        weight = torch.randn(out_features, in_features, generator=gen) * 0.05
        q, scale = quantize_rows(weight)
        owner = torch.zeros(out_features)
        x = torch.randn(rows, in_features, generator=gen) * 2.0
        assert torch.equal(int8(x, q, scale), python_int8_fbgemm_linear_op()(x, q, scale))
        assert torch.equal(fp16(x, weight, owner), python_fp16_fbgemm_linear_op()(x, weight, owner))
        first = int8(x, q, scale)
        q.neg_()
        assert torch.equal(int8(x, q, scale), -first)


@needs_fbgemm
def test_choosing_the_kernels_does_no_tensor_work_while_the_step_is_traced(cpp_kernels, monkeypatch):
    """Regression: the choice between the C++ and Python kernels ran FBGEMM's float16 self-test, whose tensors are fake
    when the first call comes inside torch.export's tracing (an int8-only decoder): it must only ask what torch has."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from hf_vit_plus.models import fast_kernels

    loaded = fast_kernels._cpp_kernels_loaded
    calls = []  # the first check says "not loaded yet", as in a fresh process: the choice is made again
    monkeypatch.setattr(fast_kernels, "_cpp_kernels_loaded", lambda: (calls.append(1) or len(calls) > 1) and loaded())
    fast_kernels.cpp_fbgemm_ops.cache_clear()
    fast_kernels.fbgemm_fp16_available.cache_clear()
    try:
        with FakeTensorMode():
            assert fast_kernels.cpp_fbgemm_ops() is True
    finally:
        fast_kernels.cpp_fbgemm_ops.cache_clear()
        fast_kernels.fbgemm_fp16_available.cache_clear()
    assert fast_kernels.fbgemm_fp16_available()


def test_the_python_kernels_run_where_the_cpp_ones_cannot_be_built(monkeypatch):
    """No compiler (or a build that fails): one warning saying why and how to silence it, the Python kernels run;
    HF_VIT_PLUS_CPP_KERNELS=0: the Python kernels, silently."""
    import warnings

    from hf_vit_plus.models import fast_kernels

    def fail():
        raise RuntimeError("ninja is not installed (pip install ninja)")

    monkeypatch.setattr(fast_kernels, "_cpp_kernels_loaded", lambda: False)
    monkeypatch.setattr(fast_kernels, "_build_cpp_kernels", fail)
    monkeypatch.setattr(fast_kernels, "fbgemm_int8_available", lambda: True)
    monkeypatch.setattr(fast_kernels, "fbgemm_fp16_available", lambda: True)
    fast_kernels.cpp_fbgemm_ops.cache_clear()
    try:
        with pytest.warns(UserWarning, match="could not be built.*ninja is not installed.*HF_VIT_PLUS_CPP_KERNELS=0"):
            assert fast_kernels.cpp_fbgemm_ops() is False
        assert fbgemm_int8_linear_op() is python_int8_fbgemm_linear_op()
        fast_kernels.cpp_fbgemm_ops.cache_clear()
        monkeypatch.setenv("HF_VIT_PLUS_CPP_KERNELS", "0")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert fast_kernels.cpp_fbgemm_ops() is False
    finally:
        fast_kernels.cpp_fbgemm_ops.cache_clear()


def test_the_cpp_source_is_a_file_of_the_package_and_its_absence_is_quiet(monkeypatch):
    """The C++ kernels are a real source file shipped as package data (pyproject's package-data takes *.cpp); a copy of
    fast_kernels.py loaded as remote code, with neither the file nor the package, runs the Python kernels, silently."""
    import re
    import warnings
    from pathlib import Path

    from hf_vit_plus.models import fast_kernels

    source = Path(fast_kernels.__file__).with_name(fast_kernels.CPP_SOURCE)
    assert fast_kernels.cpp_source() == source.read_text() and "TORCH_LIBRARY" in source.read_text()
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert re.search(r'\[tool\.setuptools\.package-data\]\n"\*" = \[[^\]]*"\*\.cpp"', pyproject)

    def missing():
        raise FileNotFoundError("fast_kernels.cpp is not next to fast_kernels.py and hf_vit_plus is not installed")

    monkeypatch.setattr(fast_kernels, "_cpp_kernels_loaded", lambda: False)
    monkeypatch.setattr(fast_kernels, "cpp_source", missing)
    monkeypatch.setattr(fast_kernels, "fbgemm_int8_available", lambda: True)
    monkeypatch.setattr(fast_kernels, "_has_fbgemm_fp16_ops", lambda: True)
    fast_kernels.cpp_fbgemm_ops.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert fast_kernels.cpp_fbgemm_ops() is False
    finally:
        fast_kernels.cpp_fbgemm_ops.cache_clear()


def test_int8_fbgemm_is_refused_where_torch_has_no_fbgemm(monkeypatch, model):
    from hf_vit_plus.models import fast_decoding, fast_kernels

    monkeypatch.setattr(fast_kernels, "fbgemm_int8_available", lambda: False)
    monkeypatch.setattr(fast_decoding, "fbgemm_int8_available", lambda: False)
    with pytest.raises(ValueError, match="int8-fbgemm.*FBGEMM"):
        FastLinear(model.model.decoder.layers[0].fc1, "int8-fbgemm")


@pytest.mark.parametrize(
    "flags,int8", [({"avx2", "fma"}, False), ({"avx2", "avx_vnni"}, True), ({"avx512f", "avx512_vnni"}, True)]
)
def test_native_int8_products_are_read_from_the_cpu_flags(monkeypatch, flags, int8):
    from hf_vit_plus.models import compat

    monkeypatch.setattr(compat, "_cpu_flags", lambda: frozenset(flags))
    assert compat.cpu_has_fast_int8_products() is int8


def test_changed_weights_rebuild_the_converted_decoder(batch):
    """Regression: the bf16 / int8 copies were made once per model; a model trained further (or loaded again in
    place) must not decode with stale weights. float32 steps read the model's tensors and need no rebuild."""
    torch.manual_seed(3)
    model = Seq2SeqTransformerForConditionalGeneration(_config()).eval()
    fast32, fast8 = FastDecoding(backend="eager"), FastDecoding(precision="int8", backend="eager")
    settings = dict(num_beams=1, max_new_tokens=6)
    before = _generate(model, batch, custom_generate=fast8, **settings)
    state32, state8 = fast32.decoding_state(model), fast8.decoding_state(model)
    _train(model, steps=20)
    after = _generate(model, batch, custom_generate=fast8, **settings)
    assert fast8.decoding_state(model) is not state8 and not torch.equal(before, after)
    assert fast32.decoding_state(model) is state32
    _assert_same(model, batch, fast32, **settings)
    # a tensor, then a submodule, replaced deep in the model: float32 rebuilds too (the steps read the old ones)
    layer = model.model.decoder.layers[0]
    layer.fc1.weight = torch.nn.Parameter(layer.fc1.weight.detach() * 3)
    assert fast32.decoding_state(model) is not state32
    _assert_same(model, batch, fast32, **settings)
    state32 = fast32.decoding_state(model)
    fc2 = torch.nn.Linear(layer.fc2.in_features, layer.fc2.out_features)
    layer.fc2 = fc2
    assert fast32.decoding_state(model) is not state32
    _assert_same(model, batch, fast32, **settings)


def test_one_generate_call_checks_the_weights_once_and_still_sees_a_change(batch, monkeypatch):
    """`FastDecoding.generate` checks the model's tensors before running the encoder, and the decoding loop that
    `generate` then calls takes that check instead of walking the tensors again; a call made without it
    (custom_generate alone), or the next call after the weights changed, still checks."""
    from hf_vit_plus.models import fast_decoding

    torch.manual_seed(3)
    model = Seq2SeqTransformerForConditionalGeneration(_config()).eval()

    walks = []
    real = fast_decoding._ModelDecoding._versions

    def counted(self, module):
        walks.append(module)
        return real(self, module)

    monkeypatch.setattr(fast_decoding._ModelDecoding, "_versions", counted)
    fast = FastDecoding(precision="int8", backend="eager")
    src, mask = batch
    settings = dict(num_beams=2, max_new_tokens=4)
    first = fast.generate(model, src, attention_mask=mask, **settings)  # builds the state (one walk), no check after
    walks.clear()
    assert torch.equal(fast.generate(model, src, attention_mask=mask, **settings), first)
    assert len(walks) == 1
    walks.clear()
    _generate(model, batch, custom_generate=fast, **settings)
    assert len(walks) == 1
    state = fast.decoding_state(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # the int8 copies are stale now
    fast.generate(model, src, attention_mask=mask, **settings)
    assert fast.decoding_state(model) is not state


needs_fbgemm_fp16 = pytest.mark.skipif(
    not fbgemm_fp16_available(), reason="this torch has no FBGEMM float16 linear (x86 builds have it)"
)
GREEDY = [name for name, settings in SETTINGS.items() if settings["num_beams"] == 1]


@needs_fbgemm_fp16
@pytest.mark.parametrize("settings", [SETTINGS[name] for name in GREEDY], ids=GREEDY)
def test_float32_greedy_steps_of_few_rows_choose_through_the_output_screen(model, marian_like, batch, settings):
    """float32 greedy steps of at most SMALL_ROWS rows take each token from the float16 screen of the output
    projection, proven by its bound: eager's tokens, with the logits processors (masks, forced tokens) and an output
    bias, and none left to the fallback on a trained model. Steps of more rows compute all logits."""
    for trained in (model, marian_like):
        fast = FastDecoding(backend="eager")
        for rows in (1, SMALL_ROWS):
            _assert_same(trained, (batch[0][:rows], batch[1][:rows]), fast, **settings)
        assert fast.screened_steps > 0 and fast.screen_fallbacks == 0
        whole = FastDecoding(backend="eager", drop_finished=False)  # (dropped rows: the remaining few are screened)
        _assert_same(trained, batch, whole, **settings)  # 8 rows
        assert whole.screened_steps == 0
        unscreened = FastDecoding(backend="eager", screened_greedy=False)
        _assert_same(trained, (batch[0][:1], batch[1][:1]), unscreened, **settings)
        assert unscreened.screened_steps == 0 and unscreened.decoding_state(trained).decoder.screen is None


@needs_fbgemm_fp16
@pytest.mark.parametrize("fixture", ["model", "marian_like"])
def test_the_output_screen_bounds_every_logit(request, fixture):
    """The screen's bound holds for every logit (against float64 products of the float32 weights), for rows of very
    different scales and offsets, and is tight enough to separate tokens: below a hundredth of the logits' range."""
    trained = request.getfixturevalue(fixture)
    screen = FastDecoder(trained, screen=True).screen
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, screen.weight.shape[1], generator=gen) * torch.tensor([[0.01], [1], [40], [1], [3]])
    hidden[3] += 20.0
    approx, error = screen.approximate(hidden)
    exact = hidden.double() @ screen.weight.double().t()
    if screen.bias is not None:
        exact = exact + screen.bias.double()
    assert ((approx.double() - exact).abs() <= error.double()).all()
    spread = exact.amax(dim=1) - exact.amin(dim=1)
    ratio = error.amax(dim=1).double() / spread
    assert (ratio < 1e-2).all(), ratio


@needs_fbgemm_fp16
def test_the_screen_breaks_ties_as_argmax_and_leaves_the_unproven_to_all_logits():
    """Two tokens with the same weights tie exactly: the smaller id wins, as in `argmax`, also when the logits
    processors mask one of them; a third token closer to them than float16's rounding is told apart by the exact
    recomputation of the candidates. With fewer candidates than such tokens, nothing is claimed proven."""
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(32, 50, bias=False)
    with torch.no_grad():
        linear.weight.normal_(generator=gen)
        linear.weight[9] = linear.weight[30] = 3 * linear.weight[4]
        linear.weight[41] = linear.weight[9] + 1e-6  # closer than float16's rounding: the screen cannot tell
    screen = OutputScreen(FastLinear(linear, "float32"))
    hidden = linear.weight[4].detach().clone().view(1, 32)
    off = torch.zeros(50, dtype=torch.bool)

    def controls(bad=()):
        bias = torch.zeros(50)
        bias[list(bad)] = float("-inf")
        return (bias, off, off, off, torch.tensor([0, 100, 0, 0, 0]))

    def reference(bad=()):
        return FastDecoder.process(linear(hidden), torch.tensor(3), controls(bad)).argmax(dim=-1)

    for bad, token in (((41,), 9), ((9, 41), 30), ((9, 30), 41), ((), None)):
        choice, certain = screen(hidden, torch.tensor(3), controls(bad))
        assert int(choice) == int(reference(bad)) and bool(certain), bad
        assert token is None or int(choice) == token
    narrow = OutputScreen(FastLinear(linear, "float32"), candidates=2)
    _, certain = narrow(hidden, torch.tensor(3), controls())
    assert not bool(certain)  # 9, 30 and 41 within the bound, two candidates


@needs_fbgemm_fp16
def test_tokens_the_screen_cannot_prove_come_from_all_float32_logits(model, batch):
    """With bounds too wide to prove anything, every token is taken from all float32 logits, and is still eager's."""
    fast = FastDecoding(backend="eager")
    fast.decoding_state(model).decoder.screen.slack.fill_(1e3)
    _assert_same(model, (batch[0][:2], batch[1][:2]), fast, **SETTINGS["greedy"])
    assert fast.screen_fallbacks == fast.screened_steps > 0
    fast.screened_steps = fast.screen_fallbacks = 0  # a forced token is proven whatever the bounds
    _assert_same(model, (batch[0][:2], batch[1][:2]), fast, **SETTINGS["greedy, two eos ids, forced bos"])
    assert fast.screen_fallbacks == fast.screened_steps - 1


@needs_fbgemm_fp16
def test_the_screen_follows_float32_weights_changed_in_place(batch):
    """float32 steps read the model's tensors and are not rebuilt when training changes them in place; the screen's
    float16 copy and bounds follow them."""
    torch.manual_seed(4)
    model = Seq2SeqTransformerForConditionalGeneration(_config(add_final_logits_bias=True)).eval()
    fast = FastDecoding(backend="eager")
    pair, settings = (batch[0][:2], batch[1][:2]), dict(num_beams=1, max_new_tokens=6)
    _assert_same(model, pair, fast, **settings)
    state = fast.decoding_state(model)
    before = state.decoder.screen.slack.clone()
    _train(model, steps=20)
    with torch.no_grad():
        model.final_logits_bias.normal_(std=0.5)
    _assert_same(model, pair, fast, **settings)
    assert fast.decoding_state(model) is state and not torch.equal(state.decoder.screen.slack, before)
    fresh = OutputScreen(state.decoder.lm_head)
    assert torch.equal(state.decoder.screen.slack, fresh.slack)
    assert torch.equal(state.decoder.screen.bias_slack, fresh.bias_slack)


@needs_fbgemm_fp16
def test_the_float16_copy_is_made_once_whatever_tensor_object_carries_the_weight(kernels):
    """Regression: the float16 copy was recognised by the weight's Python object, and a compiled step of a model with
    tied embeddings passes another object on the same data than a second compiled graph does: each call after the
    other's packed 58,000 x 512 weights again (found in the benchmark's profile). Now the data, shape and version
    counter recognise it (in both kernels); a change in place still packs again."""
    gen = torch.Generator().manual_seed(0)
    weight, owner, x = torch.randn(30, 16, generator=gen), torch.zeros(30), torch.randn(2, 16, generator=gen)
    op = fbgemm_fp16_linear_op()
    made = fbgemm_pack_counts()["fp16_made"]
    first = op(x, weight, owner)
    for carrier in (weight.detach(), weight, weight.detach()):
        assert torch.equal(op(x, carrier, owner), first)
    assert fbgemm_pack_counts()["fp16_made"] == made + 1
    weight.mul_(2.0)
    assert torch.equal(op(x, weight.detach(), owner), 2 * first)
    assert fbgemm_pack_counts()["fp16_made"] == made + 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(do_sample=True), "do_sample=True"),
        (dict(output_scores=True, return_dict_in_generate=True), "output_scores=True"),
        (dict(repetition_penalty=1.2), "RepetitionPenaltyLogitsProcessor"),
        (dict(bad_words_ids=[[4, 5]]), "bad_words_ids of more than one token"),
        (dict(decoder_input_ids=torch.tensor([[BOS, 4]] * 8)), "decoder prompt of 2 tokens"),
    ],
    ids=["sampling", "scores", "repetition penalty", "multi-token bad words", "decoder prompt"],
)
def test_what_the_fused_step_does_not_implement_is_refused_by_name(model, batch, settings, message):
    with pytest.raises(ValueError, match=message):
        _generate(model, batch, custom_generate=FastDecoding(backend="eager"), max_new_tokens=4, **settings)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Unknown precision 'fp8'"):
        FastDecoding(precision="fp8")
    with pytest.raises(ValueError, match="Unknown backend 'tvm'"):
        FastDecoding(backend="tvm")


def test_the_position_table_limit_is_an_error_as_in_eager_decoding(model, batch):
    for extra in ({}, {"custom_generate": FastDecoding(backend="eager")}):
        with pytest.raises(ValueError, match=r"max_position_embeddings \(32\)"):
            _generate(model, batch, max_new_tokens=40, **extra)


def test_the_model_generation_config_is_used(model, batch):
    """generate prepares the settings (the model's generation config, then the call's): beam search with the
    paper's length penalty here, as for eager decoding."""
    saved = model.generation_config
    model.generation_config = GenerationConfig(
        num_beams=3,
        length_penalty=0.6,
        max_new_tokens=9,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        decoder_start_token_id=BOS,
    )
    try:
        _assert_same(model, batch, FastDecoding(backend="eager"))
    finally:
        model.generation_config = saved


def test_a_few_row_products_become_loops_reading_stored_inputs():
    """decompose_row_matmuls(max_rows=4) rewrites the 1- and 3-row products (x-outer: (M, N, K) summed over K, so
    that inductor vectorises along K), not the 6-row one, and reads x through an `as_strided` view (regression:
    without it a LayerNorm feeding the product was recomputed for every column of W)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def products(one, three, six, weight, bias):
        normed = torch.nn.functional.layer_norm(three, (40,))
        return (
            torch.nn.functional.linear(one, weight, bias),
            torch.nn.functional.linear(normed, weight),
            torch.nn.functional.linear(six, weight, bias),
        )

    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(rows, 40, generator=g) for rows in (1, 3, 6)]
    inputs += [torch.randn(50, 40, generator=g), torch.randn(50, generator=g)]
    module = make_fx(products, tracing_mode="fake")(*inputs)
    expected = products(*inputs)
    assert decompose_row_matmuls(module.graph, max_rows=4) == 2
    module.recompile()
    targets = [node.target for node in module.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.aten.as_strided.default) == 2
    assert targets.count(torch.ops.aten.addmm.default) == 1  # the 6-row product stays a GEMM
    for out, reference in zip(module(*inputs), expected):
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_the_translate_command_offers_every_precision():
    """Regression: `hf-vit-plus translate --precision` keeps its own list (the CLI does not import torch to parse
    its arguments); it lacked "int8-fbgemm" when FastDecoding gained it."""
    from hf_vit_plus import export_cli
    from hf_vit_plus.models import fast_decoding

    assert export_cli.FAST_PRECISIONS == fast_decoding.PRECISIONS


def test_the_kernel_cache_follows_the_ecosystems_variables():
    """The C++ kernels were always built under ~/.cache/hf_vit_plus/kernels, whatever HF_HOME, XDG_CACHE_HOME or
    TORCH_EXTENSIONS_DIR said: they now follow them as torch's extension builds and the Hub's caches do."""
    from pathlib import Path

    from hf_vit_plus.models.fast_kernels import kernel_cache_dir

    assert kernel_cache_dir({}) == Path("~/.cache/huggingface/hf_vit_plus/kernels").expanduser()
    assert kernel_cache_dir({"XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/huggingface/hf_vit_plus/kernels")
    assert kernel_cache_dir({"XDG_CACHE_HOME": "/xdg", "HF_HOME": "/hf"}) == Path("/hf/hf_vit_plus/kernels")
    assert kernel_cache_dir({"HF_HOME": "/hf", "TORCH_EXTENSIONS_DIR": "/ext"}) == Path("/ext/hf_vit_plus")
    assert kernel_cache_dir({"TORCH_EXTENSIONS_DIR": "/ext", "HF_VIT_PLUS_KERNEL_CACHE": "/k"}) == Path("/k")


def test_a_compiled_step_is_chosen_by_torch_threads_too():
    """inductor writes its parallel loops for the threads of the process that compiles them: a step compiled at one
    thread count is not reused at another (a benchmark switches between them)."""
    from hf_vit_plus.models.fast_decoding import _shape_key

    args = (torch.zeros(2), [torch.zeros(3, 4)])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _shape_key("greedy_step", args, {"screened": False}, dynamic=False)
        torch.set_num_threads(2)
        two = _shape_key("greedy_step", args, {"screened": False}, dynamic=False)
    finally:
        torch.set_num_threads(threads)
    assert one != two and one[:-1] == two[:-1]


def test_the_cache_slabs_are_reused_zeroed_and_never_handed_out_twice():
    """The loops' caches live in reused slabs (`_CacheSlabs`): a slab handed back serves the next cache that fits,
    zeroed; a slab in use is not handed out again; the selected rows are the rows asked for, in a slab of their own;
    at most `keep` idle slabs are kept."""
    from hf_vit_plus.models.fast_decoding import _CacheSlabs

    decoder = type("Decoder", (), {"cache_shape": lambda self, rows, length: (4, rows, length, 8)})()
    slabs = _CacheSlabs(keep=2)
    first = slabs.cache(decoder, 6, 5, torch.device("cpu"))
    assert len(first) == 4 and all(t.shape == (6, 5, 8) and t.is_contiguous() for t in first)
    for t in first:
        t.fill_(3.0)
    second = slabs.cache(decoder, 6, 5, torch.device("cpu"))  # the first is in use: another slab
    assert second[0]._base is not first[0]._base
    rows = torch.tensor([0, 2, 5])
    expected = [t.index_select(0, rows) for t in first]
    selected = slabs.selected(decoder, first, rows)  # the first slab handed back
    assert all(torch.equal(a, b) for a, b in zip(selected, expected))
    third = slabs.cache(decoder, 4, 5, torch.device("cpu"))  # fits in the first slab: reused, zeroed
    assert third[0]._base is first[0]._base
    assert all(not t.any() for t in third)
    for cache in (second, selected, third):
        slabs.give(cache)
    assert len(slabs._idle) == 2


def test_dropping_rows_copies_the_written_positions_of_the_cache_only():
    """A loop that drops finished rows a few steps into a cache of the longest length copies the positions written so
    far (`_CacheSlabs.selected(..., written=)`), and zeroes the rest where the decoder's attention needs zeros
    (`_CacheSlabs.needs_zeros`), else leaves it as the slab was."""
    from hf_vit_plus.models.fast_decoding import _CacheSlabs

    zeros, fused = (type("Decoder", (), {"cache_needs_zeros": needs})() for needs in (True, False))
    cache = [torch.randn(6, 5, 8) for _ in range(4)]
    rows = torch.tensor([0, 2, 5])
    expected = [t.index_select(0, rows) for t in cache]
    zeroed = _CacheSlabs().selected(zeros, cache, rows, written=2)
    assert all(torch.equal(a[:, :2], b[:, :2]) and not a[:, 2:].any() for a, b in zip(zeroed, expected))
    slabs = _CacheSlabs(keep=1)
    slabs.give(list(torch.full((4 * 3 * 5 * 8,), 7.0).view(4, 3, 5, 8).unbind(0)))
    left = slabs.selected(fused, cache, rows, written=2)  # in the slab of 7s, its later positions untouched
    assert all(torch.equal(a[:, :2], b[:, :2]) and (a[:, 2:] == 7.0).all() for a, b in zip(left, expected))
    assert all(torch.equal(a, b) for a, b in zip(_CacheSlabs().selected(fused, cache, rows), expected))


def test_a_cache_in_reused_memory_is_not_zeroed_where_the_attention_reads_written_positions_only(model, batch):
    """Where every layer attends through the C++ kernels (which read the positions 0..position only), a cache slab
    is handed out as the last call left it: decoding in a slab full of NaN gives the tokens of generate. The tensor
    attention weighs every cached position, so there it is zeroed."""
    from hf_vit_plus.models import fast_kernels

    fast = FastDecoding(backend="eager")
    state = fast.decoding_state(model)
    fused = all(layer.fused_attention for layer in state.decoder.layers)
    assert state.decoder.cache_needs_zeros is not fused
    for settings in (SETTINGS["greedy"], SETTINGS["beam"]):
        state.slabs._idle = [torch.full((1 << 20,), float("nan"))]
        _assert_same(model, batch, fast, **settings)
    state.slabs._idle = [torch.full((1 << 20,), float("nan"))]
    taken = state.slabs.cache(state.decoder, 2, 3, torch.device("cpu"))
    assert bool(taken[0].isnan().all()) is fused  # the NaN slab, left as it was where fused, else zeroed
    if fast_kernels.cpp_kernels().level is None:
        return
    narrow = Seq2SeqTransformerForConditionalGeneration(_config(d_model=24, decoder_attention_heads=2)).eval()
    with fast_kernels.use_cpu_isa("generic"):  # heads of any size attend through the portable kernels
        assert FastDecoding(backend="eager").decoding_state(narrow).decoder.cache_needs_zeros is False
    if fast_kernels.cpp_kernels().level == "avx512":  # 12 dimensions per head: not a multiple of 16
        assert FastDecoding(backend="eager").decoding_state(narrow).decoder.cache_needs_zeros is True
