"""Writing a model for other runtimes: ONNX through torch's exporter (`torch.onnx.export(..., dynamo=True)`, which
needs onnxscript) and CTranslate2 (`export_ctranslate2`, the seq2seq model). This module only writes files: what runs
them (`Translator`, the onnxruntime decoders) is `hf_vit_plus.serving`.

    from hf_vit_plus.export import export_onnx
    from hf_vit_plus.serving import OnnxSeq2SeqGenerator

    export_onnx(model, "onnx/")                      # the files depend on the family, see below
    generator = OnnxSeq2SeqGenerator("onnx/")        # onnxruntime; no torch model needed
    tokens = generator.generate(input_ids, attention_mask, max_new_tokens=32)   # = model.generate greedy

What is written (plus the model's config.json, and generation_config.json for the generative families):

- ViT classifier: `model.onnx`, `pixel_values` (batch, channels, image_size, image_size) -> `logits`. The image size
  is the config's (the position embeddings are not interpolated in the graph).
- seq2seq: `encoder_model.onnx`, `input_ids`, `attention_mask` (batch, source) -> `last_hidden_state` and, for each
  decoder layer i, the cross-attention keys and values `cross_key.{i}`, `cross_value.{i}` (batch, heads, source,
  head_dim), computed once per source as in `generate`. `decoder_model.onnx`, one decoding step:
  `decoder_input_ids` (batch, 1), `encoder_hidden_states` (only its shape is read), `encoder_attention_mask`,
  `past_key.{i}`, `past_value.{i}` (batch, heads, past, head_dim; past = 0 at the first step), `cross_key.{i}`,
  `cross_value.{i}` -> `logits` (batch, 1, vocab) and `present_key.{i}`, `present_value.{i}` (past + 1 positions).
- Sparse Transformer LM (dense or sparse): `model.onnx`, one graph for the prompt and the decoding steps:
  `input_ids` (batch, new), `attention_mask` (batch, past + new), `past_key.{i}`, `past_value.{i}` (past = 0 for the
  prompt) -> `logits` (batch, new, vocab), `present_key.{i}`, `present_value.{i}`.

Sparse attention is exported through the masked dense reference ("sparse_dense": the pattern as a boolean mask
built from the positions, exact, O(n^2) memory). The fast block-sparse CPU kernel is not exportable: it picks blocks
with Python loops over the sequence, which the exporter would freeze at the traced shape (a graph that only runs on
the example's batch and length), and the decoding step's gathered keys are read on the host.

The exporter is torch's dynamo-based one (`torch.export`, then onnxscript). The TorchScript exporter
(`dynamo=False`, deprecated since torch 2.9) handles the ViT but freezes every length the model code reads as a
Python number into a constant, and fails on the LM's cache path. Each export checks that the axes it declares
dynamic (batch, source length, cache length) stayed symbolic in the graph, and raises otherwise.

Models quantized with `hf_vit_plus.quantization` are refused: export the float model (onnxruntime's own
`onnxruntime.quantization.quantize_dynamic` quantizes an exported file).
"""

from __future__ import annotations

import contextvars
import logging
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from .families import FAMILIES, family_of_model
from .utils.extras import require
from .utils.logging import tqdm

logger = logging.getLogger(__name__)

VIT_FILE = "model.onnx"
ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"
LM_FILE = "model.onnx"

# Example lengths the graphs are traced at: neither 0 nor 1 (the exporter specialises those), and distinct, so that
# no two axes are unified by accident.
_EXAMPLE_BATCH, _EXAMPLE_SOURCE, _EXAMPLE_PAST, _EXAMPLE_NEW = 2, 5, 3, 2


def _require_onnx_exporter() -> None:
    require("export", "ONNX export", ("onnx", "onnxscript"))


def _graph_layout(model: nn.Module) -> str:
    """The ONNX graph layout of `model`'s family (`Family.export`, a key of `EXPORTERS`); a TypeError for a model that
    is no exportable family's head."""
    family = family_of_model(model)
    if family is None or family.export is None:
        heads = [f.head_class.__name__ for f in FAMILIES.values() if f.export is not None]
        raise TypeError(f"export_onnx takes a {', '.join(heads[:-1])} or {heads[-1]}, got {type(model).__name__}.")
    return family.export


