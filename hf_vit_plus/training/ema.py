"""An exponential moving average of a model's weights (`--ema_decay`), as DeiT trains with timm's `ModelEma`: after
every optimiser update, ema = decay * ema + (1 - decay) * weights; buffers are copied. The loop evaluates the
average, saves it in each training state (resume is exact) and writes it as the final model."""

from __future__ import annotations

import copy

import torch


class ModelEma:
    """The average of `model`'s weights (a copy of it in eval mode, without gradients): `module`."""

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"The EMA decay must be in (0, 1), got {decay!r}.")
        self.decay = decay
        self.module = copy.deepcopy(model).eval()
        self.module.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """One step of the average towards `model`'s current weights (the model the copy was made of)."""
        for mine, theirs in zip(self.module.parameters(), model.parameters()):
            mine.lerp_(theirs.detach(), 1.0 - self.decay)
        for mine, theirs in zip(self.module.buffers(), model.buffers()):
            mine.copy_(theirs)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        """Put the averaged weights (and buffers) into `model`."""
        model.load_state_dict(self.module.state_dict())

    # what Accelerate's `register_for_checkpointing` saves and restores with each training state
    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state_dict)


__all__ = ["ModelEma"]
