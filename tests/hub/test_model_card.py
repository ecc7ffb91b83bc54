"""Model cards: metadata, model-index, figures, citations, offline validation; training-curve figures."""

from __future__ import annotations

import math
import shutil

import pytest
import yaml
from huggingface_hub import ModelCard

from hf_vit_plus import ViTPlusConfig
from hf_vit_plus.hub.card import (
    TEMPLATES_DIR,
    family_of,
    load_card_metadata,
    model_card_from_config,
    validate_card_metadata,
    write_model_card,
)
from hf_vit_plus.hub.figures import plot_training_curves
from tests.utils import REPO_ROOT

LOG_HISTORY = [
    {"loss": 2.3, "learning_rate": 1e-4, "epoch": 0.5, "step": 10},
    {"loss": 1.1, "learning_rate": 2e-4, "epoch": 1.0, "step": 20},
    {"eval_loss": 1.0, "eval_accuracy": 0.61, "eval_runtime": 0.3, "eval_samples_per_second": 100.0, "step": 20},
    {"loss": 0.7, "step": 30},
    {"eval_loss": 0.8, "eval_accuracy": 0.74, "step": 30},
    {"train_runtime": 12.0, "train_loss": 1.3, "step": 30},
]
EVAL_RESULTS = {"eval_accuracy": 0.74, "eval_loss": 0.8, "eval_runtime": 0.3, "epoch": 3.0}
TRAINING_ARGS = {"learning_rate": 3e-4, "per_device_train_batch_size": 64, "num_train_epochs": 3, "optim": "adamw"}
FAMILIES = {
    "vit": ("image-classification", "AutoModelForImageClassification", "dosovitskiy2021image", "2010.11929"),
    "vit-mpp": ("image-feature-extraction", "AutoModelForMaskedImageModeling", "dosovitskiy2021image", "2010.11929"),
    "seq2seq": ("translation", "AutoModelForSeq2SeqLM", "vaswani2017attention", "1706.03762"),
    "sparse-lm": ("text-generation", "AutoModelForCausalLM", "child2019generating", "1904.10509"),
    "image-lm": ("unconditional-image-generation", "AutoModelForCausalLM", "child2019generating", "1904.10509"),
}
CONFIGS = {
    "vit": ViTPlusConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=4
    ),
    # the same model type: a config saved by masked patch prediction names its head
    "vit-mpp": ViTPlusConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_channels=1,
        architectures=["ViTPlusForMaskedImageModeling"],
    ),
    "seq2seq": {"model_type": "seq2seq_transformer", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2},
    "sparse-lm": {
        "model_type": "sparse_transformer",
        "hidden_size": 64,
        "attention_type": "fixed",
        "sparse_stride": 8,
    },
    # the same model type: an image model's config has image_size
    "image-lm": {
        "model_type": "sparse_transformer",
        "image_size": [8, 8],
        "num_channels": 1,
        "hidden_size": 64,
        "attention_type": "strided",
        "sparse_stride": 8,
    },
}


