"""What a card says of the run beside its hyperparameters (issue 48, points 2, 7, 8 and 9): the data set by its Hub id
where it has one (and no model-index where it has none), the training data and its splits, the preprocessing, the
compute, the environmental impact, the framework versions (from `hf-vit-plus env`'s code), a translation card's
languages and BLEU/chrF, and the run's TensorBoard logs pushed under runs/."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
import sacrebleu
import torch
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vit_plus.cli import main
from hf_vit_plus.data.images import IMAGE_DATASETS
from hf_vit_plus.env_cli import framework_versions
from hf_vit_plus.hub.card import (
    RunRecord,
    hub_dataset_id,
    load_card_metadata,
    model_card_from_config,
    validate_card_metadata,
    write_model_card,
)
from hf_vit_plus.training.args import family_arguments
from hf_vit_plus.training.tasks.base import builtin_card_record, user_data_record
from tests.utils import TINY_VIT_OVERRIDES

VIT_CONFIG = {"model_type": "vit_plus", "image_size": 8, "patch_size": 2, "num_channels": 1, "hidden_size": 16}
RESULTS = {"eval_accuracy": 0.9, "eval_loss": 0.3}
TINY_SEQ2SEQ = (
    "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64"
)


# ------------------------------------------------------------------------------------------- data sets (point 2)
def test_data_on_the_hub_is_named_by_its_id_and_readable_name(tmp_path):
    """`datasets` and the model-index's `type` hold the Hub id, its `name` the readable name; huggingface_hub reads
    them back so; the text links to the data set's page."""
    path = write_model_card(tmp_path, family="vit", model_config=VIT_CONFIG, training_args={}, eval_results=RESULTS,
                            dataset_name="Fashion-MNIST", dataset_id="zalando-datasets/fashion_mnist",
                            eval_split="test")  # fmt: skip
    meta = load_card_metadata(path)
    assert meta["datasets"] == ["zalando-datasets/fashion_mnist"]
    _, results = model_index_to_eval_results(meta["model-index"])
    assert {(r.dataset_type, r.dataset_name, r.dataset_split) for r in results} == {
        ("zalando-datasets/fashion_mnist", "Fashion-MNIST", "test")
    }
    assert "[**Fashion-MNIST**](https://huggingface.co/datasets/zalando-datasets/fashion_mnist)" in path.read_text()
    assert validate_card_metadata(path) == []


def test_data_not_on_the_hub_has_no_datasets_and_no_model_index(tmp_path):
    """The model-index needs a Hub data set id: without one (the digits) the card has no `datasets` and no
    model-index, says why, and keeps the results in its table."""
    path = write_model_card(tmp_path, family="vit", model_config=VIT_CONFIG, training_args={}, eval_results=RESULTS,
                            dataset_name="scikit-learn's digits", dataset_id=None)  # fmt: skip
    meta = load_card_metadata(path)
    assert "datasets" not in meta and "model-index" not in meta and "metrics" not in meta
    text = path.read_text()
    assert "| eval_accuracy | 0.9 | validation |" in text and "The data set is not on the Hub" in text
    assert "trained on\n**scikit-learn's digits**" in text or "trained on **scikit-learn's digits**" in text
    assert ModelCard.load(path).data.eval_results is None
    assert validate_card_metadata(path, require_datasets=False) == []
    with pytest.raises(ValueError, match="dataset_id must be a Hub data set id"):
        write_model_card(tmp_path, family="vit", model_config=VIT_CONFIG, training_args={}, eval_results=RESULTS,
                         dataset_name="mine", dataset_id="/data/mine")  # fmt: skip


def test_the_validation_catches_a_model_index_data_set_missing_from_datasets(tmp_path):
    path = write_model_card(tmp_path, family="vit", model_config=VIT_CONFIG, training_args={}, eval_results=RESULTS,
                            dataset_name="beans")  # fmt: skip
    text = path.read_text().replace("datasets:\n- beans\n", "datasets:\n- other\n")
    path.write_text(text)
    assert any("'beans' is not in 'datasets'" in problem for problem in validate_card_metadata(path))


def test_built_in_and_user_data_name_a_hub_id_only_where_there_is_one(tmp_path):
    assert IMAGE_DATASETS["fashion-mnist"].hub_id == "zalando-datasets/fashion_mnist"
    assert IMAGE_DATASETS["digits"].hub_id is None
    name, record = builtin_card_record(IMAGE_DATASETS["digits"])
    assert name == "scikit-learn's digits" and record["hub_id"] is None and "1,437" in record["description"]
    assert builtin_card_record(IMAGE_DATASETS["fashion-mnist"])[1]["hub_id"] == "zalando-datasets/fashion_mnist"
    local = tmp_path / "my_data"
    local.mkdir()
    assert hub_dataset_id(str(local)) is None and hub_dataset_id("./rel/path") is None
    assert hub_dataset_id("org/name") == "org/name"
    args = family_arguments("vit", output_dir=str(tmp_path / "o"), dataset_name=str(local))
    record = user_data_record(args, None)
    assert record["name"] == "my_data" and record["hub_id"] is None
    assert record["description"] == "the data set in `my_data`, loaded with `datasets.load_dataset`."
    args = family_arguments("vit", output_dir=str(tmp_path / "o"), dataset_name="beans")
    assert user_data_record(args, None)["hub_id"] == "beans"


