"""Tools that recognise layers by exact type (dynamic quantization here; PEFT and exporters alike) see every linear
layer of each family: the model definitions use the standard `nn.Linear` / `nn.Conv2d`, no subclasses."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.ao.nn.quantized import dynamic as quantized_dynamic

from hf_vit_plus import (
    Seq2SeqTransformerConfig,
    Seq2SeqTransformerForConditionalGeneration,
    SparseTransformerConfig,
    SparseTransformerForCausalLM,
    ViTPlusConfig,
    ViTPlusForImageClassification,
)


def _vit():
    config = ViTPlusConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_labels=5,
        classifier_head="mlp_tanh",
    )
    model = ViTPlusForImageClassification(config)
    nn.init.normal_(model.classifier.weight, std=0.5)  # the paper's head is zero-initialised
    inputs = {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))}
    return model, inputs


def _seq2seq():
    config = Seq2SeqTransformerConfig(
        vocab_size=20,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        dropout=0.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    generator = torch.Generator().manual_seed(1)
    inputs = {
        "input_ids": torch.randint(3, 20, (2, 7), generator=generator),
        "decoder_input_ids": torch.randint(3, 20, (2, 6), generator=generator),
    }
    return Seq2SeqTransformerForConditionalGeneration(config), inputs


def _sparse_lm():
    config = SparseTransformerConfig(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        attention_type="fixed",
        sparse_stride=8,
        sparse_summary_size=2,
    )
    inputs = {"input_ids": torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))}
    return SparseTransformerForCausalLM(config), inputs


def _count(model: nn.Module, cls: type) -> int:
    return sum(type(module) is cls for module in model.modules())


@pytest.mark.parametrize("build", [_vit, _seq2seq, _sparse_lm], ids=["vit", "seq2seq", "sparse-lm"])
def test_quantize_dynamic_replaces_every_linear_layer(build):
    torch.manual_seed(0)
    model, inputs = build()
    model.eval()
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    assert linears, "the model has no linear layers"
    subclassed = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and type(m) is not nn.Linear]
    assert not subclassed, f"nn.Linear subclasses hide these layers from type-matching tools: {subclassed}"
    assert not [m for m in model.modules() if isinstance(m, nn.Conv2d) and type(m) is not nn.Conv2d]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)

    assert _count(quantized, nn.Linear) == 0
    assert _count(quantized, quantized_dynamic.Linear) == len(linears)
    with torch.no_grad():
        expected, got = model(**inputs).logits, quantized(**inputs).logits
    assert expected.abs().max() > 0.1
    # int8 weights: close to the float model, relative to the logits' scale
    assert (got - expected).abs().max() <= 0.05 * expected.abs().max()
