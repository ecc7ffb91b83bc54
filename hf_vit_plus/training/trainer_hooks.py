"""transformers' `Trainer.evaluate()` reports the loss of the self-supervised heads on batches without `labels`.

The image Sparse Transformer (`SparseTransformerForImageGeneration`) computes its loss from `pixel_values` alone, and
masked patch prediction (`ViTPlusForMaskedImageModeling`) from `pixel_values` and `bool_masked_pos`. Trainer trains on
such batches, but its evaluation computes a loss only when every one of its `label_names` is in the batch, and those
default to the forward's parameters named like labels (`labels`): on a batch of images alone it silently reported no
`eval_loss`. transformers reads no model attribute for this decision, and hiding `labels` from the forward's signature
would make Trainer drop a user's `labels` column, so `install_trainer_loss_inputs(Trainer)` (see
`hf_vit_plus.integrations`: made when the Trainer is imported, undone by `disable_trainer_integration()`) wraps
`Trainer.prediction_step`: when `TrainingArguments.label_names` is unset, the batch lacks the default label names
and holds every one of the model's `loss_inputs` (a class attribute of the two heads), that batch is evaluated with
`loss_inputs` as its label names. The loss is then the model's own (`eval_loss`), and `compute_metrics` receives those
inputs as its `label_ids`. Batches with `labels`, explicit `label_names` and other models are evaluated as before.
Remote code used without the package needs `label_names=["pixel_values"]` (or `["pixel_values", "bool_masked_pos"]`)
instead.
"""

from __future__ import annotations

import functools
import sys

from .lora import is_peft_model


def loss_input_names(trainer, inputs) -> list[str] | None:
    """The label names to evaluate `inputs` with, when the Trainer's defaults find none there and the model computes
    its loss from inputs the batch holds; None otherwise."""
    if trainer.args.label_names is not None or not hasattr(inputs, "get"):
        return None
    if trainer.label_names and all(inputs.get(k) is not None for k in trainer.label_names):
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    if "peft" in sys.modules and is_peft_model(model):  # a model can be PEFT's only once peft is imported
        model = model.get_base_model()
    names = getattr(type(model), "loss_inputs", None)
    if not names or not all(inputs.get(k) is not None for k in names):
        return None
    return list(names)


def install_trainer_loss_inputs(trainer_class: type) -> None:
    """Make `trainer_class.prediction_step` evaluate this package's self-supervised heads on batches without `labels`
    (see the module docstring; idempotent).

    Args:
        trainer_class: transformers' `Trainer`.
    """
    original = trainer_class.prediction_step
    if getattr(original, "__wrapped_by_hf_vit_plus__", False):
        return

    @functools.wraps(original)
    def prediction_step(self, model, inputs, *args, **kwargs):
        names = loss_input_names(self, inputs)
        if names is None:
            return original(self, model, inputs, *args, **kwargs)
        default, self.label_names = self.label_names, names
        try:
            return original(self, model, inputs, *args, **kwargs)
        finally:
            self.label_names = default

    prediction_step.__wrapped_by_hf_vit_plus__ = True
    trainer_class.prediction_step = prediction_step