# -------------------------------------------------------------------- training data, compute, versions (point 8)
def test_run_record_gives_the_data_compute_impact_and_versions_sections(tmp_path):
    record = RunRecord(
        data_description="Ten kinds of beans.", split_sizes=(("train", 1034), ("validation (evaluation)", 133)),
        preprocessing="Resized to 8x8.", hardware="2 processes on CPU (Test CPU, 2 logical cores)",
        train_seconds=5400.0, precision="bf16",
    )  # fmt: skip
    path = write_model_card(tmp_path, family="vit", model_config=VIT_CONFIG, training_args={}, eval_results=RESULTS,
                            dataset_name="beans", run_record=record)  # fmt: skip
    text = path.read_text()
    data = text.split("## Training data\n\n")[1].split("\n## Training procedure")[0]
    assert data.startswith("Ten kinds of beans.") and "| train | 1,034 |" in data
    assert "| validation (evaluation) | 133 |" in data and "### Preprocessing\n\nResized to 8x8." in data
    compute = text.split("## Compute\n\n")[1].split("\n## ")[0]
    assert "| Hardware | 2 processes on CPU (Test CPU, 2 logical cores) |" in compute
    assert "| Training time | 1.5 hours (90 minutes) |" in compute and "| Mixed precision | bf16 |" in compute
    assert "## Environmental impact" in text and "https://mlco2.github.io/impact" in text
    versions = text.split("## Framework versions\n\n")[1].split("\n## ")[0]
    expected = framework_versions(installed_only=True)  # the code of `hf-vit-plus env`
    for name in ("hf_vit_plus", "torch", "transformers", "accelerate", "datasets", "tokenizers", "huggingface_hub"):
        assert f"- {name} {expected[name]}\n" in versions, name
    assert expected["torch"] == importlib.metadata.version("torch")
    assert text.index("## Training data") < text.index("## Training procedure") < text.index("## Compute")
    assert text.index("## Framework versions") < text.index("## Citation")


def test_a_card_without_run_records_has_versions_but_no_compute(tmp_path):
    card = str(model_card_from_config({**VIT_CONFIG}, repo_id="org/vit"))
    assert "## Framework versions" in card and "The environment that wrote this card" in card
    assert "## Compute" not in card and "## Training data" not in card


