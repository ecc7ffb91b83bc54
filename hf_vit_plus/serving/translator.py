"""Text in, text out with a saved seq2seq checkpoint (or its CTranslate2 export), on one of three engines chosen with
one switch: transformers' `generate`, `FastDecoding` (the fused step, `models/fast_decoding.py`) or CTranslate2
(`models/pipeline_text2text_generation.CTranslate2Generator`). `hf-vit-plus translate` is its command line."""

from __future__ import annotations

from pathlib import Path

import torch

from ..utils.logging import tqdm

TRANSLATION_ENGINES = ("generate", "fast", "ctranslate2")
# The paper's maximum output length: the source length + 50 (sec. 6.1), when no maximum is given.
EXTRA_TARGET_TOKENS = 50


class Translator:
    """Text in, text out, with a saved seq2seq checkpoint or its CTranslate2 export, on one of three engines.

    Keyword arguments of a call are `generate`'s; without `max_new_tokens` / `max_length` a batch gets its longest
    source + 50 new tokens, as in the paper.

    Example:
        ```python
        translator = Translator("outputs/translation/model")                        # model.generate
        translator = Translator("outputs/translation/model", engine="fast")         # FastDecoding, float32
        translator = Translator("outputs/translation/model", engine="fast", precision="int8")
        translator = Translator("outputs/translation/ct2", engine="ctranslate2", compute_type="int8")
        translator(["In the beginning God created the heaven and the earth."], num_beams=4)
        ```

    Args:
        location: a checkpoint folder or Hub id, or a folder written by `export_ctranslate2` (then the engine is
            "ctranslate2"; given a checkpoint, the "ctranslate2" engine converts it into a temporary folder first). An
            opus-mt folder (a `MarianMTModel`) runs on the "fast" engine converted exactly, once, on loading.
        engine: one of `TRANSLATION_ENGINES`: "generate" (`model.generate`), "fast" (FastDecoding) or "ctranslate2".
        precision: FastDecoding's (`hf_vit_plus.models.fast_kernels.PRECISIONS`).
        compute_type: CTranslate2's ("default": the type the folder was written in).
        threads: CTranslate2's intra-op threads (0: its default).

    Raises:
        ValueError: an unknown engine, or a CTranslate2 folder with another engine.
    """

    def __init__(
        self,
        location: str | Path,
        engine: str = "generate",
        precision: str = "float32",
        compute_type: str = "default",
        threads: int = 0,
    ):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        from ..models.pipeline_text2text_generation import CTranslate2Generator, is_ctranslate2_folder

        if engine not in TRANSLATION_ENGINES:
            raise ValueError(
                f"Unknown engine {engine!r}: expected one of {', '.join(map(repr, TRANSLATION_ENGINES))}."
            )
        self.engine = engine
        self.model = None
        self.decoder = None
        self._scratch = None
        self.tokenizer = AutoTokenizer.from_pretrained(location)
        if is_ctranslate2_folder(location):
            if engine != "ctranslate2":
                raise ValueError(f"{location} is a CTranslate2 export: it runs with engine='ctranslate2'.")
            self.decoder = CTranslate2Generator(location, compute_type=compute_type, intra_threads=threads)
            return
        self.model = AutoModelForSeq2SeqLM.from_pretrained(location).eval()
        if engine == "fast":
            from ..models.fast_decoding import FastDecoding, decodable_model

            self.decoder = FastDecoding(precision=precision)
            # an opus-mt folder (a MarianMTModel): converted once here, exactly, said in one log line
            self.model = decodable_model(self.model)
        elif engine == "ctranslate2":
            import tempfile

            self._scratch = tempfile.TemporaryDirectory(prefix="hf_vit_plus_ctranslate2_")
            from ..export import export_ctranslate2

            export_ctranslate2(self.model, self._scratch.name, tokenizer=self.tokenizer)
            self.decoder = CTranslate2Generator(self._scratch.name, compute_type=compute_type, intra_threads=threads)
            self.model = None

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **generate_kwargs):
        """Token ids -> output ids, as `model.generate` returns them, on this translator's engine.

        Args:
            input_ids: (batch, source) token ids.
            attention_mask: (batch, source), 1 for real tokens.
            **generate_kwargs: `generate`'s settings; without `max_new_tokens` / `max_length`, the longest source + 50.

        Returns:
            (batch, length) output ids, starting with the decoder start token.
        """
        if "max_new_tokens" not in generate_kwargs and "max_length" not in generate_kwargs:
            generate_kwargs["max_new_tokens"] = input_ids.shape[1] + EXTRA_TARGET_TOKENS
        if self.engine == "ctranslate2":
            return self.decoder.generate(input_ids, attention_mask=attention_mask, **generate_kwargs)
        if self.engine == "fast":
            generate_kwargs["custom_generate"] = self.decoder
        with torch.no_grad():
            return self.model.generate(input_ids, attention_mask=attention_mask, **generate_kwargs)

    def __call__(self, texts: str | list[str], batch_size: int = 16, **generate_kwargs) -> list[str]:
        """The translations of `texts` (`num_return_sequences` per text, in order), decoded without special
        tokens."""
        if isinstance(texts, str):
            texts = [texts]
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        outputs = []
        # a bar where there is more than one batch (a file of texts); switched off with disable_progress_bar()
        with tqdm(total=len(texts), desc="translating", unit="text", disable=len(texts) <= batch_size) as bar:
            for start in range(0, len(texts), batch_size):
                batch = self.tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True)
                ids = self.generate(batch["input_ids"], batch["attention_mask"], **generate_kwargs)
                outputs += [text.strip() for text in self.tokenizer.batch_decode(ids, skip_special_tokens=True)]
                bar.update(len(batch["input_ids"]))
        return outputs


__all__ = ["EXTRA_TARGET_TOKENS", "TRANSLATION_ENGINES", "Translator"]
