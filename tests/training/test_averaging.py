"""Checkpoint averaging (Vaswani et al. 2017, sec. 6.1) on real saved folders of the seq2seq model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from hf_vit_plus import Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.training.averaging import (
    average_checkpoints,
    average_state_dicts,
    last_checkpoints,
    load_safetensors_state_dict,
)


def _tiny_model(seed: int) -> Seq2SeqTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    config = Seq2SeqTransformerConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    model = Seq2SeqTransformerForConditionalGeneration(config)
    with torch.no_grad():  # distinct weights per seed, not only distinct initialisations of LayerNorm etc.
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter))
    return model


def test_average_of_saved_checkpoints_is_the_mean_of_their_weights(tmp_path):
    models = [_tiny_model(seed) for seed in range(3)]
    for step, model in zip((100, 20, 300), models):  # steps out of name order: the order is by step
        model.save_pretrained(tmp_path / f"checkpoint-{step}")
    (tmp_path / "checkpoint-x").mkdir()  # not a checkpoint name: ignored
    assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["checkpoint-100", "checkpoint-300"]
    assert [p.name for p in last_checkpoints(tmp_path, 5)] == ["checkpoint-20", "checkpoint-100", "checkpoint-300"]

    averaged = average_checkpoints(_tiny_model(99), last_checkpoints(tmp_path, 3))
    expected = {
        name: torch.stack([dict(m.named_parameters())[name] for m in models]).mean(0)
        for name, _ in models[0].named_parameters()
    }
    for name, parameter in averaged.named_parameters():
        torch.testing.assert_close(parameter, expected[name], rtol=0, atol=1e-6, msg=name)
    # The tied output projection follows the averaged shared embedding.
    assert averaged.lm_head.weight.data_ptr() == averaged.model.shared.weight.data_ptr()
    src = torch.tensor([[5, 6, 7, 2]])
    logits = averaged(input_ids=src, decoder_input_ids=torch.tensor([[1, 5]])).logits
    assert torch.isfinite(logits).all()


def test_averaging_refuses_foreign_or_inconsistent_checkpoints(tmp_path):
    model = _tiny_model(0)
    model.save_pretrained(tmp_path / "checkpoint-1")
    save_file({"something.else": torch.zeros(3)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(ValueError, match="lacks"):
        average_checkpoints(_tiny_model(1), [tmp_path / "foreign.safetensors"])
    with pytest.raises(ValueError, match="other tensors"):
        average_state_dicts([{"a": torch.zeros(2)}, {"b": torch.zeros(2)}])
    with pytest.raises(ValueError, match=r"\(3,\)"):
        average_state_dicts([{"a": torch.zeros(3)}, {"a": torch.zeros(2)}])
    with pytest.raises(ValueError, match="no state dicts"):
        average_state_dicts([])
    (tmp_path / "pickled").mkdir()
    torch.save({"a": torch.zeros(1)}, tmp_path / "pickled" / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickled weights are not read"):
        load_safetensors_state_dict(tmp_path / "pickled")
    with pytest.raises(ValueError, match="only safetensors"):
        load_safetensors_state_dict(tmp_path / "pickled" / "pytorch_model.bin")
    with pytest.raises(ValueError, match="positive int"):
        last_checkpoints(tmp_path, 0)
    # A config with other sizes: the shapes differ, named in the error.
    other = Seq2SeqTransformerForConditionalGeneration(
        Seq2SeqTransformerConfig(**{**model.config.to_dict(), "d_model": 32, "encoder_ffn_dim": 32})
    )
    with pytest.raises(ValueError, match="shape"):
        average_checkpoints(other, [tmp_path / "checkpoint-1"])
