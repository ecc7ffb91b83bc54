"""Publishing checkpoints: model cards (`card`), training-curve figures (`figures`), Hub push (`push`) and the
`hf-vit-plus push` command (`cli`). Nothing in the model folder imports this package."""

from .card import validate_card_metadata, write_model_card
from .figures import plot_training_curves
from .push import HubPushError, push_checkpoint

__all__ = ["HubPushError", "plot_training_curves", "push_checkpoint", "validate_card_metadata", "write_model_card"]