@pytest.fixture(scope="module")
def rendered_vit_card(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("vit_card")
    figure = plot_training_curves(LOG_HISTORY, tmp_path / "ckpt" / "figures" / "curves.png")
    outside = plot_training_curves(LOG_HISTORY[:2], tmp_path / "elsewhere" / "loss.png")
    return write_model_card(
        tmp_path / "ckpt",
        family="vit",
        model_config=CONFIGS["vit"],
        training_args=TRAINING_ARGS,
        eval_results=EVAL_RESULTS,
        dataset_name="sklearn-digits",
        dataset_config="8x8",
        figures=[figure, outside],
        base_model="google/vit-base-patch16-224-in21k",
        repo_id="test-org/vit-digits",
    )


@pytest.fixture
def vit_card(rendered_vit_card, tmp_path):
    """A copy of the rendered card's folder, free to break."""
    folder = shutil.copytree(rendered_vit_card.parent, tmp_path / "ckpt")
    return folder / "README.md"


def test_card_metadata_and_model_index(vit_card):
    assert vit_card.name == "README.md"
    meta = load_card_metadata(vit_card)
    assert meta["license"] == "apache-2.0"
    assert meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "image-classification"
    assert {"vision", "image-classification", "hf_vit_plus", "custom_code"} <= set(meta["tags"])
    assert meta["datasets"] == ["sklearn-digits"]
    assert meta["metrics"] == ["accuracy"]
    assert meta["base_model"] == "google/vit-base-patch16-224-in21k"
    (model,) = meta["model-index"]
    assert model["name"] == "test-org/vit-digits"
    (result,) = model["results"]
    assert result["task"]["type"] == "image-classification"
    assert result["dataset"] == {
        "name": "sklearn-digits",
        "type": "sklearn-digits",
        "config": "8x8",
        "split": "validation",
    }
    # the metrics, not the bookkeeping (runtime, epoch) nor the loss (as transformers' Trainer cards), with the values
    # given and readable names
    assert result["metrics"] == [{"type": "accuracy", "value": 0.74, "name": "Accuracy"}]
    assert validate_card_metadata(vit_card) == []


def test_huggingface_hub_reads_the_model_index_back(vit_card):
    card = ModelCard.load(vit_card)
    assert card.data.model_name == "test-org/vit-digits"
    assert {r.metric_type: r.metric_value for r in card.data.eval_results} == {"accuracy": 0.74}
    assert all(r.dataset_name == "sklearn-digits" and r.dataset_split == "validation" for r in card.data.eval_results)


def test_card_body_has_usage_hyperparameters_figures_and_citation(vit_card):
    text = vit_card.read_text()
    folder = vit_card.parent
    assert "![figures/curves.png](figures/curves.png)" in text
    assert "![loss.png](loss.png)" in text  # a figure from outside the folder is copied in
    assert (folder / "figures" / "curves.png").is_file() and (folder / "loss.png").is_file()
    assert 'AutoModelForImageClassification.from_pretrained("test-org/vit-digits")' in text
    assert 'from_pretrained("test-org/vit-digits", trust_remote_code=True)' in text
    assert "import hf_vit_plus" in text
    assert "| learning_rate | 0.0003 |" in text and "| per_device_train_batch_size | 64 |" in text
    assert "| eval_accuracy | 0.74 | validation |" in text
    assert "| patch_size | 16 |" in text and "| num_labels | 4 |" in text
    assert "@inproceedings{dosovitskiy2021image," in text and "An Image is Worth 16x16 Words" in text
    assert "{{" not in text and "{%" not in text  # nothing left unrendered
    assert "## Intended uses and limitations" in text


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_renders_a_valid_card(tmp_path, family):
    pipeline_tag, auto_class, bibkey, arxiv = FAMILIES[family]
    path = write_model_card(
        tmp_path,
        family=family,
        model_config=CONFIGS[family],
        training_args={"learning_rate": 1e-3},
        eval_results={"eval_bleu": 12.5} if family == "seq2seq" else {"eval_loss": 1.5, "eval_perplexity": 4.5},
        dataset_name="local-data",
        repo_id=f"test-org/{family}",
        language=["en", "es"] if family == "seq2seq" else None,
    )
    assert validate_card_metadata(path) == []
    meta = load_card_metadata(path)
    assert meta["pipeline_tag"] == pipeline_tag
    assert meta["model-index"][0]["results"][0]["task"]["type"] == pipeline_tag
    text = path.read_text()
    assert f"{auto_class}.from_pretrained(" in text and "trust_remote_code=True" in text
    assert f"{{{bibkey}," in text and arxiv in text
    if family == "seq2seq":
        assert meta["language"] == ["en", "es"] and meta["metrics"] == ["bleu"]
    if family == "sparse-lm":
        assert "| attention_type | fixed |" in text and "| sparse_stride | 8 |" in text
        assert meta["metrics"] == ["perplexity"]  # the loss is no metric id to list


def _break(card, mutate) -> list[str]:
    text = card.read_text()
    _, front, body = text.split("---\n", 2)
    meta = yaml.safe_load(front)
    mutate(meta)
    card.write_text("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n" + body)
    return validate_card_metadata(card)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda m: m.pop("license"), "missing required key 'license'"),
        (lambda m: m.pop("datasets"), "missing required key 'datasets'"),
        (lambda m: m.update(pipeline_tag="image-classifier"), "'pipeline_tag' 'image-classifier' is not a Hub task"),
        (lambda m: m.update(library_name=3), "'library_name' must be a non-empty string"),
        (lambda m: m.update(tags="vision"), None),  # a single string is accepted as a one-item list
        (lambda m: m.update(tags=[1, 2]), "'tags' must be a non-empty list"),
        (lambda m: m.update(license="Apache 2.0"), "'license' must be a Hub license id"),
        (lambda m: m.update({"model-index": {"name": "x"}}), "'model-index' must be a non-empty list"),
        (lambda m: m["model-index"][0]["results"][0]["metrics"][0].update(value="0.74"), "value must be a finite"),
        (lambda m: m["model-index"][0]["results"][0]["metrics"][0].update(value=math.nan), "value must be a finite"),
        (lambda m: m["model-index"][0]["results"][0].pop("metrics"), "metrics must be a non-empty list"),
        (lambda m: m["model-index"][0]["results"][0]["dataset"].pop("type"), "dataset must have string"),
        (lambda m: m["model-index"][0].pop("name"), "name must be a non-empty string"),
    ],
)
def test_validate_catches_broken_metadata(vit_card, mutate, expected):
    problems = _break(vit_card, mutate)
    if expected is None:
        assert problems == []
    else:
        assert any(expected in p for p in problems), problems


