"""The record of a model family: everything the package needs to know about one family, in one place.

A `Family` is plain data (classes, texts, defaults, names); it points to the code above it in the package by name
only (`trainer` names the training recipe in `hf_vit_plus.training.families`, `export` a graph layout of
`hf_vit_plus.export`), as transformers' Auto mappings name classes, so the records can be read by every layer
(registration, the training options, the cards, export) without importing training or hub code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import transformers

from ..data.images import ImageDataset


@dataclass(frozen=True)
class CardSpec:
    """What the model card of a family says about it (hf_vit_plus.hub.card)."""

    template: str  # the Jinja template, a file of hf_vit_plus/hub/templates/ (linked from model_cards/)
    pipeline_tag: str  # the Hub task: the card's `pipeline_tag` and the model-index's task type
    task_name: str  # the task's name in the model-index
    tags: tuple[str, ...]  # the card's Hub tags, before those a caller adds
    architecture: tuple[str, ...]  # config fields in the card's architecture table; "num_labels" is read from id2label
    aliases: tuple[str, ...] = ()  # other names the card functions accept for the family (release 0.1's)
    # (field, condition): an architecture field shown only where the condition field is set (true, non-zero), e.g. a
    # part's settings only where the model has the part
    architecture_when: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, eq=False)
class Family:
    """One model family: its model classes, how it is trained from the command line, its card and its export."""

    id: str  # "vit": `hf-vit-plus train vit`, `TrainingArguments.family`, the card family
    help: str  # one line of `hf-vit-plus train --help`
    config_class: type  # the family's `PretrainedConfig`
    # Auto class name -> model class: registered with transformers (hf_vit_plus.registration). Families that share a
    # config class (the Sparse Transformer's text and image models) register their heads as one tuple per Auto class:
    # transformers takes the one the saved config's `architectures` names.
    model_classes: Mapping[str, type]
    head: str  # the Auto class (a key of `model_classes`) of the model that is trained, exported and pushed
    card: CardSpec
    trainer: str  # "module:Class" of its training recipe (a `hf_vit_plus.training.families.TrainingFamily`)
    data: str  # "images" or "text": what the family reads (--train_dir or --train_file)
    builtin_data: str  # what it trains on when no data option is given (for help texts)
    user_data: bool = True  # reads the user's data (--dataset_name, --train_dir / --train_file)
    # built-in data sets chosen with --dataset (name -> entry of `hf_vit_plus.data.images`); empty: no --dataset
    datasets: Mapping[str, ImageDataset] = field(default_factory=dict)
    flags: tuple[str, ...] = ()  # `TrainingArguments` fields that only this family's command line has
    flag_help: Mapping[str, str] = field(default_factory=dict)  # help of flags whose meaning differs per family
    training_defaults: Mapping[str, Any] = field(default_factory=dict)  # `TrainingArguments` defaults of the family
    lr_scheduler: str = "cosine"  # what --lr_scheduler_type auto means
    image_processor_class: type | None = None  # registered with AutoImageProcessor
    # registered with AutoVideoProcessor: its answer when one is asked for (ViTPlus: a class saying there is none)
    video_processor_class: type | None = None
    # Several families may share a model type (the Sparse Transformer's text and image models): True takes only the
    # configs of image models (`image_size` set), False only the others; None every config of the model type.
    image_model: bool | None = None
    export: str | None = None  # the ONNX graph layout (a key of `hf_vit_plus.export.EXPORTERS`); None: no export

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def head_class(self) -> type:
        return self.model_classes[self.head]

    @property
    def base_class(self) -> type:
        """The bare model (no head), `AutoModel`'s class."""
        return self.model_classes["AutoModel"]

    @property
    def auto_head_class(self) -> type:
        """transformers' Auto class that loads the head, e.g. `AutoModelForImageClassification`."""
        return getattr(transformers, self.head)

    @property
    def processor_auto_class(self) -> str | None:
        """The Auto class that loads the processor saved with a checkpoint; None when the family has none."""
        if self.image_processor_class is not None:
            return "AutoImageProcessor"
        return "AutoTokenizer" if self.data == "text" else None

    def matches(self, config: Mapping[str, Any]) -> bool:
        """Whether a config (as a dict) is one of this family's models."""
        if config.get("model_type") != self.model_type:
            return False
        return self.image_model is None or (config.get("image_size") is not None) == self.image_model


__all__ = ["CardSpec", "Family"]