def _has_sparse_attention(model: nn.Module) -> bool:
    return any(getattr(module, "sparse_pattern", None) is not None for module in model.modules())


@contextmanager
def _export_mode(model: nn.Module):
    """Eval mode and the exportable kernels for the duration of the export: sdpa for dense attention, the masked
    dense reference for sparse patterns (`select_attention_kernel` gives the dense layers sdpa then)."""
    was_training = model.training
    previous = model.config._attn_implementation
    model.eval()
    model.set_attn_implementation("sparse_dense" if _has_sparse_attention(model) else "sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
        model.train(was_training)


def _export(module: nn.Module, args: tuple, path: Path, input_names, output_names, dynamic_shapes, dynamic_inputs):
    """Export `module` to `path` and check that every axis named in `dynamic_inputs` ({input: {axis: name}})
    stayed symbolic: a model whose code turns a traced length into a Python int would otherwise give a graph that
    only runs at the example's shape."""
    import onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on axis names and deprecations
        program = torch.onnx.export(
            module,
            args,
            dynamo=True,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=dynamic_shapes,
            verbose=False,
        )
    graph_inputs = {value.name: value for value in program.model_proto.graph.input}
    for name, axes in dynamic_inputs.items():
        dims = graph_inputs[name].type.tensor_type.shape.dim
        for axis, axis_name in axes.items():
            if not dims[axis].dim_param:
                raise RuntimeError(
                    f"Exporting {path.name}: axis {axis} ({axis_name}) of input {name!r} was fixed to "
                    f"{dims[axis].dim_value} while tracing: the model code reads that length as a Python number. "
                    "The exported graph would only run at the example's shape."
                )
    program.save(str(path))
    onnx.checker.check_model(str(path))
    logger.info("wrote %s", path)
    bar = _EXPORT_BAR.get()
    if bar is not None:
        bar.update(1)
    return path


# ------------------------------------------------------------------------------------------------------ ViT
class _ViTLogits(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


def _export_vit(model: nn.Module, output_dir: Path) -> list[Path]:
    config = model.config
    pixel_values = torch.randn(_EXAMPLE_BATCH, config.num_channels, config.image_size, config.image_size)
    batch = torch.export.Dim("batch")
    path = _export(
        _ViTLogits(model).eval(),
        (pixel_values.to(model.dtype),),
        output_dir / VIT_FILE,
        ["pixel_values"],
        ["logits"],
        {"pixel_values": {0: batch}},
        {"pixel_values": {0: "batch"}},
    )
    return [path]


# -------------------------------------------------------------------------------------------------- seq2seq
class _Seq2SeqEncoder(nn.Module):
    """Source -> encoder output and every decoder layer's cross-attention keys and values (computed once)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden = self.model.get_encoder()(input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state
        batch_size, source_length, _ = hidden.shape
        outputs = [hidden]
        for layer in self.model.get_decoder().layers:
            attention = layer.encoder_attn  # its keys and values of the encoder output
            shape = (batch_size, source_length, attention.num_heads, attention.head_dim)
            for projection in (attention.k_proj, attention.v_proj):
                outputs.append(projection(hidden).view(shape).transpose(1, 2))  # (B, H, S, Dh)
        return tuple(outputs)


class _Seq2SeqDecoderStep(nn.Module):
    """One decoding step on top of the self-attention cache, with the cross-attention keys/values given."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.num_layers = model.config.decoder_layers

    def forward(self, decoder_input_ids, encoder_hidden_states, encoder_attention_mask, past):
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        self_cache, cross_cache = DynamicCache(), DynamicCache()
        for i in range(self.num_layers):
            past_key, past_value, cross_key, cross_value = past[4 * i : 4 * i + 4]
            self_cache.update(past_key, past_value, i)
            cross_cache.update(cross_key, cross_value, i)
        cache = EncoderDecoderCache(self_cache, cross_cache)
        for i in range(self.num_layers):
            cache.is_updated[i] = True  # the cross-attention reads the given keys/values
        logits = self.model(
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=encoder_attention_mask,
            decoder_input_ids=decoder_input_ids,
            cache=cache,
            use_cache=True,
            return_dict=True,
        ).logits
        present = []
        for i in range(self.num_layers):
            layer = cache.self_attention_cache.layers[i]
            present += [layer.keys, layer.values]
        return (logits, *present)


def _cache_names(prefix: str, num_layers: int, cross: bool = False) -> list[str]:
    names = []
    for i in range(num_layers):
        names += [f"{prefix}_key.{i}", f"{prefix}_value.{i}"]
        if cross:
            names += [f"cross_key.{i}", f"cross_value.{i}"]
    return names


def _export_seq2seq(model: nn.Module, output_dir: Path) -> list[Path]:
    config = model.config
    batch, source, past = torch.export.Dim("batch"), torch.export.Dim("source_length"), torch.export.Dim("past_length")
    num_layers, heads = config.decoder_layers, config.decoder_attention_heads
    head_dim = config.d_model // heads
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, config.vocab_size, (_EXAMPLE_BATCH, _EXAMPLE_SOURCE), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    cross_names = [name for i in range(num_layers) for name in (f"cross_key.{i}", f"cross_value.{i}")]
    encoder = _export(
        _Seq2SeqEncoder(model).eval(),
        (input_ids, attention_mask),
        output_dir / ENCODER_FILE,
        ["input_ids", "attention_mask"],
        ["last_hidden_state", *cross_names],
        {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}},
        {"input_ids": {0: "batch", 1: "source_length"}},
    )

    dtype = model.dtype

    def cache_tensor(length: int) -> torch.Tensor:
        return torch.randn(_EXAMPLE_BATCH, heads, length, head_dim, generator=generator).to(dtype)

    past_tensors, past_shapes = [], []
    for _ in range(num_layers):
        past_tensors += [cache_tensor(_EXAMPLE_PAST), cache_tensor(_EXAMPLE_PAST)]
        past_tensors += [cache_tensor(_EXAMPLE_SOURCE), cache_tensor(_EXAMPLE_SOURCE)]
        past_shapes += [{0: batch, 2: past}, {0: batch, 2: past}, {0: batch, 2: source}, {0: batch, 2: source}]
    decoder_input_ids = torch.full((_EXAMPLE_BATCH, 1), config.decoder_start_token_id or 0, dtype=torch.long)
    encoder_hidden_states = torch.randn(_EXAMPLE_BATCH, _EXAMPLE_SOURCE, config.d_model, generator=generator)
    input_names = ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"]
    input_names += _cache_names("past", num_layers, cross=True)
    decoder = _export(
        _Seq2SeqDecoderStep(model).eval(),
        (decoder_input_ids, encoder_hidden_states.to(dtype), attention_mask, tuple(past_tensors)),
        output_dir / DECODER_FILE,
        input_names,
        ["logits", *_cache_names("present", num_layers)],
        ({0: batch}, {0: batch, 1: source}, {0: batch, 1: source}, tuple(past_shapes)),
        {"past_key.0": {0: "batch", 2: "past_length"}, "encoder_attention_mask": {1: "source_length"}},
    )
    return [encoder, decoder]


# ----------------------------------------------------------------------------------------------- causal LM
class _CausalLMStep(nn.Module):
    """Prompt or decoding step of the causal LM on top of a (possibly empty) cache."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.num_layers = model.config.num_hidden_layers

    def forward(self, input_ids, attention_mask, past):
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
        for i in range(self.num_layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        logits = self.model(
            input_ids=input_ids, attention_mask=attention_mask, cache=cache, use_cache=True, return_dict=True
        ).logits
        present = []
        for i in range(self.num_layers):
            present += [cache.layers[i].keys, cache.layers[i].values]
        return (logits, *present)


def _export_causal_lm(model: nn.Module, output_dir: Path) -> list[Path]:
    config = model.config
    num_layers, heads = config.num_hidden_layers, config.num_attention_heads
    head_dim = config.hidden_size // heads
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, config.vocab_size, (_EXAMPLE_BATCH, _EXAMPLE_NEW), generator=generator)
    attention_mask = torch.ones(_EXAMPLE_BATCH, _EXAMPLE_PAST + _EXAMPLE_NEW, dtype=torch.long)
    past_tensors = [
        torch.randn(_EXAMPLE_BATCH, heads, _EXAMPLE_PAST, head_dim, generator=generator).to(model.dtype)
        for _ in range(2 * num_layers)
    ]
    # Dim.DYNAMIC, not named dims: the traced code branches on "one new token" and "an empty cache" (the sparse
    # decoding step, the uncached kernels); at the example's lengths it takes the masked reference path, exact for
    # any length, and the graph keeps the axes symbolic.
    dynamic = torch.export.Dim.DYNAMIC
    cache_shape = {0: dynamic, 2: dynamic}
    path = _export(
        _CausalLMStep(model).eval(),
        (input_ids, attention_mask, tuple(past_tensors)),
        output_dir / LM_FILE,
        ["input_ids", "attention_mask", *_cache_names("past", num_layers)],
        ["logits", *_cache_names("present", num_layers)],
        ({0: dynamic, 1: dynamic}, {0: dynamic, 1: dynamic}, tuple(cache_shape for _ in past_tensors)),
        {"input_ids": {0: "batch", 1: "new_tokens"}, "past_key.0": {2: "past_length"}},
    )
    return [path]


# The graph layouts a family's record can name (`Family.export`): an image classifier, an encoder-decoder with its
# cross-attention and self-attention caches, a causal LM with its cache.
EXPORTERS = {"image-classifier": _export_vit, "encoder-decoder": _export_seq2seq, "causal-lm": _export_causal_lm}
# the graphs each layout writes (the progress bar's total)
GRAPH_FILES = {
    "image-classifier": (VIT_FILE,),
    "encoder-decoder": (ENCODER_FILE, DECODER_FILE),
    "causal-lm": (LM_FILE,),
}
# the bar of the export under way, which `_export` advances
_EXPORT_BAR: contextvars.ContextVar = contextvars.ContextVar("hf_vit_plus_export_bar", default=None)


# ---------------------------------------------------------------------------------------------------- API
def export_onnx(model: nn.Module, output_dir: str | Path) -> list[Path]:
    """Export `model` (the head of a family with an export in `hf_vit_plus.families`: ViTPlusForImageClassification,
    Seq2SeqTransformerForConditionalGeneration, SparseTransformerForCausalLM or SparseTransformerForImageGeneration)
    to ONNX files in `output_dir`, with its config (and generation config); returns the paths of the .onnx files. The
    model is left as it was (mode and attention kernel restored)."""
    layout = _graph_layout(model)
    from .quantization import is_quantized_weight

    quantized = [name for name, p in model.named_parameters() if is_quantized_weight(p)]
    if quantized:
        raise ValueError(
            f"The model holds torchao-quantized weights (e.g. {quantized[0]!r}), which the ONNX exporter cannot "
            "translate: export the float model (onnxruntime.quantization.quantize_dynamic quantizes the .onnx file)."
        )
    _require_onnx_exporter()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    graphs = len(GRAPH_FILES[layout])
    with torch.no_grad(), _export_mode(model), tqdm(total=graphs, desc="exporting to ONNX", unit="graph") as bar:
        token = _EXPORT_BAR.set(bar)  # `_export` counts the graphs written
        try:
            paths = EXPORTERS[layout](model, output_dir)
        finally:
            _EXPORT_BAR.reset(token)
    model.config.save_pretrained(output_dir)
    if model.can_generate() and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(output_dir)
    return paths


# ------------------------------------------------------------------------------------------------ CTranslate2
CTRANSLATE2_QUANTIZATIONS = ("int8", "int8_float32", "bfloat16")
# Our `activation_function` names -> CTranslate2's activations (`ctranslate2.specs.common_spec.Activation`).
_CTRANSLATE2_ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "gelu_new": "GELUTanh",
    "gelu_pytorch_tanh": "GELUTanh",
    "swish": "SWISH",
    "silu": "SWISH",
}


def _placeholder_token(token_id: int) -> str:
    """The token string of an id without a tokenizer (CTranslate2 translates token strings)."""
    return f"<id:{token_id}>"


def ctranslate2_vocabulary(model: nn.Module, tokenizer=None) -> list[str]:
    """The token strings of ids 0 .. vocab_size - 1 in `tokenizer`'s vocabulary (ids it lacks, e.g. a vocabulary
    padded to a multiple, get placeholders), or placeholders `<id:N>` for every id without a tokenizer."""
    vocab_size = model.config.vocab_size
    tokens = [_placeholder_token(i) for i in range(vocab_size)]
    if tokenizer is not None:
        for token, token_id in tokenizer.get_vocab().items():
            if token_id >= vocab_size:
                raise ValueError(
                    f"The tokenizer has id {token_id} ({token!r}) but the model's vocabulary has {vocab_size} ids: "
                    "they do not belong together."
                )
            tokens[token_id] = token
    if len(set(tokens)) != len(tokens):
        raise ValueError("The tokenizer's vocabulary spells two ids the same: CTranslate2 needs unique token strings.")
    return tokens


def _check_ctranslate2_model(model: nn.Module) -> None:
    from .models.modeling_seq2seq_transformer import Seq2SeqTransformerForConditionalGeneration
    from .quantization import is_quantized_weight

    if not isinstance(model, Seq2SeqTransformerForConditionalGeneration):
        raise TypeError(
            f"export_ctranslate2 takes a Seq2SeqTransformerForConditionalGeneration, got {type(model).__name__}."
        )
    config = model.config
    if config.encoder_attention_type != "dense":
        raise ValueError(
            f"This checkpoint's encoder uses sparse attention (encoder_attention_type="
            f"{config.encoder_attention_type!r}), and CTranslate2 has no sparse attention: it would compute a "
            "different model. Export a dense-encoder checkpoint, or serve this one with hf_vit_plus (FastDecoding)."
        )
    if config.activation_function not in _CTRANSLATE2_ACTIVATIONS:
        raise ValueError(
            f"activation_function={config.activation_function!r} has no CTranslate2 equivalent; supported: "
            f"{', '.join(sorted(_CTRANSLATE2_ACTIVATIONS))}."
        )
    quantized = [name for name, p in model.named_parameters() if is_quantized_weight(p)]
    if quantized:
        raise ValueError(
            f"The model holds torchao-quantized weights (e.g. {quantized[0]!r}): export the float model and choose "
            "CTranslate2's own quantization (quantization='int8', ...)."
        )


def _ctranslate2_spec(model: nn.Module, tokens: list[str]):
    """The CTranslate2 `TransformerSpec` of `model`, filled with its weights (float32), as its converters build it
    for BART/Marian: fused self-attention Q/K/V and cross-attention K/V, the stored sinusoid tables, the embedding
    scale, pre- or post-norm, the output bias (Marian's `final_logits_bias`)."""
    from ctranslate2.converters.utils import fuse_linear
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    activation = getattr(common_spec.Activation, _CTRANSLATE2_ACTIVATIONS[config.activation_function])

    def tensor(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", torch.float32).contiguous()

    def set_linear(spec, linear: nn.Linear) -> None:
        spec.weight = tensor(linear.weight)
        if linear.bias is not None:
            spec.bias = tensor(linear.bias)

    def set_layer_norm(spec, norm: nn.LayerNorm) -> None:
        spec.gamma, spec.beta = tensor(norm.weight), tensor(norm.bias)

    def set_attention(spec, attention, self_attention: bool) -> None:
        parts = [common_spec.LinearSpec() for _ in range(3)]
        for part, linear in zip(parts, (attention.q_proj, attention.k_proj, attention.v_proj)):
            set_linear(part, linear)
        if self_attention:
            fuse_linear(spec.linear[0], parts)
        else:
            fuse_linear(spec.linear[0], parts[:1])
            fuse_linear(spec.linear[1], parts[1:])
        set_linear(spec.linear[-1], attention.o_proj)

    def set_stack(spec, stack) -> None:
        spec.scale_embeddings = float(stack.embed_scale)
        spec.position_encodings.encodings = tensor(stack.embed_positions)
        embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
        embeddings.weight = tensor(stack.embed_tokens.weight)
        if stack.layer_norm is not None:
            set_layer_norm(spec.layer_norm, stack.layer_norm)
        for layer_spec, layer in zip(spec.layer, stack.layers):
            set_attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
            set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
            if stack.is_decoder:
                set_attention(layer_spec.attention, layer.encoder_attn, self_attention=False)
                set_layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
            set_linear(layer_spec.ffn.linear_0, layer.fc1)
            set_linear(layer_spec.ffn.linear_1, layer.fc2)
            set_layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)

    pre_norm = bool(config.normalize_before)
    encoder = transformer_spec.TransformerEncoderSpec(
        config.encoder_layers, config.encoder_attention_heads, pre_norm=pre_norm, activation=activation
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers, config.decoder_attention_heads, pre_norm=pre_norm, activation=activation
    )
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    set_stack(spec.encoder, model.get_encoder())
    set_stack(spec.decoder, model.get_decoder())
    set_linear(spec.decoder.projection, model.get_output_embeddings())
    if getattr(model, "final_logits_bias", None) is not None:
        spec.decoder.projection.bias = tensor(model.final_logits_bias[0])

    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, (list, tuple)) else config.eos_token_id
    start = config.decoder_start_token_id
    if eos is None or start is None:
        raise ValueError("A CTranslate2 model needs the config's eos_token_id and decoder_start_token_id.")
    unk = "<unk>" if "<unk>" in tokens else tokens[config.pad_token_id if config.pad_token_id is not None else 0]
    spec.config.unk_token = unk
    spec.config.eos_token = tokens[eos]
    spec.config.bos_token = tokens[config.bos_token_id if config.bos_token_id is not None else start]
    spec.config.decoder_start_token = tokens[start]
    spec.config.layer_norm_epsilon = float(config.layer_norm_eps)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    return spec