def test_validate_catches_broken_files(tmp_path):
    assert validate_card_metadata(tmp_path / "README.md") == [f"{tmp_path / 'README.md'} does not exist"]
    (tmp_path / "README.md").write_text("# A card without metadata\n")
    assert "no YAML metadata block" in validate_card_metadata(tmp_path / "README.md")[0]
    (tmp_path / "README.md").write_text("---\nlicense: [apache\n---\n# x\n")
    assert "invalid YAML" in validate_card_metadata(tmp_path / "README.md")[0]
    (tmp_path / "README.md").write_text("---\n- a\n- b\n---\n# x\n")
    assert "must be a mapping" in validate_card_metadata(tmp_path / "README.md")[0]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"family": "bert"}, ValueError, "Unknown model family 'bert'"),
        (
            {"eval_results": {"eval_accuracy": "high"}},
            ValueError,
            "eval_results\\['eval_accuracy'\\] must be a number",
        ),
        ({"figures": ["missing.png"]}, FileNotFoundError, "missing.png"),
        ({"dataset_name": ""}, ValueError, "dataset_name"),
        ({"family": "seq2seq"}, ValueError, "does not match the config's model_type 'vit_plus'"),
        ({"model_config": 3}, ValueError, "PretrainedConfig or a dict"),
    ],
)
def test_bad_card_input_is_refused(tmp_path, kwargs, error, match):
    args = dict(
        family="vit",
        model_config=CONFIGS["vit"],
        training_args={},
        eval_results={"eval_accuracy": 0.5},
        dataset_name="sklearn-digits",
    )
    with pytest.raises(error, match=match):
        write_model_card(tmp_path, **{**args, **kwargs})
    assert not (tmp_path / "README.md").exists()


