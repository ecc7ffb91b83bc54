"""Model cards to the Hub's spec (issue 48): the scheduler the run used, readable model-index metric names and no
loss there, no local folder as base_model, no stray model_name key; each card checked offline against
huggingface_hub's own reading of the metadata (`validate_card_metadata`)."""

from __future__ import annotations

import pytest
from huggingface_hub import ModelCard

from hf_vit_plus.hub.card import (
    hub_base_model,
    load_card_metadata,
    metric_display_name,
    model_card_from_config,
    validate_card_metadata,
    write_model_card,
)
from tests.hub.test_model_card import CONFIGS, FAMILIES


def test_card_shows_the_scheduler_the_run_used_not_auto():
    """`--lr_scheduler_type auto` (every family's default) was written as `scheduler: auto`; the card now names the
    family's schedule, and a schedule given on the command line stays as given."""
    from hf_vit_plus.training.args import family_arguments
    from hf_vit_plus.training.families import get_family
    from hf_vit_plus.training.outputs import card_hyperparameters

    for name, expected in (("vit", "cosine"), ("seq2seq", "noam"), ("sparse-lm", "cosine"), ("image-lm", "cosine")):
        args = family_arguments(name, output_dir="unused", max_steps=3)
        assert args.lr_scheduler_type == "auto"
        assert card_hyperparameters(args, family=get_family(name))["scheduler"] == expected
    args = family_arguments("vit", output_dir="unused", max_steps=3, lr_scheduler_type="linear")
    assert card_hyperparameters(args, family=get_family("vit"))["scheduler"] == "linear"


@pytest.mark.parametrize(
    "metric, name",
    [("accuracy", "Accuracy"), ("exact_match", "Exact match"), ("bits_per_dim", "Bits per dim"),
     ("perplexity", "Perplexity"), ("bleu", "BLEU"), ("online_accuracy", "Online accuracy")],
)  # fmt: skip
def test_metric_names_are_readable(metric, name):
    assert metric_display_name(metric) == name


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_index_has_readable_names_and_no_loss(tmp_path, family):
    """The model-index named each metric by its key (`eval_accuracy`) and carried the loss; transformers' Trainer cards
    leave the loss out. It stays in the card's results table."""
    results = {"eval_loss": 0.9, "eval_exact_match": 0.25, "eval_perplexity": 2.5, "eval_runtime": 1.0}
    path = write_model_card(
        tmp_path, family=family, model_config=CONFIGS[family], training_args={}, eval_results=results,
        dataset_name="local-data", repo_id=f"test-org/{family}",
    )  # fmt: skip
    assert validate_card_metadata(path) == []
    [result] = load_card_metadata(path)["model-index"][0]["results"]
    assert [(m["type"], m["name"]) for m in result["metrics"]] == [
        ("exact_match", "Exact match"),
        ("perplexity", "Perplexity"),
    ]
    card = ModelCard.load(path)  # huggingface_hub's own reading of it
    assert [r.metric_name for r in card.data.eval_results] == ["Exact match", "Perplexity"]
    assert "| eval_loss | 0.9 | validation |" in path.read_text()


def test_a_loss_only_evaluation_gives_no_model_index(tmp_path):
    path = write_model_card(
        tmp_path, family="sparse-lm", model_config=CONFIGS["sparse-lm"], training_args={},
        eval_results={"eval_loss": 1.5}, dataset_name="austen", repo_id="test-org/lm",
    )  # fmt: skip
    meta = load_card_metadata(path)
    assert "model-index" not in meta and "model_name" not in meta and "metrics" not in meta
    assert validate_card_metadata(path) == []
    assert "| eval_loss | 1.5 | validation |" in path.read_text()


def test_a_local_folder_is_not_written_as_base_model(tmp_path):
    """Fine-tuning `--model_name_or_path outputs/demo` wrote its path as base_model, a broken link on the Hub; Hub ids
    stay."""
    local = tmp_path / "outputs" / "demo"
    local.mkdir(parents=True)
    assert hub_base_model("google/vit-base-patch16-224-in21k") == "google/vit-base-patch16-224-in21k"
    assert hub_base_model("gpt2") == "gpt2"
    for path in (str(local), str(local) + "-deleted", "./outputs/demo", "../demo", "~/models/demo", "C:\\models\\x"):
        assert hub_base_model(path) is None, path
    for base in (str(local), "./outputs/demo"):
        card = tmp_path / "card"
        card.mkdir(exist_ok=True)
        path = write_model_card(
            card, family="vit", model_config=CONFIGS["vit"], training_args={}, eval_results={"eval_accuracy": 0.5},
            dataset_name="sklearn-digits", base_model=base,
        )  # fmt: skip
        assert "base_model" not in load_card_metadata(path)
        assert "https://huggingface.co/" + base not in path.read_text()
        assert validate_card_metadata(path) == []
    path = write_model_card(
        card, family="vit", model_config=CONFIGS["vit"], training_args={}, eval_results={"eval_accuracy": 0.5},
        dataset_name="sklearn-digits", base_model="google/vit-base-patch16-224-in21k",
    )  # fmt: skip
    assert load_card_metadata(path)["base_model"] == "google/vit-base-patch16-224-in21k"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_card_from_config_has_no_stray_model_name(tmp_path, family):
    path = tmp_path / "README.md"
    model_card_from_config(CONFIGS[family], repo_id=f"test-org/{family}").save(path)
    assert "model_name" not in load_card_metadata(path)
    assert "model_name:" not in path.read_text()
    assert validate_card_metadata(path, require_datasets=False) == []


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"model_name": "x"}, "'model_name' outside a model-index"),
        ({"base_model": "/home/me/outputs/demo"}, "'base_model' '/home/me/outputs/demo' is not a Hub model id"),
        ({"base_model": "./outputs/demo"}, "is not a Hub model id (a local path)"),
    ],
)
def test_validation_catches_what_the_hub_refuses(tmp_path, extra, expected):
    path = tmp_path / "README.md"
    card = model_card_from_config(CONFIGS["vit"], repo_id="test-org/vit")
    for key, value in extra.items():
        setattr(card.data, key, value)
    card.save(path)
    problems = validate_card_metadata(path, require_datasets=False)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    "metric, expected",
    [
        ({"type": "loss", "value": 0.8, "name": "Loss"}, "is a loss"),
        ({"type": "accuracy", "value": 0.7, "name": "eval_accuracy"}, "is not a readable name"),
        ({"type": "exact_match", "value": 0.7}, "is not a readable name"),
    ],
)
def test_validation_catches_unreadable_or_loss_metrics(tmp_path, metric, expected):
    path = write_model_card(
        tmp_path, family="vit", model_config=CONFIGS["vit"], training_args={}, eval_results={"eval_accuracy": 0.5},
        dataset_name="sklearn-digits",
    )  # fmt: skip
    text = path.read_text()
    card = ModelCard(text)
    meta = card.data.to_dict()
    meta["model-index"][0]["results"][0]["metrics"].append(metric)
    import yaml

    body = text.split("---\n", 2)[2]
    path.write_text("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n" + body)
    problems = validate_card_metadata(path)
    assert any(expected in p for p in problems), problems
