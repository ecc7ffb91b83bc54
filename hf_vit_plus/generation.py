"""Generation helpers. `generate(..., cache_implementation="static")` of the seq2seq Transformer and the Sparse
Transformer LM runs a compiled decoding step on every device (see `hf_vit_plus.models.compiled_decoding`, where these
live so that a saved checkpoint ships them for `trust_remote_code`).

    from hf_vit_plus.generation import compiled_generation_config

    model.generate(**batch, cache_implementation="static")  # compiled with compiled_generation_config(model.device)
    model.generate(**batch, cache_implementation="static", compile_config=compiled_generation_config(dynamic=None))
    model.generate(**batch, cache_implementation="static", disable_compile=True)  # static cache, eager steps
"""

from __future__ import annotations

from .models.compiled_decoding import compiled_generation_config, decompose_row_matmuls, row_matmul_pass

__all__ = ["compiled_generation_config", "decompose_row_matmuls", "row_matmul_pass"]
