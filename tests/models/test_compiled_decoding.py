"""Compiled static-cache decoding (`hf_vit_plus.models.compiled_decoding`): `generate(cache_implementation="static")`
runs each decoding step of the seq2seq model and the sparse LM as one compiled graph, on CPU, for greedy decoding,
sampling and beam search, with the tokens of eager decoding.

Most checks trace with dynamo's "eager" backend and `fullgraph=True` (a second per shape): a Python branch on a
tensor value in the decoding path fails them. Three shapes go through inductor with the default CPU config (about
ten seconds each); the other families and modes through inductor are marked slow.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import CompileConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache

from hf_vit_plus.generation import compiled_generation_config, decompose_row_matmuls, row_matmul_pass
from hf_vit_plus.models.compat import CACHE_NAMES, cache_from_kwargs
from hf_vit_plus.models.compiled_decoding import reorder_cache_in_place
from tests.conftest import MODEL_CASES
from tests.test_common import GENERATION_MODES, _prompt

GENERATIVE = [case for case in MODEL_CASES if case.generative]
CASES = {case.id: case for case in GENERATIVE}

# Dynamo's tracing without inductor: checks that the whole step is one graph, in about a second per shape.
TRACE_ONLY = CompileConfig(backend="eager", fullgraph=True, dynamic=False, mode=None)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts without compiled code (torch stops compiling a function after 8 graphs)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _generate(model, prompt: dict, mode: str, **extra) -> torch.Tensor:
    torch.manual_seed(123)
    with torch.no_grad():
        return model.generate(**prompt, **GENERATION_MODES[mode], max_new_tokens=8, min_new_tokens=8, **extra)


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("case", GENERATIVE, ids=[case.id for case in GENERATIVE])
def test_static_cache_decoding_traces_as_one_graph_and_gives_the_eager_tokens(case):
    """Every family variant, greedy / beam / sampling: the decoding step traces with fullgraph=True (no data-dependent
    branch), once per shape (greedy and sampling share the batch size; beam search has batch x beams rows), and the
    tokens equal those of eager decoding with a dynamic cache. Before the fix the seq2seq decoder compared its static
    cache's (tensor) length with max_position_embeddings, and the sparse LM read it with int(): both failed here."""
    model, prompt = case.model(), _prompt(case)
    before = _graphs()
    for mode in ("greedy", "beam", "sample"):
        eager = _generate(model, prompt, mode)
        compiled = _generate(model, prompt, mode, cache_implementation="static", compile_config=TRACE_ONLY)
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0, msg=mode)
    assert _graphs() - before == 2  # (batch) and (batch x beams) rows; the growing sparse-LM mask adds none
    _generate(model, prompt, "greedy", cache_implementation="static", compile_config=TRACE_ONLY)
    assert _graphs() - before == 2  # a second call with the same shapes reuses the graph


def test_static_cache_compiles_by_default_on_cpu_and_only_the_decoding_steps(monkeypatch):
    """No compile_config given: `generate` compiles the steps after the first with `compiled_generation_config`, and
    leaves the first step (it fills the cache and computes the cross-attention keys/values once) eager."""
    model, prompt = CASES["seq2seq-dense"].model(), _prompt(CASES["seq2seq-dense"])
    used, compiled_calls = [], []
    original = type(model).get_compiled_call

    def spy(self, compile_config):
        used.append(compile_config)
        call = original(self, TRACE_ONLY)  # keep the test fast: same routing, dynamo tracing only

        def counted(**kwargs):
            compiled_calls.append(int(cache_from_kwargs(kwargs).self_attention_cache.get_seq_length()))
            return call(**kwargs)

        return counted

    monkeypatch.setattr(type(model), "get_compiled_call", spy)
    for mode in ("greedy", "beam"):
        compiled_calls.clear()
        eager = _generate(model, prompt, mode)
        static = _generate(model, prompt, mode, cache_implementation="static")
        torch.testing.assert_close(static, eager, rtol=0, atol=0, msg=mode)
        # 8 new tokens: the first from the eager step on the empty cache, the other 7 from compiled steps.
        assert compiled_calls == list(range(1, 8)), mode
    assert all(config == compiled_generation_config("cpu") for config in used)
    assert all(config._compile_all_devices for config in used)
    assert model._decoding_compile_config is None  # generate's setting does not outlive the call


def test_no_static_cache_or_disable_compile_keeps_eager_generate(monkeypatch):
    model, prompt = CASES["sparse-lm-fixed-heads"].model(), _prompt(CASES["sparse-lm-fixed-heads"])

    def fail(self, compile_config):
        raise AssertionError("compiled without a static cache or with disable_compile=True")

    expected = _generate(model, prompt, "beam")
    expected_greedy = _generate(model, prompt, "greedy")
    monkeypatch.setattr(type(model), "get_compiled_call", fail)
    static_eager = {"cache_implementation": "static", "disable_compile": True}
    for extra in ({}, {"cache_implementation": "dynamic"}, static_eager):
        torch.testing.assert_close(_generate(model, prompt, "beam", **extra), expected, rtol=0, atol=0, msg=extra)
        torch.testing.assert_close(_generate(model, prompt, "greedy", **extra), expected_greedy, rtol=0, atol=0)


