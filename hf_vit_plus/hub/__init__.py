"""Publishing checkpoints: model cards (`card`), training-curve figures (`figures`), Hub push (`push`) and the
`hf-vit-plus push` command (`cli`). Nothing in the model folder imports this package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

# public name -> the module that defines it, imported when the name is first used
_LAZY_NAMES = {
    "validate_card_metadata": ".card_metadata",
    "write_model_card": ".card",
    "plot_training_curves": ".figures",
    "HubPushError": ".push",
    "push_checkpoint": ".push",
}

if TYPE_CHECKING:
    from .card import write_model_card
    from .card_metadata import validate_card_metadata
    from .figures import plot_training_curves
    from .push import HubPushError, push_checkpoint

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY_NAMES)

__all__ = ["HubPushError", "plot_training_curves", "push_checkpoint", "validate_card_metadata", "write_model_card"]
