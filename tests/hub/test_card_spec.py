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
    from hf_vit_plus.training.outputs import card_hyperparameters
    from hf_vit_plus.training.plan import preview_plan
    from hf_vit_plus.training.tasks import get_task

    for name, expected in (("vit", "cosine"), ("seq2seq", "noam"), ("sparse-lm", "cosine"), ("image-lm", "cosine")):
        args = family_arguments(name, output_dir="unused", max_steps=3)
        assert args.lr_scheduler_type == "auto"
        plan = preview_plan(args, get_task(name))  # the card reads the plan, which resolved 'auto'
        assert card_hyperparameters(plan)["scheduler"] == expected == plan.optimization.lr_scheduler_type
    args = family_arguments("vit", output_dir="unused", max_steps=3, lr_scheduler_type="linear")
    assert card_hyperparameters(preview_plan(args, get_task("vit")))["scheduler"] == "linear"


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


def _demo_folder(root, name="demo"):
    """A tiny ViT folder with the card a run without --hub_model_id writes."""
    from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification

    folder = root / name
    config = ViTPlusConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                           image_size=16, patch_size=8, num_labels=3)  # fmt: skip
    ViTPlusForImageClassification(config).save_pretrained(folder)
    write_model_card(folder, family="vit", model_config=config, training_args={"learning_rate": 1e-3},
                     eval_results={"eval_accuracy": 0.5, "eval_loss": 1.0}, dataset_name="sklearn-digits")  # fmt: skip
    return folder


def test_card_for_repo_names_the_repository(tmp_path):
    from hf_vit_plus.hub.adapter import adapter_card
    from hf_vit_plus.hub.card import card_for_repo

    text = (_demo_folder(tmp_path) / "README.md").read_text()
    assert '"path/to/this/folder"' in text and "\n# demo\n" in text
    pushed = card_for_repo(text, "test-org/digits-vit", "demo")
    assert "path/to/this/folder" not in pushed and "\n# test-org/digits-vit\n" in pushed
    assert 'AutoModelForImageClassification.from_pretrained("test-org/digits-vit")' in pushed
    assert ModelCard(pushed).data.model_name == "test-org/digits-vit"
    assert card_for_repo(pushed, "test-org/digits-vit", "demo") == pushed  # nothing left to change
    # everything else is as it was: only the names changed
    assert pushed.replace("test-org/digits-vit", "X") == text.replace("path/to/this/folder", "X").replace(
        "name: demo", "name: X").replace("# demo", "# X")  # fmt: skip
    assert card_for_repo("---\nlicense: mit\n---\n# mine, path/to/this/folder\n", "a/b", "demo") is None
    # an adapter card, written without a repo id, loads the adapter by its folder's name
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8, "base_model_name_or_path": "org/base"}')
    text = str(adapter_card(adapter, family="vit"))
    pushed = card_for_repo(text, "test-org/lora", "lora")
    assert 'PeftModel.from_pretrained(base, "test-org/lora")' in pushed and "\n# test-org/lora\n" in pushed


def test_push_uploads_the_card_naming_the_repository(hub_server, tmp_path):
    """`hf-vit-plus push FOLDER REPO_ID` uploaded the README.md of a run without --hub_model_id unchanged: loading
    examples of "path/to/this/folder" and a model-index named after the folder. The uploaded card names REPO_ID; the
    local file is kept."""
    from tests.utils import folder_snapshot, run_with_package

    folder = _demo_folder(tmp_path)
    before = folder_snapshot(folder)
    result = run_with_package(
        f"""
        import contextlib, io, json
        from hf_vit_plus.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["push", {str(folder)!r}, "test-org/pushed-demo", "--token", "hf_x"])
        print(json.dumps({{"code": code}}))
        """,
        cwd=tmp_path,
        env=hub_server.env(),
    )
    assert result["code"] == 0
    card = hub_server.read_file("test-org/pushed-demo", "README.md").decode("utf-8")
    assert "path/to/this/folder" not in card
    assert 'AutoModelForImageClassification.from_pretrained("test-org/pushed-demo")' in card
    assert 'from_pretrained("test-org/pushed-demo", trust_remote_code=True)' in card
    assert "\n# test-org/pushed-demo\n" in card
    meta = ModelCard(card).data
    assert meta.model_name == "test-org/pushed-demo" and [r.metric_name for r in meta.eval_results] == ["Accuracy"]
    assert folder_snapshot(folder) == before  # the local folder is only read
    assert '"path/to/this/folder"' in (folder / "README.md").read_text()
    (tmp_path / "pushed").mkdir()
    (tmp_path / "pushed" / "README.md").write_text(card)
    assert validate_card_metadata(tmp_path / "pushed" / "README.md") == []


def test_license_flag_reaches_the_card_and_unknown_licences_are_refused(tmp_path):
    """Point 6: `--license` (default apache-2.0) is validated against the Hub's licence ids before any work, and
    the card carries it; `validate_card_metadata` refuses a licence id the Hub does not know."""
    from hf_vit_plus.errors import UsageError
    from hf_vit_plus.hub.card import HUB_LICENSES, check_license
    from hf_vit_plus.training.args import family_arguments

    assert {"apache-2.0", "mit", "cc-by-4.0", "other"} <= HUB_LICENSES
    assert family_arguments("vit", output_dir="unused", max_steps=3).license == "apache-2.0"
    assert family_arguments("seq2seq", output_dir="unused", max_steps=3, license="cc-by-4.0").license == "cc-by-4.0"
    with pytest.raises(UsageError, match="--license: Unknown licence 'apache2'"):
        family_arguments("vit", output_dir="unused", max_steps=3, license="apache2")
    with pytest.raises(ValueError, match="Unknown licence 'GPL'"):
        check_license("GPL")
    config = CONFIGS["vit"]
    write_model_card(tmp_path, family="vit", model_config=config, training_args={},
                     eval_results={"eval_accuracy": 0.5},
                     dataset_name="sklearn-digits", license="cc-by-4.0")  # fmt: skip
    assert load_card_metadata(tmp_path / "README.md")["license"] == "cc-by-4.0"
    assert validate_card_metadata(tmp_path / "README.md") == []
    with pytest.raises(ValueError, match="Unknown licence 'cc-by-5.0'"):
        write_model_card(tmp_path, family="vit", model_config=config, training_args={}, eval_results={},
                         dataset_name="sklearn-digits", license="cc-by-5.0")  # fmt: skip
    text = (tmp_path / "README.md").read_text().replace("license: cc-by-4.0", "license: my-own-licence")
    (tmp_path / "README.md").write_text(text)
    assert validate_card_metadata(tmp_path / "README.md") == [
        "'license' 'my-own-licence' is not one of the Hub's licence ids"
    ]
