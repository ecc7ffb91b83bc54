"""scripts/train_translation.py end to end on a data set in the WMT layout (a `translation` column of
{lang: text} dicts, `train` and `validation` splits), the path `--dataset_name wmt14 --dataset_config_name de-en`
takes.

The data set is a local folder of JSON-lines files, which `datasets.load_dataset(name)` reads like a Hub repository:
numbers written as digits ("en") -> English words ("words"), no network.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vit_plus.data.number_words import number_to_words
from hf_vit_plus.hub.card import load_card_metadata, validate_card_metadata
from tests.utils import load_script


def _load_script():
    return load_script("scripts/train_translation.py")


def _write_wmt_layout(folder: Path) -> Path:
    folder.mkdir()
    for split, numbers in (("train", range(0, 600)), ("validation", range(600, 640))):
        with open(folder / f"{split}.jsonl", "w") as f:
            for n in numbers:
                f.write(json.dumps({"translation": {"digits": str(n), "words": number_to_words(n)}}) + "\n")
    return folder


def _tiny_run(data_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--dataset_name", str(data_dir),
        "--source_lang", "digits",
        "--target_lang", "words",
        "--vocab_size", "300",
        "--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim", "64",
        "--batch_size", "32",
        "--logging_steps", "10",
        "--eval_steps", "10",
        "--max_validation_samples", "8",
        "--average_last", "3",
        "--warmup_steps", "10",
        "--max_eval_samples", "16",
        "--max_source_length", "16",
        "--max_target_length", "24",
        "--output_dir", str(output_dir),
        *extra,
    ]  # fmt: skip


def test_translation_script_trains_on_a_wmt_layout_dataset_and_saves_a_loadable_folder(tmp_path):
    script = _load_script()
    data_dir = _write_wmt_layout(tmp_path / "numbers_wmt")
    output_dir = tmp_path / "out"
    results = script.main(_tiny_run(data_dir, output_dir, "--max_steps", "30"))
    assert results["train_steps"] == 30 and results["eval_sentences"] == 16
    assert results["direction"] == "digits->words" and math.isfinite(results["train_loss"])
    assert 0.0 <= results["bleu"] <= 100.0 and 0.0 <= results["chrf"] <= 100.0
    assert results["bleu_signature"].startswith("nrefs:1") and results["num_beams"] == 4
    saved = json.loads((output_dir / "results.json").read_text())
    assert saved["bleu"] == results["bleu"] and len(saved["examples"]) == 8
    # A greedy validation BLEU every 10 steps, a checkpoint each time, and the paper's average of the last ones.
    assert [point["step"] for point in results["validation_curve"]] == [10, 20, 30]
    assert set(results["candidates"]) == {"last", "average"}
    assert results["weights"] in ("last", "average of ['checkpoint-10', 'checkpoint-20', 'checkpoint-30']")

    # The card carries the held-out scores, with the loss curve next to it: in its table, since a local folder is not a
    # Hub data set (a model-index needs one).
    card = (output_dir / "model" / "README.md").read_text()
    assert "training_curves.png" in card and (output_dir / "model" / "training_curves.png").is_file()
    assert validate_card_metadata(output_dir / "model" / "README.md", require_datasets=False) == []
    metadata = load_card_metadata(output_dir / "model" / "README.md")
    assert "model-index" not in metadata and "datasets" not in metadata
    assert results["eval_split"] == "validation"
    assert f"| eval_bleu | {results['bleu']:.6g} | validation |" in card
    assert f"| eval_chrf | {results['chrf']:.6g} | validation |" in card

    # The saved generation settings are the paper's beam search, not the defaults Seq2SeqTrainer's evaluation
    # writes into the model's generation config (a max_length of 20 next to max_new_tokens).
    generation = json.loads((output_dir / "model" / "generation_config.json").read_text())
    assert "max_length" not in generation and generation["max_new_tokens"] == 24
    assert generation["num_beams"] == 4 and generation["length_penalty"] == 0.6

    # The saved folder is a complete checkpoint: Auto classes load the model and the tokenizer.
    tokenizer = AutoTokenizer.from_pretrained(output_dir / "model")
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir / "model")
    batch = tokenizer(["12", "345"], return_tensors="pt", padding=True)
    generated = model.generate(**batch, num_beams=2, max_new_tokens=8)
    assert generated.shape[0] == 2 and generated.shape[1] <= 9


def test_translation_script_resumes_from_its_latest_checkpoint_and_refuses_to_mix_runs(tmp_path):
    script = _load_script()
    data_dir = _write_wmt_layout(tmp_path / "numbers_wmt")
    output_dir = tmp_path / "out"
    script.main(_tiny_run(data_dir, output_dir, "--max_steps", "20", "--average_last", "1"))
    # A fresh run into a folder with checkpoints would average another run's weights: refused.
    with pytest.raises(ValueError, match="already holds checkpoints"):
        script.main(_tiny_run(data_dir, output_dir, "--max_steps", "30"))
    resumed = script.main(
        _tiny_run(
            data_dir, output_dir, "--max_steps", "30", "--average_last", "1", "--resume_from_checkpoint", "latest"
        )
    )
    assert resumed["resumed_from"].endswith("checkpoint-20") and resumed["train_steps"] == 30
    # Stopped at 20 and resumed to 30 == trained to 30 at once, bitwise: weights (the shared embedding and the
    # projections tied to it), optimizer and schedule state, data order and dropout randomness all came back.
    straight = script.main(_tiny_run(data_dir, tmp_path / "straight", "--max_steps", "30", "--average_last", "1"))
    once = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    twice = load_file(output_dir / "model" / "model.safetensors")
    assert once.keys() == twice.keys() and all(torch.equal(once[k], twice[k]) for k in once)
    assert straight["validation_curve"] == resumed["validation_curve"]
    # The curve continues the first run's: the trainer state came back with the checkpoint.
    assert [point["step"] for point in resumed["validation_curve"]] == [10, 20, 30]
    with pytest.raises(ValueError, match="not a Trainer checkpoint"):
        script.main(_tiny_run(data_dir, output_dir, "--resume_from_checkpoint", str(tmp_path)))


def test_translation_script_rejects_a_direction_the_sword_corpus_lacks(tmp_path):
    script = _load_script()
    with pytest.raises(ValueError, match="de->es"):
        script.main(["--source_lang", "de", "--output_dir", str(tmp_path)])
