"""Text in, text out with a saved seq2seq checkpoint (or its CTranslate2 export), on one of three engines chosen with
one switch: transformers' `generate`, `FastDecoding` (the fused step, `models/fast_decoding.py`) or CTranslate2
(`models/pipeline_text2text_generation.CTranslate2Generator`). `hf-vit-plus translate` is its command line."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from ..utils.logging import tqdm

TRANSLATION_ENGINES = ("generate", "fast", "ctranslate2")
# The paper's maximum output length: the source length + 50 (sec. 6.1), when no maximum is given.
EXTRA_TARGET_TOKENS = 50
# Sentences read ahead and sorted by length together, in batches: CTranslate2's `translate_iterable` reads 16 x its
# `max_batch_size` (a bound on memory and on the delay of the first translations).
BUFFER_BATCHES = 16


class Translator:
    """Text in, text out, with a saved seq2seq checkpoint or its CTranslate2 export, on one of three engines.

    Keyword arguments of a call are `generate`'s; without `max_new_tokens` / `max_length` a batch gets its longest
    source + 50 new tokens, as in the paper. A call sorts the texts by length into batches within a bounded buffer
    (`buffer_size`, default `BUFFER_BATCHES` x `batch_size`, as CTranslate2's `translate_iterable` reads ahead) and
    returns the translations in input order; `translate_iterable` does the same for the lines of a file, buffer by
    buffer.

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
        # FastDecoding: what `generate` hands its loop, per setting (`_fast_generate`)
        self._prepared: dict = {}
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
            return self._fast_generate(input_ids, attention_mask, generate_kwargs)
        with torch.no_grad():
            return self.model.generate(input_ids, attention_mask=attention_mask, **generate_kwargs)

    @torch.no_grad()
    def _fast_generate(self, input_ids, attention_mask, generate_kwargs: dict) -> torch.Tensor:
        """FastDecoding as `FastDecoding.generate` runs it (its encoder, then its loop through
        `generate(custom_generate=...)`), without `generate`'s preparation after the first call of each setting:
        what `generate` hands the loop (logits processors, stopping criteria, the resolved generation config)
        depends on the settings and the model's generation config only, not on the batch, so the loop's settings
        checked from it (`FastDecoding.checked_settings`) are kept, and the next calls run the loop itself
        (`FastDecoding.decode`) with the call's length limit, on the state checked here once per call. CTranslate2
        pays no such set-up per call."""
        decoder = self.decoder
        state = decoder.decoding_state(self.model)
        lengths = {
            name: generate_kwargs.pop(name) for name in ("max_new_tokens", "max_length") if name in generate_kwargs
        }
        key = (
            decoder,
            tuple(sorted((name, repr(value)) for name, value in generate_kwargs.items())),
            tuple(sorted((name, repr(value)) for name, value in vars(self.model.generation_config).items())),
        )
        if state.encoder is None:  # a sparse encoder: FastDecoding.generate runs the model's own
            return decoder.generate(self.model, input_ids, attention_mask=attention_mask, **generate_kwargs, **lengths)
        encoder_outputs = state.encode(input_ids, attention_mask)
        prepared = self._prepared.get(key)
        if prepared is None:
            handed = {}

            def capture(model, decoder_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
                        synced_gpus=False, **model_kwargs):  # fmt: skip
                handed.update(
                    settings=decoder.checked_settings(
                        model, decoder_ids, logits_processor, stopping_criteria, generation_config, model_kwargs
                    ),
                    rows=decoder_ids.shape[0] // input_ids.shape[0],
                    start=decoder_ids[:1],
                    synced_gpus=synced_gpus,
                )
                return decoder(model, decoder_ids, logits_processor, stopping_criteria, generation_config,
                               synced_gpus, **model_kwargs)  # fmt: skip

            output = self.model.generate(
                encoder_outputs=encoder_outputs,
                attention_mask=attention_mask,
                custom_generate=capture,
                use_cache=False,  # the loop keeps its own cache
                **generate_kwargs,
                **lengths,
            )
            if not handed["synced_gpus"]:
                self._prepared = {k: v for k, v in self._prepared.items() if k[0] is decoder}
                self._prepared[key] = handed
            return output
        # as generate resolves the length: the decoder start token + the new tokens, or max_length
        if "max_new_tokens" in lengths:
            max_length = prepared["start"].shape[1] + lengths["max_new_tokens"]
        else:
            max_length = lengths["max_length"]
        rows = prepared["rows"]
        states = encoder_outputs.last_hidden_state
        if rows > 1:  # generate's expansion of the inputs for the beams / returned sequences
            states = states.repeat_interleave(rows, dim=0)
            attention_mask = attention_mask.repeat_interleave(rows, dim=0)
        encoder_outputs.last_hidden_state = states
        start = prepared["start"].expand(input_ids.shape[0] * rows, -1)
        # the settings checked at the first call, with this call's length: the loop itself, as generate calls it
        settings = prepared["settings"].with_max_length(max_length)
        return decoder.decode(state, settings, start, encoder_outputs, attention_mask)

    def __call__(
        self, texts: str | list[str], batch_size: int = 16, buffer_size: int | None = None, **generate_kwargs
    ) -> list[str]:
        """The translations of `texts` (`num_return_sequences` per text), in the order of `texts`, decoded without
        special tokens.

        The texts are read `buffer_size` at a time (default `BUFFER_BATCHES` x `batch_size`, CTranslate2's read-ahead
        in `translate_iterable`); each buffer is tokenized once, sorted by source length and decoded in batches of at
        most `batch_size` sentences of near-equal length, so that a batch pads little; the translations come back
        in input order. `buffer_size=batch_size` batches in input order. A sentence gets the tokens it gets alone
        (where its translation ends within the batch's length limit: a `max_new_tokens` given, or by default the
        batch's longest source + 50).

        Args:
            texts: a text or a list of texts.
            batch_size: sentences decoded together (CTranslate2's `max_batch_size`).
            buffer_size: sentences sorted together, at least `batch_size`; it bounds the memory and the delay of the
                first translations (`translate_iterable` yields each buffer's as it is done).
            **generate_kwargs: `generate`'s settings (`num_beams`, `max_new_tokens`, ...).

        Returns:
            The translations, `num_return_sequences` per text, text by text.

        Raises:
            ValueError: a batch_size below 1, or a buffer_size below batch_size.
        """
        if isinstance(texts, str):
            texts = [texts]
        buffer_size = self._buffer_size(batch_size, buffer_size)
        # a bar where there is more than one batch (a file of texts); switched off with disable_progress_bar()
        with tqdm(total=len(texts), desc="translating", unit="text", disable=len(texts) <= batch_size) as bar:
            return list(self.translate_iterable(texts, batch_size, buffer_size, progress=bar, **generate_kwargs))

    @staticmethod
    def _buffer_size(batch_size: int, buffer_size: int | None) -> int:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
        if buffer_size is None:
            return BUFFER_BATCHES * batch_size
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < batch_size:
            raise ValueError(f"buffer_size must be an integer >= batch_size ({batch_size}), got {buffer_size!r}.")
        return buffer_size

    def translate_iterable(
        self,
        texts: Iterable[str],
        batch_size: int = 16,
        buffer_size: int | None = None,
        progress=None,
        **generate_kwargs,
    ) -> Iterator[str]:
        """`__call__` on an iterable (the lines of a file): the translations in input order, yielded buffer by
        buffer, so that at most `buffer_size` texts are held at once.

        Args:
            texts: the texts, read `buffer_size` at a time.
            batch_size: as in `__call__`.
            buffer_size: as in `__call__`.
            **generate_kwargs: as in `__call__`.
            progress: a tqdm bar updated with the texts translated (None: none).

        Yields:
            The translations, `num_return_sequences` per text, text by text.
        """
        buffer_size = self._buffer_size(batch_size, buffer_size)
        iterator = iter(texts)
        while buffer := list(itertools.islice(iterator, buffer_size)):
            yield from self._translate_buffer(buffer, batch_size, generate_kwargs, progress)

    def _translate_buffer(self, texts: list[str], batch_size: int, generate_kwargs: dict, progress) -> list[str]:
        """One buffer: tokenized once, sorted by length (stable: equal lengths keep their order), decoded in batches,
        put back in input order."""
        encoded = self._encode(texts)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        returned = generate_kwargs.get("num_return_sequences") or 1
        outputs: list[list[str]] = [[] for _ in texts]
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            input_ids, attention_mask = self._pad([encoded[i] for i in rows])
            ids = self.generate(input_ids, attention_mask, **dict(generate_kwargs))
            decoded = self._decode(ids)
            for k, i in enumerate(rows):
                outputs[i] = [text.strip() for text in decoded[k * returned : (k + 1) * returned]]
            if progress is not None:
                progress.update(len(rows))
        return [text for per_text in outputs for text in per_text]

    def _backend(self):
        """The tokenizer's Rust tokenizer where `tokenizer(texts)` and `batch_decode` are its `encode_batch` and
        `decode_batch` and nothing more (transformers' generic fast tokenizer, with no truncation or padding set and
        no clean-up of spaces), else None. CTranslate2 is handed tokens; a call here pays transformers' Python
        around the Rust calls per batch (several times the Rust calls' own time for a batch of short sentences)."""
        from transformers import PreTrainedTokenizerFast

        tokenizer = self.tokenizer
        if type(tokenizer) is not PreTrainedTokenizerFast:  # a subclass may change either way (source modes, ...)
            return None
        backend = tokenizer.backend_tokenizer
        if backend.truncation is not None or backend.padding is not None:
            return None
        if backend.encode_special_tokens != tokenizer.split_special_tokens:
            return None
        return backend

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """`tokenizer(texts)["input_ids"]`, by the Rust tokenizer alone where that is the same (`_backend`)."""
        backend = self._backend()
        if backend is None or not all(type(text) is str for text in texts):  # transformers' own checks and errors
            return self.tokenizer(texts)["input_ids"]
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # the same ids, without the offsets
        return [encoding.ids for encoding in encode(texts, add_special_tokens=True)]

    def _decode(self, ids: torch.Tensor) -> list[str]:
        """`tokenizer.batch_decode(ids, skip_special_tokens=True)`, by the Rust tokenizer alone where that is the
        same (`_backend`)."""
        backend = self._backend()
        if backend is None or self.tokenizer.clean_up_tokenization_spaces:
            return self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return backend.decode_batch(ids.tolist(), skip_special_tokens=True)

    def _pad(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, longest) ids and attention mask, padded on the tokenizer's side with its pad id, as
        `tokenizer(..., padding=True)` pads them: built as lists, then one tensor each."""
        longest = max(map(len, sequences))
        pad = self.tokenizer.pad_token_id
        pad = 0 if pad is None else pad
        left = self.tokenizer.padding_side == "left"
        rows, masks = [], []
        for ids in sequences:
            fill, real = longest - len(ids), len(ids)
            rows.append([pad] * fill + ids if left else ids + [pad] * fill)
            masks.append([0] * fill + [1] * real if left else [1] * real + [0] * fill)
        return torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.long)


__all__ = ["BUFFER_BATCHES", "EXTRA_TARGET_TOKENS", "TRANSLATION_ENGINES", "Translator"]
