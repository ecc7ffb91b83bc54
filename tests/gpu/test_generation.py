"""Decoding on CUDA gives the tokens of eager decoding: `generate` on a static cache with its step compiled (CUDA
graphs: `compiled_generation_config("cuda")`, mode "reduce-overhead") and `FastDecoding` (each token one
AOTInductor-compiled graph), greedy and beam search, for every generative family.

The CPU cells run the same code with lighter compilation: the static-cache step traced by dynamo without inductor
(`backend="eager"`, `fullgraph=True`: a data-dependent branch still fails), FastDecoding's fused step uncompiled.
Inductor on the CPU is tests/models/test_compiled_decoding.py's and test_fast_decoding.py's.
"""

from __future__ import annotations

import pytest
import torch
from transformers import CompileConfig

from hf_vit_plus.generation import compiled_generation_config
from hf_vit_plus.models.fast_decoding import FastDecoding
from tests.gpu.common import DEVICES, FAMILY_CASES, case_ids, tiny_model
from tests.test_common import GENERATION_MODES, _prompt

pytestmark = pytest.mark.gpu

GENERATIVE = [case for case in FAMILY_CASES if case.generative]
SEQ2SEQ = [case for case in FAMILY_CASES if case.family == "seq2seq"]
MODES = ("greedy", "beam")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compile_config(device: str) -> CompileConfig:
    if device == "cuda":
        return compiled_generation_config("cuda")
    config = CompileConfig(backend="eager", fullgraph=True, dynamic=False, mode=None)
    config._compile_all_devices = True  # transformers compiles generate's step on GPUs only, unless told
    return config


def new_tokens(case, device: str) -> int:
    """8 tokens; an image model's whole image on CUDA, and its first row on the CPU (each token a traced step)."""
    if case.family != "image-lm":
        return 8
    return case.config().pixels_per_image if device == "cuda" else case.config().image_size[1]


def run(model, prompt: dict, mode: str, length: int, **extra) -> torch.Tensor:
    settings = dict(GENERATION_MODES[mode], max_new_tokens=length, min_new_tokens=length)
    with torch.no_grad():
        return model.generate(**prompt, **settings, **extra)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GENERATIVE, ids=case_ids(GENERATIVE))
def test_compiled_static_cache_gives_the_eager_tokens(case, device, mode):
    model = tiny_model(case, device).eval()
    prompt = {key: value.to(device) for key, value in _prompt(case).items()}
    length = new_tokens(case, device)
    eager = run(model, prompt, mode, length)
    compiled = run(model, prompt, mode, length, cache_implementation="static", compile_config=compile_config(device))
    assert eager.device.type == device and eager.shape[-1] >= length
    assert torch.equal(compiled, eager), (compiled, eager)
    again = run(model, prompt, mode, length, cache_implementation="static", compile_config=compile_config(device))
    assert torch.equal(again, eager)  # the second call replays the compiled step (CUDA graphs on CUDA)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SEQ2SEQ, ids=case_ids(SEQ2SEQ))
def test_fast_decoding_gives_the_eager_tokens(case, device, mode):
    model = tiny_model(case, device).eval()
    prompt = {key: value.to(device) for key, value in _prompt(case).items()}
    fast = FastDecoding(backend="aoti" if device == "cuda" else "eager")
    settings = {key: value for key, value in GENERATION_MODES[mode].items() if key != "do_sample"}
    with torch.no_grad():
        eager = model.generate(**prompt, **settings, max_new_tokens=10)
        out = model.generate(**prompt, **settings, max_new_tokens=10, custom_generate=fast)
    assert out.device.type == device
    assert out.shape == eager.shape and torch.equal(out, eager), (out, eager)
