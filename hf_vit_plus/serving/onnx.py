"""Decoding with the graphs `hf_vit_plus.export.export_onnx` writes, on onnxruntime, without a torch model:
`OnnxSeq2SeqGenerator` (encoder and decoder-step graphs) and `OnnxCausalLMGenerator` (the LM's one graph), each the
greedy tokens of `model.generate(num_beams=1, do_sample=False)`.

    from hf_vit_plus.serving import OnnxSeq2SeqGenerator

    generator = OnnxSeq2SeqGenerator("onnx/")
    tokens = generator.generate(input_ids, attention_mask, max_new_tokens=32)
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from ..export import DECODER_FILE, ENCODER_FILE, LM_FILE
from ..utils.extras import require


def _session(path: Path, threads: int | None):
    require("export", "Running the exported graphs", ("onnxruntime",))
    import onnxruntime

    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: export the model with export_onnx first.")
    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _numpy(x):
    return x.detach().cpu().numpy() if torch.is_tensor(x) else x


def _inputs(input_ids, attention_mask):
    """`generate`'s token ids and mask (all ones where None) as the int64 arrays the graphs take."""
    import numpy as np

    input_ids = _numpy(input_ids).astype(np.int64)
    return input_ids, np.ones_like(input_ids) if attention_mask is None else _numpy(attention_mask).astype(np.int64)


# What generate's greedy decoding may be asked that these loops do not implement (beyond `DecodingRules`)
_UNSUPPORTED = {
    "do_sample": lambda v: bool(v),
    "num_beams": lambda v: (v or 1) > 1,
    "num_return_sequences": lambda v: (v or 1) > 1,
    "repetition_penalty": lambda v: v not in (None, 1.0),
    "no_repeat_ngram_size": lambda v: bool(v),
    "suppress_tokens": lambda v: bool(v),
    "begin_suppress_tokens": lambda v: bool(v),
    "bad_words_ids": lambda v: any(len(s) != 1 for s in v or []),
}


