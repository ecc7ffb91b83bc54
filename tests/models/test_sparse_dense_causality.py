"""A dense Sparse Transformer is causal under every kernel: the eager reference (which `output_attentions=True`
selects, and which `hf-vit-plus explain` loads) used to receive no mask for a full sequence and attended to later
tokens, while sdpa applied `is_causal` itself."""

from __future__ import annotations

import pytest
import torch

from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM, SparseTransformerForImageGeneration


def _text_model(implementation: str) -> SparseTransformerForCausalLM:
    torch.manual_seed(0)
    config = SparseTransformerConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, attention_type="dense",
    )  # fmt: skip
    model = SparseTransformerForCausalLM(config).eval()
    model.set_attn_implementation(implementation)
    return model


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_dense_attention_is_causal_with_and_without_attention_weights(implementation):
    model = _text_model(implementation)
    ids = torch.randint(2, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[:, 8] = (changed[:, 8] - 2 + 1) % 48 + 2
    with torch.no_grad():
        plain = model(ids).logits
        weighted = model(ids, output_attentions=True)
        later = model(changed).logits
    torch.testing.assert_close(weighted.logits, plain)
    torch.testing.assert_close(later[:, :8], plain[:, :8])  # no position sees token 8 before it
    for layer in weighted.attentions:  # (B, H, T, T)
        assert not layer.triu(diagonal=1).any()
        torch.testing.assert_close(layer.sum(-1), torch.ones(layer.shape[:3]))
    reference = _text_model("sdpa")
    with torch.no_grad():
        torch.testing.assert_close(plain, reference(ids).logits)


def test_dense_image_model_attention_weights_are_causal():
    torch.manual_seed(0)
    config = SparseTransformerConfig.for_images(
        4, 3, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, attention_type="dense"
    )
    model = SparseTransformerForImageGeneration(config).eval()
    pixels = torch.randint(0, 256, (1, 4, 3), dtype=torch.uint8)
    with torch.no_grad():
        outputs = model(pixel_values=pixels, output_attentions=True)
        plain = model(pixel_values=pixels)
    torch.testing.assert_close(outputs.loss, plain.loss)
    assert all(not layer.triu(diagonal=1).any() for layer in outputs.attentions)
