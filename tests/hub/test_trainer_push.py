"""transformers' own Hub calls on the package's models upload the family's card: `Trainer.push_to_hub()` (with the
Trainer's evaluation results) and `model.save_pretrained(..., push_to_hub=True)`, over real HTTP on loopback
(tests/hub_server.py), in a fresh process (HF_ENDPOINT is read when huggingface_hub is imported)."""

from __future__ import annotations

import pytest
import yaml

from tests.utils import run_with_package

CLIENT = """
import json, pathlib
import torch
from transformers import Trainer, TrainingArguments
from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM
from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification

class Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 3, (n,), generator=g)
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}

torch.manual_seed(0)
model = ViTPlusForImageClassification(ViTPlusConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                    intermediate_size=64, image_size=16, patch_size=8, num_labels=3))
args = TrainingArguments(output_dir="trainer-run", push_to_hub=True, hub_model_id="test-org/trainer-vit",
                         hub_token="hf_x", hub_strategy="end", max_steps=2, per_device_train_batch_size=4,
                         report_to=[], use_cpu=True, save_strategy="no")
accuracy = lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}
trainer = Trainer(model=model, args=args, train_dataset=Rows(8), eval_dataset=Rows(8), compute_metrics=accuracy)
trainer.train()
metrics = trainer.evaluate()
trainer.push_to_hub(dataset="sklearn-digits")

lm = SparseTransformerForCausalLM(SparseTransformerConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=64,
                                                          max_position_embeddings=32, attention_type="dense"))
lm.save_pretrained("lm-folder", push_to_hub=True, repo_id="test-org/saved-lm", token="hf_x",
                   commit_message="saved and pushed")
print(json.dumps({"eval_loss": metrics["eval_loss"], "eval_accuracy": metrics["eval_accuracy"],
                  "local_card": pathlib.Path("trainer-run/README.md").read_text()}))
"""


def _metadata(card: str) -> dict:
    return yaml.safe_load(card.split("---")[1])


@pytest.fixture(scope="module")
def pushed(hub_server, tmp_path_factory):
    return run_with_package(CLIENT, cwd=tmp_path_factory.mktemp("trainer_push"), env=hub_server.env())


def test_trainer_push_to_hub_uploads_the_family_card_with_its_evaluation(hub_server, pushed):
    """`Trainer.push_to_hub()` uploaded transformers' stock card ("More information needed", no family metadata):
    the card is now the family's, with the Trainer's last evaluation in the model-index (its accuracy, named
    readably; the loss only in the results table, as transformers' own cards) and its hyperparameters in the
    table."""
    card = hub_server.read_file("test-org/trainer-vit", "README.md").decode("utf-8")
    assert card == pushed["local_card"]
    metadata = _metadata(card)
    assert metadata["library_name"] == "transformers" and "hf_vit_plus" in metadata["tags"]
    assert metadata["datasets"] == ["sklearn-digits"]
    [result] = metadata["model-index"][0]["results"]
    [metric] = result["metrics"]
    assert metric == {"type": "accuracy", "value": pytest.approx(pushed["eval_accuracy"]), "name": "Accuracy"}
    assert f"| eval_loss | {pushed['eval_loss']:.6g} |" in card
    assert "More information needed" not in card and "learning_rate" in card
    assert "model.safetensors" in hub_server.files("test-org/trainer-vit")


def test_save_pretrained_with_push_to_hub_uploads_the_family_card(hub_server, pushed):
    """`model.save_pretrained(dir, push_to_hub=True, repo_id=...)` went through transformers' own upload with its
    stock card; it now saves the folder and pushes with `push_to_hub`: the family's card, the push options kept."""
    files = hub_server.files("test-org/saved-lm")
    assert {"config.json", "model.safetensors", "README.md"} <= set(files)
    card = hub_server.read_file("test-org/saved-lm", "README.md").decode("utf-8")
    assert "hf_vit_plus" in _metadata(card)["tags"] and "More Information Needed" not in card
    repo = hub_server.repo("test-org/saved-lm")
    assert repo.commits[repo.branches["main"]].title == "saved and pushed"
