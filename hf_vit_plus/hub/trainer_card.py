"""transformers' `Trainer.push_to_hub()` with the family's model card, including the Trainer's evaluation results.

`Trainer.push_to_hub` saves the model, writes README.md with `Trainer.create_model_card` (transformers' training
summary: "More information needed", no family metadata) and uploads the output folder; no model-side hook takes part
in it. `install_trainer_card(Trainer)` (see `hf_vit_plus.integrations`: made when the Trainer is imported, and
undone by `disable_trainer_integration()`) wraps `Trainer.create_model_card`: transformers' card is written first, as
before, and, when the Trainer's model is one of this package's families (PEFT adapters excepted: their card is
PEFT's), it is replaced by the family's card (`write_model_card`) with:

- the last evaluation in `trainer.state.log_history` (`eval_*` numbers) in the results table and the model-index;
- the hyperparameters from `trainer.args`;
- the data set from `create_model_card`'s / `push_to_hub`'s `dataset` (or `dataset_tags`), else the evaluation
  (or training) data set's `info.dataset_name` (a `datasets.Dataset`). Without one the card has no model-index (it
  needs the data set), says that the training data and evaluation were not recorded, and a warning says to pass
  `trainer.push_to_hub(dataset="...")`.

Models of other libraries keep transformers' card unchanged.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from pathlib import Path

logger = logging.getLogger(__name__)

# The Trainer arguments the card's hyperparameter table shows.
TRAINER_CARD_FIELDS = (
    "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs", "max_steps",
    "weight_decay", "lr_scheduler_type", "warmup_steps", "label_smoothing_factor", "seed",
)  # fmt: skip


def install_trainer_card(trainer_class: type) -> None:
    """Make `trainer_class.create_model_card` (transformers' `Trainer`, whose `push_to_hub` calls it) write the
    family's card for this package's models (idempotent).

    Args:
        trainer_class: transformers' `Trainer`.
    """
    original = trainer_class.create_model_card
    if getattr(original, "__wrapped_by_hf_vit_plus__", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def create_model_card(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.is_world_process_zero():
            options = signature.bind(self, *args, **kwargs).arguments
            write_trainer_card(self, dataset=options.get("dataset") or options.get("dataset_tags"),
                               finetuned_from=options.get("finetuned_from"), license=options.get("license"),
                               language=options.get("language"))  # fmt: skip

    create_model_card.__wrapped_by_hf_vit_plus__ = True
    trainer_class.create_model_card = create_model_card


def _first(value) -> str | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, str) and value.strip() else None


def _dataset_name(trainer, dataset) -> str | None:
    name = _first(dataset)
    for data in (trainer.eval_dataset, trainer.train_dataset):
        info = getattr(data, "info", None)
        name = name or _first(getattr(info, "dataset_name", None))
    return name


def trainer_eval_results(log_history: list[dict]) -> dict[str, float]:
    """The `eval_*` numbers of the last evaluation in a Trainer's log history."""
    for entry in reversed(log_history):
        results = {k: v for k, v in entry.items() if k.startswith("eval_") and isinstance(v, int | float)}
        if results:
            return {k: v for k, v in results.items() if not isinstance(v, float) or math.isfinite(v)}
    return {}


def write_trainer_card(
    trainer, *, dataset=None, finetuned_from: str | None = None, license: str | None = None, language=None
) -> Path | None:
    """Write the family's card for `trainer`'s model into `trainer.args.output_dir/README.md` (see the module
    docstring); None, and nothing written, for a model of another library or a PEFT adapter."""
    from ..training.lora import is_peft_model
    from .card import family_of, model_card_from_config, write_model_card

    model = trainer.accelerator.unwrap_model(trainer.model)
    config = getattr(model, "config", None)
    if is_peft_model(model) or config is None or family_of(config) is None:
        return None
    output_dir = Path(trainer.args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    repo_id = getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id or output_dir.resolve().name
    language = [language] if isinstance(language, str) else language
    name = _dataset_name(trainer, dataset)
    if name is None:
        logger.warning(
            "The card of %s has no evaluation results: the data set is unknown. Pass "
            "trainer.push_to_hub(dataset='...') to put them in its model-index.",
            repo_id,
        )
        path = output_dir / "README.md"
        model_card_from_config(config, repo_id=repo_id, license=license or "apache-2.0", language=language).save(path)
        return path
    base = finetuned_from or getattr(model, "name_or_path", None)
    hyperparameters = {k: getattr(trainer.args, k) for k in TRAINER_CARD_FIELDS if getattr(trainer.args, k, None)}
    if hyperparameters.get("max_steps", 0) <= 0:
        hyperparameters.pop("max_steps", None)
    hyperparameters = {k: v if isinstance(v, int | float) else str(v) for k, v in hyperparameters.items()}
    return write_model_card(
        output_dir, family=family_of(config), model_config=config, training_args=hyperparameters,
        eval_results=trainer_eval_results(trainer.state.log_history), dataset_name=name,
        base_model=base if base and not Path(base).exists() else None, repo_id=repo_id,
        license=license or "apache-2.0", language=language,
    )  # fmt: skip