def export_ctranslate2(
    model: nn.Module, output_dir: str | Path, tokenizer=None, quantization: str | None = None
) -> Path:
    """Write `model` (a dense-encoder `Seq2SeqTransformerForConditionalGeneration`) as a CTranslate2 model in
    `output_dir`, with CTranslate2's own converter API (`ctranslate2.converters.Converter` on a `TransformerSpec`),
    then its tokenizer files and generation config next to it. quantization: None (float32 weights), "int8",
    "int8_float32" or "bfloat16" (the weights as stored; `ctranslate2.Translator(compute_type=...)` can still pick
    another type at load). Without a tokenizer the tokens are placeholders `<id:N>` (translate ids, not text).

    Sparse-encoder checkpoints are refused: CTranslate2 has no sparse attention. Files of the same names in
    `output_dir` are replaced; other files are left alone. Returns `output_dir`."""
    require("export", "CTranslate2 export", ("ctranslate2",))
    import ctranslate2

    if quantization is not None and quantization not in CTRANSLATE2_QUANTIZATIONS:
        raise ValueError(
            f"Unknown CTranslate2 quantization {quantization!r}: expected None (float32) or one of "
            f"{', '.join(map(repr, CTRANSLATE2_QUANTIZATIONS))}."
        )
    _check_ctranslate2_model(model)
    tokens = ctranslate2_vocabulary(model, tokenizer)
    bar = tqdm(total=2, desc="exporting to CTranslate2", unit="step")  # the weights' spec, then the converted files
    with torch.no_grad():
        spec = _ctranslate2_spec(model, tokens)
    bar.update(1)

    class _Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    import shutil
    import tempfile

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # The converter replaces a whole folder: convert into a fresh one, then move the files.
    with tempfile.TemporaryDirectory(dir=output_dir.parent, prefix=f".{output_dir.name}.") as scratch:
        converted = Path(scratch) / "model"
        _Converter().convert(str(converted), quantization=quantization)
        for path in converted.iterdir():
            target = output_dir / path.name
            if target.is_dir():
                shutil.rmtree(target)
            shutil.move(str(path), str(target))
    bar.update(1)
    bar.close()
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(output_dir)
    logger.info("wrote a CTranslate2 model (%s) to %s", quantization or "float32", output_dir)
    return output_dir


# The decoders and the translator live in `hf_vit_plus.serving` (this module only writes files); their old names here
# still resolve, imported when first used.
_SERVING_NAMES = {
    "EXTRA_TARGET_TOKENS": "translator",
    "TRANSLATION_ENGINES": "translator",
    "Translator": "translator",
    "OnnxCausalLMGenerator": "onnx",
    "OnnxSeq2SeqGenerator": "onnx",
}


def __getattr__(name: str):
    if name in _SERVING_NAMES:
        import importlib

        return getattr(importlib.import_module(f".serving.{_SERVING_NAMES[name]}", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CTRANSLATE2_QUANTIZATIONS",
    "ctranslate2_vocabulary",
    "export_ctranslate2",
    "export_onnx",
]