def _default_settings(folder: Path, config):
    """The folder's generation_config.json (export_onnx writes it), else the model config's generation values."""
    from transformers import GenerationConfig

    if (folder / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(folder)
    return GenerationConfig.from_model_config(config)


def _greedy_rules(settings, kwargs: dict, start_length: int):
    """The decoding rules of `generate(**kwargs)` over `settings` (a `GenerationConfig`), refused in one line where
    they ask for more than greedy decoding with translation's logits processors."""
    import copy

    from ..models.decoding_rules import DecodingRules

    settings = copy.deepcopy(settings)
    # a greedy engine: a checkpoint's default beam search (the seq2seq family's 4 beams) is not asked for by the call
    settings.num_beams, settings.num_return_sequences = 1, 1
    unused = settings.update(**kwargs)
    if unused:
        raise ValueError(f"The onnxruntime decoders do not take {sorted(unused)}.")
    asked = [f"{n}={getattr(settings, n)!r}" for n, bad in _UNSUPPORTED.items() if bad(getattr(settings, n))]
    if asked:
        raise ValueError(
            f"The onnxruntime decoders run greedy decoding with single-token bad words only, not {', '.join(asked)}: "
            "use the model's generate for these."
        )
    return DecodingRules.from_generation_config(settings, start_length=start_length)


def _greedy_loop(step, first_tokens, num_layers, empty_cache, rules, start_length: int):
    """Greedy decoding by `generate`'s rules (`models/decoding_rules.py`): the logits processors, the end tokens, and
    the pad token for finished rows. step(tokens, past) -> (logits, present) as numpy arrays."""
    import numpy as np

    from ..models.decoding_rules import advance_greedy, process_scores

    tokens, past = first_tokens, [empty_cache] * (2 * num_layers)
    unfinished = torch.ones(first_tokens.shape[0], dtype=torch.long)
    pad = torch.tensor(rules.pad_token_id)
    controls, generated = None, []
    for length in range(start_length, rules.max_length):
        logits, past = step(tokens, past)
        scores = torch.from_numpy(np.ascontiguousarray(logits[:, -1])).float()
        if controls is None:
            controls = rules.controls(scores.shape[-1], "cpu")
        cur_len = torch.tensor(length)
        next_tokens = process_scores(scores, cur_len, controls).argmax(-1)
        next_tokens, unfinished, running = advance_greedy(next_tokens, cur_len, unfinished, pad, controls)
        tokens = next_tokens[:, None].numpy().astype(np.int64)
        generated.append(tokens)
        if not running:
            break
    return np.concatenate(generated, axis=1) if generated else np.zeros((first_tokens.shape[0], 0), dtype=np.int64)


class _OnnxGenerator:
    """What both generators do with an `export_onnx` folder: read its config and generation settings, and open
    onnxruntime sessions of its graphs (`graph_files`, in that order: `sessions`)."""

    # The exported model's config class, "module.Class" of hf_vit_plus.models: imported when a folder is opened
    config_class_name = ""
    graph_files: tuple[str, ...] = ()

    def __init__(self, folder: str | Path, threads: int | None = None):
        module, name = self.config_class_name.split(".")
        config_class = getattr(importlib.import_module(f"..models.{module}", __package__), name)
        folder = Path(folder)
        self.config = config_class.from_pretrained(folder)
        self.generation_config = _default_settings(folder, self.config)
        self.sessions = tuple(_session(folder / name, threads) for name in self.graph_files)


class OnnxSeq2SeqGenerator(_OnnxGenerator):
    """Greedy decoding with `encoder_model.onnx` and `decoder_model.onnx` of an `export_onnx` folder.

    It gives the tokens of `model.generate(num_beams=1, do_sample=False, ...)`, with generate's settings of lengths,
    end and pad tokens, single-token bad words and forced first and last tokens (`models/decoding_rules.py`); the
    defaults are the folder's generation_config.json. The graphs run on onnxruntime's CPU provider.

    Args:
        folder: the folder `export_onnx` wrote (config, generation config and graphs).
        threads: onnxruntime's intra-op threads; None or 0: its default.

    Raises:
        FileNotFoundError: a graph is missing from `folder`.
    """

    config_class_name = "configuration_seq2seq_transformer.Seq2SeqTransformerConfig"
    graph_files = (ENCODER_FILE, DECODER_FILE)

    def generate(self, input_ids, attention_mask=None, generation_config=None, **kwargs):
        """Greedy decoding of a batch of source sequences.

        Args:
            input_ids: (batch, source) token ids (a numpy array or a tensor).
            attention_mask: (batch, source), 1 for real tokens; None: all ones.
            generation_config: a `GenerationConfig`; None: the folder's.
            **kwargs: `generate`'s settings (`max_new_tokens`, `min_new_tokens`, `eos_token_id`, ...).

        Returns:
            (batch, 1 + new) int64 array: the decoder start token and the greedy tokens, padded after EOS.
        """
        import numpy as np

        config, (encoder, decoder) = self.config, self.sessions
        rules = _greedy_rules(generation_config or self.generation_config, kwargs, start_length=1)  # start token
        input_ids, mask = _inputs(input_ids, attention_mask)
        hidden, *cross = encoder.run(None, {"input_ids": input_ids, "attention_mask": mask})
        num_layers = config.decoder_layers
        heads = config.decoder_attention_heads
        empty = np.zeros((input_ids.shape[0], heads, 0, config.d_model // heads), dtype=hidden.dtype)
        names = {value.name for value in decoder.get_inputs()}

        def step(tokens, past):
            feed = {"decoder_input_ids": tokens, "encoder_hidden_states": hidden, "encoder_attention_mask": mask}
            for i in range(num_layers):
                feed[f"past_key.{i}"], feed[f"past_value.{i}"] = past[2 * i], past[2 * i + 1]
                feed[f"cross_key.{i}"], feed[f"cross_value.{i}"] = cross[2 * i], cross[2 * i + 1]
            logits, *present = decoder.run(None, {k: v for k, v in feed.items() if k in names})
            return logits, present

        start = np.full((input_ids.shape[0], 1), config.decoder_start_token_id, dtype=np.int64)
        new = _greedy_loop(step, start, num_layers, empty, rules, start_length=1)
        return np.concatenate([start, new], axis=1)


class OnnxCausalLMGenerator(_OnnxGenerator):
    """Greedy decoding with the `model.onnx` of an exported Sparse Transformer LM.

    It follows generate's rules as `OnnxSeq2SeqGenerator` does (lengths count the prompt).

    Args:
        folder: the folder `export_onnx` wrote (config, generation config and graph).
        threads: onnxruntime's intra-op threads; None or 0: its default.

    Raises:
        FileNotFoundError: the graph is missing from `folder`.
    """

    config_class_name = "configuration_sparse_transformer.SparseTransformerConfig"
    graph_files = (LM_FILE,)

    def generate(self, input_ids, attention_mask=None, generation_config=None, **kwargs):
        """Greedy continuation of a batch of prompts; left-padded prompts (with their mask) are supported.

        Args:
            input_ids: (batch, prompt) token ids (a numpy array or a tensor).
            attention_mask: (batch, prompt), 0 on left padding; None: all ones.
            generation_config: a `GenerationConfig`; None: the folder's.
            **kwargs: `generate`'s settings.

        Returns:
            (batch, prompt + new) int64 array.
        """
        import numpy as np

        config, (session,) = self.config, self.sessions
        input_ids, mask = _inputs(input_ids, attention_mask)
        rules = _greedy_rules(generation_config or self.generation_config, kwargs, start_length=input_ids.shape[1])
        heads = config.num_attention_heads
        empty = np.zeros((input_ids.shape[0], heads, 0, config.hidden_size // heads), dtype=np.float32)
        state = {"mask": mask}

        def step(tokens, past):
            feed = {"input_ids": tokens, "attention_mask": state["mask"]}
            for i in range(config.num_hidden_layers):
                feed[f"past_key.{i}"], feed[f"past_value.{i}"] = past[2 * i], past[2 * i + 1]
            logits, *present = session.run(None, feed)
            state["mask"] = np.concatenate([state["mask"], np.ones_like(state["mask"][:, :1])], axis=1)
            return logits, present

        new = _greedy_loop(step, input_ids, config.num_hidden_layers, empty, rules, start_length=input_ids.shape[1])
        return np.concatenate([input_ids, new], axis=1)


__all__ = ["OnnxCausalLMGenerator", "OnnxSeq2SeqGenerator"]