def test_non_finite_results_are_left_out_of_the_model_index(tmp_path):
    path = write_model_card(
        tmp_path,
        family="vit",
        model_config=CONFIGS["vit"],
        training_args={},
        eval_results={"eval_accuracy": 0.5, "eval_loss": math.nan},
        dataset_name="sklearn-digits",
    )
    metrics = load_card_metadata(path)["model-index"][0]["results"][0]["metrics"]
    assert [m["name"] for m in metrics] == ["Accuracy"]
    assert load_card_metadata(path)["model-index"][0]["name"] == tmp_path.name


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_card_from_config_alone_says_nothing_was_recorded(tmp_path, family):
    """The card `model.push_to_hub` / `hf-vit-plus push` upload for a checkpoint without training records."""
    pipeline_tag, auto_class, bibkey, _ = FAMILIES[family]
    assert family_of(CONFIGS[family]) == family
    card = model_card_from_config(CONFIGS[family], repo_id=f"test-org/{family}", tags=["extra", "hf_vit_plus"])
    path = tmp_path / "README.md"
    card.save(path)
    assert validate_card_metadata(path, require_datasets=False) == []
    assert validate_card_metadata(path) == ["missing required key 'datasets'"]
    meta = load_card_metadata(path)
    assert meta["pipeline_tag"] == pipeline_tag and meta["license"] == "apache-2.0"
    assert meta["tags"][-2:] == ["custom_code", "extra"]  # the family's tags, then the new ones
    assert "model-index" not in meta and "metrics" not in meta
    text = path.read_text()
    assert "training data, training procedure and evaluation were not recorded" in text
    assert "No training hyperparameters were recorded." in text
    assert "No evaluation results were recorded for this checkpoint: it has not been evaluated" in text
    assert f'{auto_class}.from_pretrained("test-org/{family}", trust_remote_code=True)' in text
    assert f"{{{bibkey}," in text
    assert "{{" not in text and "{%" not in text and "None" not in text and "[More Information Needed]" not in text


def test_trained_card_keeps_its_dataset_wording(tmp_path):
    path = write_model_card(
        tmp_path, family="sparse-lm", model_config=CONFIGS["sparse-lm"], training_args={}, eval_results={},
        dataset_name="austen",
    )  # fmt: skip
    text = path.read_text()  # a data set name that is a Hub id links to the data set's page
    assert "trained on [**austen**](https://huggingface.co/datasets/austen)" in text
    assert "text like that of austen" in text
    assert "No evaluation results were recorded.\n" in text and "not recorded" not in text.split("## Model")[0]


@pytest.mark.parametrize(
    "config, kwargs, match",
    [
        ({"model_type": "bert"}, {}, "No model card family for model_type 'bert'"),
        (CONFIGS["vit"], {"family": "seq2seq"}, "does not match the config's model_type 'vit_plus'"),
        (CONFIGS["vit"], {"family": "bert"}, "Unknown model family 'bert'"),
        (CONFIGS["vit"], {"repo_id": ""}, "repo_id must be a non-empty string"),
        (CONFIGS["vit"], {"tags": "vision"}, "tags must be a list of non-empty strings"),
    ],
)
def test_bad_card_from_config_input_is_refused(config, kwargs, match):
    with pytest.raises(ValueError, match=match):
        model_card_from_config(config, **{"repo_id": "test-org/x", **kwargs})


def test_plot_training_curves_writes_a_png(tmp_path):
    path = plot_training_curves(LOG_HISTORY, tmp_path / "sub" / "curves.png")
    assert path == tmp_path / "sub" / "curves.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    with pytest.raises(ValueError, match="no loss and no eval metric"):
        plot_training_curves([{"learning_rate": 1e-3, "step": 1}], tmp_path / "empty.png")
    with pytest.raises(ValueError, match="ending in .png"):
        plot_training_curves(LOG_HISTORY, tmp_path / "curves.pdf")
    with pytest.raises(ValueError, match="must be a dict"):
        plot_training_curves([("loss", 1.0)], tmp_path / "bad.png")


def test_model_cards_folder_holds_the_packaged_templates():
    for family in FAMILIES:
        shipped = TEMPLATES_DIR / f"{family}.md"
        assert shipped.is_file() and shipped.parent == REPO_ROOT / "hf_vit_plus" / "hub" / "templates"
        assert (REPO_ROOT / "model_cards" / f"{family}.md").read_text() == shipped.read_text()