# ---------------------------------------------------------------------- a translation run's card (points 7, 8)
def test_translation_card_has_languages_bleu_chrf_and_the_run_sections(tmp_path, capsys):
    """A seq2seq run on the user's file with --source_lang/--target_lang: the card's `language` lists both; BLEU and
    chrF are sacreBLEU's corpus scores of the greedy outputs against the references, equal to those computed here
    from the saved model; the card describes the file, its splits, the tokenization and the machine."""
    pairs = [{"source": f"{n} {n + 1}", "target": f"{n + 1} {n}"} for n in range(40)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    out = tmp_path / "run"
    status = main(["train", "seq2seq", "--train_file", str(data), "--output_dir", str(out), "--max_steps", "6",
                   "--config_overrides", TINY_SEQ2SEQ, "--vocab_size", "300", "--per_device_train_batch_size", "8",
                   "--validation_split_percentage", "25", "--source_lang", "en", "--target_lang", "de",
                   "--report_to", "none", "--save_steps", "none"])  # fmt: skip
    assert status == 0, capsys.readouterr().err[-3000:]
    meta = load_card_metadata(out / "README.md")
    assert meta["language"] == ["en", "de"] and "datasets" not in meta
    results = json.loads((out / "eval_results.json").read_text())
    assert {"eval_bleu", "eval_chrf"} <= set(results)

    # the same scores from the saved model: greedy outputs of the 10 held-out pairs, as the run's evaluation made them
    from datasets import load_dataset

    held_out = load_dataset("json", data_files=str(data))["train"].train_test_split(test_size=0.25, seed=42)["test"]
    tokenizer, model = AutoTokenizer.from_pretrained(out), AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    sources, references = list(held_out["source"]), list(held_out["target"])
    inputs = tokenizer(sources, return_tensors="pt", padding=True, truncation=True, max_length=64)
    labels = tokenizer(text_target=references, truncation=True, max_length=64)["input_ids"]
    with torch.no_grad():
        generated = model.generate(**inputs, num_beams=1, do_sample=False,
                                   max_new_tokens=max(map(len, labels)) + 5)  # fmt: skip
    outputs = tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert results["eval_bleu"] == pytest.approx(sacrebleu.corpus_bleu(outputs, [references]).score, abs=1e-6)
    assert results["eval_chrf"] == pytest.approx(sacrebleu.corpus_chrf(outputs, [references]).score, abs=1e-6)

    text = (out / "README.md").read_text()
    assert "| eval_bleu |" in text and "| eval_chrf |" in text
    data_section = text.split("## Training data\n\n")[1].split("\n## Training procedure")[0]
    assert "local files (`pairs`)" in data_section and "| train | 30 |" in data_section
    assert "| validation (evaluation) | 10 |" in data_section
    assert "cut to 64 source and 64 target tokens" in data_section
    assert "| Hardware | 1 process on CPU (" in text and "| Training time | " in text


def test_bleu_and_chrf_are_sacrebleus_corpus_scores_of_the_decoded_outputs():
    """The family's scores from gathered token ids (padded, as the evaluation gathers them) equal sacreBLEU's on the
    texts; without a tokenizer (the evaluation's transform not run) there are none."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from hf_vit_plus.training.tasks.seq2seq import Seq2SeqTask

    words = "the cat sat on a mat dog ran far away".split()
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<pad>", "<unk>", *words])}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>")
    outputs = ["the cat sat on a mat", "a dog ran away", "the dog sat"]
    references = ["the cat sat on the mat", "a dog ran far away", "the cat ran"]

    def padded(texts):
        ids = [tokenizer(text)["input_ids"] for text in texts]
        return torch.tensor([row + [0] * (12 - len(row)) for row in ids])

    family = Seq2SeqTask()
    gathered = {"output_ids": padded(outputs), "reference_ids": padded(references)}
    assert family._sacrebleu_scores(gathered) == {}
    family._tokenizer = tokenizer
    scores = family._sacrebleu_scores(gathered)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(outputs, [references]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(outputs, [references]).score)
    assert 10 < scores["bleu"] < 100 and 10 < scores["chrf"] < 100


def test_a_language_that_is_not_a_code_is_refused_before_training(tmp_path, capsys):
    status = main(["train", "seq2seq", "--output_dir", str(tmp_path / "run"), "--source_lang", "English",
                   "--max_steps", "1", "--report_to", "none"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and "--source_lang must be a language code such as 'en'" in err and "'English'" in err
    assert not (tmp_path / "run" / "model.safetensors").exists()


# ------------------------------------------------------------------------------------- TensorBoard logs (point 9)
def test_the_runs_tensorboard_logs_go_up_under_runs_and_hold_the_curves(tmp_path, hub_server):
    """A run with --report_to tensorboard --push_to_hub pushes its event files under runs/ (the Hub's "Training
    metrics" tab); the pushed file holds the training loss at every logged step. `hf-vit-plus push --no_logs` leaves
    them out. In a fresh process (HF_ENDPOINT is read when huggingface_hub is imported)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.utils import run_with_package

    result = run_with_package(
        f"""
        import contextlib, io, json, os
        from hf_vit_plus.cli import main
        os.environ["HF_TOKEN"] = "hf_test_token_123"
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            trained = main(["train", "vit", "--output_dir", "run", "--config_overrides", {TINY_VIT_OVERRIDES!r},
                            "--max_steps", "4", "--logging_steps", "1", "--max_train_samples", "64",
                            "--max_eval_samples", "16", "--report_to", "tensorboard", "--save_steps", "none",
                            "--push_to_hub", "--hub_model_id", "test-org/tb-logs"])
            pushed = main(["push", "run", "test-org/tb-no-logs", "--no_logs"])
        print(json.dumps({{"trained": trained, "pushed": pushed, "err": err.getvalue()[-3000:]}}))
        """,
        cwd=tmp_path,
        env=hub_server.env(),
    )
    assert result["trained"] == 0 and result["pushed"] == 0, result["err"]
    pushed = hub_server.files("test-org/tb-logs")
    events = [path for path in pushed if path.startswith("runs/") and "events.out.tfevents." in path]
    assert events and not [path for path in pushed if path.startswith("logs/")]
    local = tmp_path / "downloaded"
    steps = {}
    for path in events:
        (local / path).parent.mkdir(parents=True, exist_ok=True)
        (local / path).write_bytes(hub_server.read_file("test-org/tb-logs", path))
        accumulator = EventAccumulator(str(local / path))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            steps[tag] = [event.step for event in accumulator.Scalars(tag)]
    loss = next(tag for tag in steps if tag.endswith("loss") and "eval" not in tag)
    assert steps[loss] == [1, 2, 3, 4], steps
    assert not [path for path in hub_server.files("test-org/tb-no-logs") if path.startswith("runs/")]
    assert "model.safetensors" in hub_server.files("test-org/tb-no-logs")
