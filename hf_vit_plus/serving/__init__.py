"""Running saved models outside transformers' own loop: `Translator` (text in and out, one switch between
`generate`, `FastDecoding` and CTranslate2) and the onnxruntime decoders of exported graphs (`OnnxSeq2SeqGenerator`,
`OnnxCausalLMGenerator`). The files they read are written by `hf_vit_plus.export`; nothing in `models/` imports this
package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

# public name -> the module that defines it, imported when the name is first used
_LAZY_NAMES = {
    "BUFFER_BATCHES": ".translator",
    "EXTRA_TARGET_TOKENS": ".translator",
    "TRANSLATION_ENGINES": ".translator",
    "Translator": ".translator",
    "OnnxCausalLMGenerator": ".onnx",
    "OnnxSeq2SeqGenerator": ".onnx",
}

if TYPE_CHECKING:
    from .onnx import OnnxCausalLMGenerator, OnnxSeq2SeqGenerator
    from .translator import BUFFER_BATCHES, EXTRA_TARGET_TOKENS, TRANSLATION_ENGINES, Translator

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY_NAMES)

__all__ = [
    "BUFFER_BATCHES",
    "EXTRA_TARGET_TOKENS",
    "TRANSLATION_ENGINES",
    "OnnxCausalLMGenerator",
    "OnnxSeq2SeqGenerator",
    "Translator",
]
