"""Settings of the GPU tests' session."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def room_for_compiled_graphs():
    """torch compiles a function at most `recompile_limit` (8) times and then runs it eagerly, silently: flex_attention
    (one compiled function for every sparse model) sees more shapes and masks than that in one session, and must stay
    compiled, which is what these tests check on CUDA."""
    config = torch._dynamo.config
    previous = config.recompile_limit
    config.recompile_limit = 64
    yield
    config.recompile_limit = previous
