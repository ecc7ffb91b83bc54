"""The family records (`hf_vit_plus.families`) hold together: every name a record gives (its training task, its
export layout, its card template, its flags, help and defaults) names something that exists, and the rest of the
package lists exactly the registered families."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import transformers

from hf_vit_plus.families import FAMILIES, family_of_config, family_of_model, get_family
from hf_vit_plus.training.args import OWN, TrainingArguments, flag_fields
from hf_vit_plus.training.options import applies

IDS = list(FAMILIES)


@pytest.mark.parametrize("name", IDS)
def test_the_record_names_things_that_exist(name):
    from hf_vit_plus.export import EXPORTERS
    from hf_vit_plus.hub.card import TEMPLATES_DIR
    from hf_vit_plus.training.tasks import TrainingTask, get_task
    from tests.utils import REPO_ROOT

    family = get_family(name)
    assert family.id == name and family.data in ("images", "text")
    assert {"AutoModel", family.head} <= set(family.model_classes)
    # the record names its classes as "module:Class" (read without importing them): the names are the classes'
    assert family.model_type == family.config_class.model_type
    assert family.head_class_name == family.head_class.__name__
    if family.image_processor is not None:
        assert family.image_processor_class.__name__ == family.image_processor.partition(":")[2]
    for auto_name, model_class in family.model_classes.items():
        assert hasattr(transformers, auto_name) and model_class.config_class is family.config_class
    module, _, class_name = family.task.partition(":")
    task = getattr(importlib.import_module(module), class_name)
    assert issubclass(task, TrainingTask) and task.name == name
    assert type(get_task(name)) is task and get_task(name).model_class is family.head_class
    assert family.export is None or family.export in EXPORTERS
    assert (TEMPLATES_DIR / family.card.template).is_file()
    assert (REPO_ROOT / "model_cards" / family.card.template).read_text() == (
        TEMPLATES_DIR / family.card.template
    ).read_text()
    assert family.user_data or family.datasets, "a family trains on the user's data or on built-in data sets"


@pytest.mark.parametrize("name", IDS)
def test_flags_help_and_defaults_name_training_arguments(name):
    family = get_family(name)
    fields = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in fields.values() if f.metadata.get("families") == OWN}
    assert set(family.flags) <= own, "Family.flags names fields marked OWN in TrainingArguments"
    on_its_command_line = {f.name for f in flag_fields(name)}
    assert set(family.flag_help) <= on_its_command_line
    assert set(family.training_defaults) <= on_its_command_line
    assert all(applies(fields[flag], family) for flag in family.flags)


def test_every_family_is_a_train_sub_command_and_a_card_family():
    from hf_vit_plus.cli import build_parser
    from hf_vit_plus.hub.card import check_family
    from hf_vit_plus.training import FAMILIES as TRAINING_FAMILIES

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    assert list(train._subparsers._group_actions[0].choices) == IDS == list(TRAINING_FAMILIES)
    assert [check_family(name) for name in IDS] == IDS


@pytest.mark.parametrize("name", IDS)
def test_a_familys_models_and_configs_are_found_as_its_own(name):
    family = get_family(name)
    config = family.config_class.for_images(4, 4) if family.image_model else family.config_class()
    config.architectures = [family.head_class.__name__]  # as a saved model's config names its head
    assert family_of_config(config) is family and family_of_config(config.to_dict()) is family
    assert family_of_model(family.head_class(config)) is family
    assert family_of_config({"model_type": "bert"}) is None


def test_a_vit_config_is_the_classifiers_unless_it_names_the_masked_patch_head():
    """Two families share ViTPlusConfig: a fresh config (no architectures) is the classifier's, a config saved by
    masked patch prediction the "vit-mpp" family's (its card, its export: none)."""
    from hf_vit_plus import ViTPlusConfig

    assert family_of_config(ViTPlusConfig()).id == "vit"
    assert family_of_config(ViTPlusConfig(architectures=["ViTPlusForImageClassification"])).id == "vit"
    assert family_of_config(ViTPlusConfig(architectures=["ViTPlusForMaskedImageModeling"])).id == "vit-mpp"


def test_a_masked_patch_checkpoint_fine_tunes_as_a_classifier(tmp_path):
    """As transformers' ViTForMaskedImageModeling checkpoints load into ViTForImageClassification: the encoder is
    kept, the classifier is newly initialised (and transformers says so), the [mask] embedding and the colour head are
    left out."""
    import torch
    from transformers.testing_utils import CaptureLogger

    from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusForMaskedImageModeling

    torch.manual_seed(0)
    mpp = ViTPlusForMaskedImageModeling(
        ViTPlusConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
                      patch_size=4)
    )  # fmt: skip
    mpp.save_pretrained(tmp_path)
    assert transformers.AutoConfig.from_pretrained(tmp_path).architectures == ["ViTPlusForMaskedImageModeling"]
    loaded = transformers.AutoModelForMaskedImageModeling.from_pretrained(tmp_path)
    assert type(loaded) is ViTPlusForMaskedImageModeling
    with CaptureLogger(transformers.modeling_utils.logger) as captured:
        classifier = transformers.AutoModelForImageClassification.from_pretrained(tmp_path, num_labels=7)
    assert "newly initialized" in captured.out and "classifier.weight" in captured.out, captured.out
    assert "mpp_head" in captured.out  # the colour head is named as unused
    assert type(classifier) is ViTPlusForImageClassification and classifier.config.num_labels == 7
    backbone = {k: v for k, v in mpp.vit.state_dict().items() if "mask_token" not in k}
    assert backbone.keys() == classifier.vit.state_dict().keys()
    for name, value in backbone.items():
        torch.testing.assert_close(classifier.vit.state_dict()[name], value, msg=name)
    std = classifier.config.initializer_range
    assert 0.5 * std < classifier.classifier.weight.std().item() < 2 * std


def test_an_unknown_family_is_named():
    with pytest.raises(ValueError, match=r"Unknown family 'bert'; expected one of \['image-lm', 'seq2seq'"):
        get_family("bert")