def test_one_family_id_everywhere_and_the_old_card_name_is_accepted(tmp_path):
    """The card families are the training families (`hf-vit-plus train vit|seq2seq|sparse-lm`); the card
    name of the LM saved by version 0.1.0 (commit ded34c8), "sparse_lm", still renders the same card."""
    from hf_vit_plus.training import FAMILIES as TRAINING_FAMILIES

    assert sorted(FAMILIES) == sorted(TRAINING_FAMILIES)
    config = CONFIGS["sparse-lm"]
    old = model_card_from_config(config, repo_id="test-org/lm", family="sparse_lm")
    assert str(old) == str(model_card_from_config(config, repo_id="test-org/lm", family="sparse-lm"))
    path = write_model_card(tmp_path, family="sparse_lm", model_config=config, training_args={}, eval_results={},
                            dataset_name="austen")  # fmt: skip
    assert not validate_card_metadata(path)
    with pytest.raises(ValueError, match=r"Unknown model family 'sparse_transformer'; expected one of"):
        model_card_from_config(config, repo_id="test-org/lm", family="sparse_transformer")


def test_image_card_shows_the_floors_beside_bits_per_dim_outside_the_model_index(tmp_path):
    eval_results = {
        "eval_loss": 1.25,
        "eval_bits_per_dim": 1.8,
        "eval_baseline_uniform_bits_per_dim": 8.0,
        "eval_baseline_pixel_histogram_bits_per_dim": 2.66,
    }
    path = write_model_card(
        tmp_path, family="image-lm", model_config=CONFIGS["image-lm"], training_args={}, eval_results=eval_results,
        dataset_name="zalando-datasets/fashion_mnist", eval_split="test",
    )  # fmt: skip
    assert validate_card_metadata(path) == []
    meta = load_card_metadata(path)
    assert meta["pipeline_tag"] == "unconditional-image-generation" and meta["metrics"] == ["bits_per_dim"]
    assert {"sparse-transformer", "image-generation"} <= set(meta["tags"])
    [result] = meta["model-index"][0]["results"]
    assert result["dataset"]["split"] == "test"
    assert {m["type"]: m["value"] for m in result["metrics"]} == {"bits_per_dim": 1.8}
    text = path.read_text()
    assert "| eval_loss | 1.25 | test |" in text  # the loss: in the table, not in the model-index
    assert "| eval_bits_per_dim | 1.8 | test |" in text
    assert "| uniform_bits_per_dim | 8 | test |" in text and "| pixel_histogram_bits_per_dim | 2.66 | test |" in text
    assert "@article{xiao2017fashionmnist," in text and "1708.07747" in text
    assert "| image_size | 8, 8 |" in text and "| sparse_stride | 8 |" in text
    with pytest.raises(ValueError, match="eval_split must be a non-empty string"):
        write_model_card(tmp_path, family="image-lm", model_config=CONFIGS["image-lm"], training_args={},
                         eval_results={}, dataset_name="d", eval_split="")  # fmt: skip


def test_text_and_image_sparse_transformers_get_their_own_cards(tmp_path):
    assert family_of(CONFIGS["sparse-lm"]) == "sparse-lm" and family_of(CONFIGS["image-lm"]) == "image-lm"
    cases = (("sparse-lm", "image-lm", "an image model"), ("image-lm", "sparse-lm", "not an image"))
    for family, config, kind in cases:
        with pytest.raises(ValueError, match=f"does not match the config's model_type 'sparse_transformer': the "
                                             f"config is {kind}"):  # fmt: skip
            write_model_card(tmp_path, family=family, model_config=CONFIGS[config], training_args={},
                             eval_results={}, dataset_name="d")  # fmt: skip
        with pytest.raises(ValueError, match="does not match the config's model_type 'sparse_transformer'"):
            model_card_from_config(CONFIGS[config], repo_id="test-org/x", family=family)
