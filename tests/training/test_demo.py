"""`hf-vit-plus demo` (what `make demo` runs), shortened to a few updates: it trains through the Accelerate loop,
writes a checkpoint that `AutoModelForImageClassification` loads, a model card and figures, prints predictions,
and pushes to a Hub (a loopback server) with --push_to_hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from transformers import AutoImageProcessor, AutoModelForImageClassification

from tests.utils import REPO_ROOT

REPO_ID = "demo-user/vit-digits"


def test_demo_preview_numbers_the_validation_images_not_digits():
    """`make demo` printed "digit 0: predicted three truth three": the 0 is an example's index, not a digit."""
    from hf_vit_plus.training.cli import preview_line

    assert preview_line(0, "three", "three").split() == ["validation", "image", "0:", "predicted", "three", "truth",
                                                          "three", "ok"]  # fmt: skip
    assert preview_line(4, "one", "seven").split()[-1] == "WRONG"


def test_demo_trains_saves_a_loadable_model_with_card_and_pushes(tmp_path, hub_server):
    output_dir = tmp_path / "demo"
    command = [
        sys.executable, "-m", "hf_vit_plus.cli", "demo", "--output_dir", str(output_dir), "--max_steps", "60",
        "--report_to", "tensorboard", "--push_to_hub", "--hub_model_id", REPO_ID, "--hub_revision", "demo",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT), HF_TOKEN="hf_test_token_123")
    env.update(hub_server.env())
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]

    # predictions vs truth printed after reloading with the Auto class
    assert "AutoModelForImageClassification.from_pretrained" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.strip().startswith("validation image ")]
    assert len(rows) == 10 and all("truth" in row for row in rows)
    assert "digit 0:" not in proc.stdout  # the number is the image's index in the validation split, not a digit

    # the saved folder is a transformers checkpoint: Auto classes load it and it predicts
    model = AutoModelForImageClassification.from_pretrained(output_dir).eval()
    processor = AutoImageProcessor.from_pretrained(output_dir)
    summary = json.loads((output_dir / "demo_summary.json").read_text())
    results = json.loads((output_dir / "eval_results.json").read_text())
    assert summary["updates"] == 60 and results["eval_accuracy"] == summary["accuracy"]
    assert summary["accuracy"] > 0.3  # 10 classes; 60 updates of the small ViT are well above chance (10%)
    from hf_vit_plus.data.digits import load_digits_dataset

    test = load_digits_dataset()["test"].select(range(64))
    inputs = processor(images=[image.convert("L") for image in test["image"]], return_tensors="pt")
    with torch.no_grad():
        predicted = model(**inputs).logits.argmax(-1)
    assert (predicted == torch.tensor(test["label"])).float().mean().item() > 0.3
    assert model.config.id2label[0] == "zero" and model.config.num_labels == 10

    # card and figures next to the model, TensorBoard logs, a resumable checkpoint
    card = (output_dir / "README.md").read_text()
    # the digits are not on the Hub: the results are in the card's table, not in a model-index
    metadata = card.split("\n---\n")[0]
    assert "model-index" not in metadata and "| eval_accuracy |" in card and "training_curves.png" in card
    for figure in ("training_curves.png", "attention_maps.png"):
        assert (output_dir / figure).stat().st_size > 1000, figure
    assert list((output_dir / "logs").rglob("events.out.tfevents.*"))
    assert (output_dir / "checkpoints" / "checkpoint-60" / "training_state.json").is_file()

    # pushed to the requested branch, without the training checkpoints; the TensorBoard event files under runs/,
    # where the Hub shows its "Training metrics" tab
    pushed = hub_server.files(REPO_ID, revision="demo")
    assert {"model.safetensors", "config.json", "README.md", "training_curves.png"} <= set(pushed)
    assert not [path for path in pushed if path.startswith(("checkpoints/", "logs/"))]
    events = sorted(path for path in pushed if path.startswith("runs/") and "events.out.tfevents." in path)
    local = sorted(p.relative_to(output_dir / "logs").as_posix() for p in (output_dir / "logs").rglob("events.out.*"))
    assert events == [f"runs/{name}" for name in local] and events
    sent = hub_server.read_file(REPO_ID, events[0], "demo")  # the events up to the push (the file may grow at close)
    assert sent and (output_dir / "logs" / local[0]).read_bytes().startswith(sent)
    assert (
        hub_server.read_file(REPO_ID, "model.safetensors", "demo") == (output_dir / "model.safetensors").read_bytes()
    )
