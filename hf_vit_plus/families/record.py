"""The record of a model family: everything the package needs to know about one family, in one place.

A `Family` is plain data (texts, defaults, names); it points to code by name only, as transformers' Auto mappings
name classes: its model, config and processor classes as "module:Class" in `hf_vit_plus.models` (imported the first
time a property such as `config_class` is read), how it trains in `hf_vit_plus.training.tasks` (`task`),
its graph layout in `hf_vit_plus.export` (`export`). So the records can be read by every layer (registration, the
command line's flags and help, the cards, export) without importing torch, the models, training or hub code:
`hf-vit-plus train --help` reads them and imports none of these.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..data.images import ImageDataset

# The package whose modules a record's class references ("configuration_vit_plus:ViTPlusConfig") name.
MODELS_PACKAGE = "hf_vit_plus.models"


def resolve_class(reference: str) -> type:
    """The class that `reference` ("module:Class", a module of `hf_vit_plus.models`) names; imports its module."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(f"{MODELS_PACKAGE}.{module}"), name)


def class_name(reference: str) -> str:
    """The class name in a "module:Class" reference, without importing anything."""
    return reference.partition(":")[2]


@dataclass(frozen=True)
class CardSpec:
    """What the model card of a family says about it (hf_vit_plus.hub.card).

    Attributes:
        template: the Jinja template, a file of hf_vit_plus/hub/templates/ (linked from model_cards/).
        pipeline_tag: the Hub task: the card's `pipeline_tag` and the model-index's task type.
        task_name: the task's name in the model-index.
        tags: the card's Hub tags, before those a caller adds.
        architecture: config fields in the card's architecture table; "num_labels" is read from id2label.
        aliases: other names the card functions accept for the family (their pre-0.3 names).
        architecture_when: (field, condition) pairs: an architecture field shown only where the condition field is
            set (true, non-zero), e.g. a part's settings only where the model has the part.
    """

    template: str
    pipeline_tag: str
    task_name: str
    tags: tuple[str, ...]
    architecture: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    architecture_when: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, eq=False)
class Family:
    """One model family: its model classes, how it is trained from the command line, its card and its export.

    Attributes:
        id: "vit": `hf-vit-plus train vit`, `TrainingArguments.family`, the card family.
        help: one line of `hf-vit-plus train --help`.
        model_type: the config's `model_type` (tests/test_families.py checks it against `config_class`).
        config: "module:Class" of the family's `PretrainedConfig` (`config_class`).
        models: Auto class name -> "module:Class" of a model class, registered with transformers
            (hf_vit_plus.registration). Families that share a config class (the Sparse Transformer's text and image
            models) register their heads as one tuple per Auto class: transformers takes the one the saved config's
            `architectures` names.
        head: the Auto class (a key of `models`) of the model that is trained, exported and pushed.
        card: what the model card says about the family.
        task: "module:Class" of how it trains (a `hf_vit_plus.training.tasks.TrainingTask`).
        data: "images" or "text": what the family reads (--train_dir or --train_file).
        builtin_data: what it trains on when no data option is given (for help texts).
        user_data: whether it reads the user's data (--dataset_name, --train_dir / --train_file).
        datasets: built-in data sets chosen with --dataset (name -> entry of `hf_vit_plus.data.images`); empty: no
            --dataset.
        flags: `TrainingArguments` fields that only this family's command line has.
        flag_help: help of flags whose meaning differs per family.
        training_defaults: `TrainingArguments` defaults of the family.
        lr_scheduler: what --lr_scheduler_type auto means.
        image_processor: "module:Class" registered with AutoImageProcessor.
        video_processor: "module:Class" registered with AutoVideoProcessor: its answer when one is asked for
            (ViTPlus: a class saying there is none).
        image_model: several families may share a model type (the Sparse Transformer's text and image models): True
            takes only the configs of image models (`image_size` set), False only the others; None every config of
            the model type.
        export: the ONNX graph layout (a key of `hf_vit_plus.export.EXPORTERS`); None: no export.
    """

    id: str
    help: str
    model_type: str
    config: str
    models: Mapping[str, str]
    head: str
    card: CardSpec
    task: str
    data: str
    builtin_data: str
    user_data: bool = True
    datasets: Mapping[str, ImageDataset] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    flag_help: Mapping[str, str] = field(default_factory=dict)
    training_defaults: Mapping[str, Any] = field(default_factory=dict)
    lr_scheduler: str = "cosine"
    image_processor: str | None = None
    video_processor: str | None = None
    image_model: bool | None = None
    export: str | None = None

    @property
    def config_class(self) -> type:
        """The family's `PretrainedConfig` class (imports its module)."""
        return resolve_class(self.config)

    @property
    def model_classes(self) -> dict[str, type]:
        """Auto class name -> model class (imports the modeling module)."""
        return {auto_name: resolve_class(reference) for auto_name, reference in self.models.items()}

    @property
    def head_class(self) -> type:
        """The head's model class, the one that is trained, exported and pushed (imports its module)."""
        return resolve_class(self.models[self.head])

    @property
    def head_class_name(self) -> str:
        """The head's class name (what a saved config's `architectures` lists), without importing it."""
        return class_name(self.models[self.head])

    @property
    def base_class(self) -> type:
        """The bare model (no head), `AutoModel`'s class."""
        return resolve_class(self.models["AutoModel"])

    @property
    def image_processor_class(self) -> type | None:
        """The image processor class (imports its module); None when the family has none."""
        return None if self.image_processor is None else resolve_class(self.image_processor)

    @property
    def video_processor_class(self) -> type | None:
        """The video processor class (imports its module); None when the family has none."""
        return None if self.video_processor is None else resolve_class(self.video_processor)

    @property
    def auto_head_class(self) -> type:
        """transformers' Auto class that loads the head, e.g. `AutoModelForImageClassification`."""
        import transformers

        return getattr(transformers, self.head)

    @property
    def processor_auto_class(self) -> str | None:
        """The Auto class that loads the processor saved with a checkpoint; None when the family has none."""
        if self.image_processor is not None:
            return "AutoImageProcessor"
        return "AutoTokenizer" if self.data == "text" else None

    def matches(self, config: Mapping[str, Any]) -> bool:
        """Whether a config (as a dict) is one of this family's models.

        Args:
            config: a model config as a dict (`PretrainedConfig.to_dict()` or a saved config.json).

        Returns:
            True when its `model_type` is the family's and, where the family says, it is (or is not) an image model.
        """
        if config.get("model_type") != self.model_type:
            return False
        return self.image_model is None or (config.get("image_size") is not None) == self.image_model


__all__ = ["MODELS_PACKAGE", "CardSpec", "Family", "class_name", "resolve_class"]