def test_a_given_compile_config_is_used_on_cpu_and_left_untouched():
    model = CASES["seq2seq-dense"].model()
    resolve = model._resolve_decoding_compile_config
    given = CompileConfig(fullgraph=True, dynamic=None, mode="default")
    resolved = resolve(None, {"cache_implementation": "static", "compile_config": given})
    assert resolved == given and resolved._compile_all_devices and not given._compile_all_devices
    assert resolve(None, {}) is None
    assert resolve(None, {"cache_implementation": "static", "disable_compile": True}) is None
    assert resolve(None, {"cache_implementation": "static", "use_cache": False}) is None
    static_cache = EncoderDecoderCache(StaticCache(config=model.config, max_cache_len=8), DynamicCache())
    for name in CACHE_NAMES:  # the cache given to `generate` under its new or its old name
        assert resolve(None, {name: static_cache}) == compiled_generation_config("cpu")
    assert resolve(None, {"cache": EncoderDecoderCache(DynamicCache(), DynamicCache())}) is None
    with pytest.raises(TypeError, match="CompileConfig"):
        resolve(None, {"cache_implementation": "static", "compile_config": {"fullgraph": True}})


def test_compiled_generation_config():
    cpu = compiled_generation_config()
    assert (cpu.fullgraph, cpu.dynamic, cpu.mode) == (True, False, None)
    assert cpu.options == {"post_grad_custom_post_pass": row_matmul_pass(), "cpp_wrapper": True}
    assert cpu._compile_all_devices
    # transformers deep-copies the generation config and rebuilds its compiled function when the config differs.
    assert copy.deepcopy(cpu) == cpu == compiled_generation_config("cpu")
    assert compiled_generation_config("cuda").mode == "reduce-overhead"
    assert compiled_generation_config(dynamic=None).dynamic is None
    assert compiled_generation_config(options={}).options == {}


def test_decompose_row_matmuls_rewrites_one_row_products_only():
    from torch.fx.experimental.proxy_tensor import make_fx

    def products(row, rows, weight, bias):
        return torch.nn.functional.linear(row, weight, bias), rows @ weight.t(), row @ weight.t()

    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(1, 40, generator=g), torch.randn(3, 40, generator=g), torch.randn(300, 40, generator=g))
    inputs += (torch.randn(300, generator=g),)
    module = make_fx(products, tracing_mode="fake")(*inputs)
    matmuls = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    assert sum(node.target in matmuls for node in module.graph.nodes) == 3
    assert decompose_row_matmuls(module.graph) == 2  # the two one-row products; the 3-row one stays a GEMM
    module.recompile()
    assert sum(node.target in matmuls for node in module.graph.nodes) == 1
    for got, expected in zip(module(*inputs), products(*inputs)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_reorder_cache_in_place_keeps_the_static_buffers():
    """Beam search reorders a static cache's filled slots in place: the compiled step keeps reading the same buffers,
    with the rows a dynamic cache would have after its own reordering."""
    config = CASES["sparse-lm-dense"].config()
    static, dynamic = StaticCache(config=config, max_cache_len=6), DynamicCache(config=config)
    g = torch.Generator().manual_seed(0)
    for layer in range(config.num_hidden_layers):
        keys, values = torch.randn(3, 4, 2, 8, generator=g), torch.randn(3, 4, 2, 8, generator=g)
        static.update(keys, values, layer)
        dynamic.update(keys, values, layer)
    pointers = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in static.layers]
    beam_idx = torch.tensor([2, 0, 0])
    reorder_cache_in_place(static, beam_idx)
    reorder_cache_in_place(dynamic, beam_idx)
    assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in static.layers] == pointers
    for static_layer, dynamic_layer in zip(static.layers, dynamic.layers):
        torch.testing.assert_close(static_layer.keys[:, :, :2], dynamic_layer.keys, rtol=0, atol=0)
        torch.testing.assert_close(static_layer.values[:, :, :2], dynamic_layer.values, rtol=0, atol=0)
        assert not static_layer.keys[:, :, 2:].any()  # the empty slots were not touched


# ------------------------------------------------------------------------------------ inductor (the default config)


def _check_inductor(case_id: str, modes: tuple[str, ...], batch: int | None = None) -> None:
    case = CASES[case_id]
    model, prompt = case.model(), _prompt(case)
    if batch is not None:
        prompt = {name: value[:batch] for name, value in prompt.items()}
    for mode in modes:
        eager = _generate(model, prompt, mode)
        before = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"]
        compiled = _generate(model, prompt, mode, cache_implementation="static")
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0, msg=f"{case_id} {mode}")
        after = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"]
        assert after > before or mode == "sample", "no inductor graph was built"


def test_inductor_seq2seq_greedy_at_batch_one_and_beam_search():
    """Batch 1 greedy: every projection, the output layer included, is a one-row product (`row_matmul_pass`)."""
    _check_inductor("seq2seq-dense", ("greedy",), batch=1)
    _check_inductor("seq2seq-dense", ("beam",))


def test_inductor_sparse_lm_left_padded_greedy():
    _check_inductor("sparse-lm-fixed-heads", ("greedy",))


@pytest.mark.slow
@pytest.mark.parametrize("case_id", [case.id for case in GENERATIVE])
def test_inductor_every_family_and_mode(case_id):
    _check_inductor(case_id, ("greedy", "beam", "sample"))
