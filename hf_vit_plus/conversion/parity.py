"""How far a converted model's logits are from its source's: both models run on one seeded random input, in float32
and eval mode, and the largest absolute difference of their logits is the measure (`hf-vit-plus convert` logs it and
writes it into the converted checkpoint's model card).

The input is small on purpose (a batch of 2), so that the check costs one forward pass of each model."""

from __future__ import annotations

import torch
from torch import nn

PARITY_BATCH = 2
PARITY_SEQUENCE_LENGTH = 8
PARITY_SEED = 0


def _logits(output) -> torch.Tensor:
    """The logits of a model's output: a timm model returns the tensor itself, a transformers model a ModelOutput."""
    return output if isinstance(output, torch.Tensor) else output.logits


def _max_abs_difference(expected: torch.Tensor, got: torch.Tensor) -> float:
    if expected.shape != got.shape:
        raise ValueError(f"The logits have different shapes: {tuple(expected.shape)} and {tuple(got.shape)}.")
    return (expected.float() - got.float()).abs().max().item()


def image_logits_difference(source: nn.Module, converted: nn.Module, *, seed: int = PARITY_SEED) -> float:
    """Max |difference| of the logits of `source` (a timm or transformers ViT) and `converted` (its ViTPlus
    conversion) on a seeded random batch of `PARITY_BATCH` images of the converted config's size and channels.

    Both models are cast to float32 and set to eval mode in place: call it once the converted model is saved."""
    config = converted.config
    size = config.image_size
    height, width = (size, size) if isinstance(size, int) else size
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(PARITY_BATCH, config.num_channels, height, width, generator=generator)  # (B, C, H, W)
    source, converted = source.float().eval(), converted.float().eval()
    with torch.no_grad():
        return _max_abs_difference(_logits(source(pixels)), converted(pixel_values=pixels).logits)


def seq2seq_logits_difference(source: nn.Module, converted: nn.Module, *, seed: int = PARITY_SEED) -> float:
    """Max |difference| of the logits of `source` (a transformers encoder-decoder such as `MarianMTModel`) and
    `converted` (its Seq2seq Transformer conversion) on a seeded random batch of `PARITY_BATCH` source sequences and
    decoder inputs of `PARITY_SEQUENCE_LENGTH` tokens (the decoder inputs start with the decoder start token, where
    the config has one).

    Both models are cast to float32 and set to eval mode in place: call it once the converted model is saved."""
    config = converted.config
    generator = torch.Generator().manual_seed(seed)
    shape = (PARITY_BATCH, PARITY_SEQUENCE_LENGTH)
    input_ids = torch.randint(0, config.vocab_size, shape, generator=generator)  # (B, T)
    decoder_input_ids = torch.randint(0, config.vocab_size, shape, generator=generator)  # (B, T)
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.bos_token_id
    if start is not None:
        decoder_input_ids[:, 0] = start
    inputs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), decoder_input_ids=decoder_input_ids)
    source, converted = source.float().eval(), converted.float().eval()
    with torch.no_grad():
        return _max_abs_difference(source(**inputs).logits, converted(**inputs).logits)


__all__ = ["image_logits_difference", "seq2seq_logits_difference"]
