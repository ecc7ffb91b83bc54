"""A builder of the datasets library (`json`, `csv`, `imagefolder`, ...) or a local path is never written into a card
as a Hub data set: the card names the local files, with no `datasets` entry and no model-index (whose data set must
be a Hub id). A model trained by transformers' example scripts on `--train_file x.json` got
`[**json**](https://huggingface.co/datasets/json)` and `datasets: - json` (the Trainer's data set reports the
builder's name as its `info.dataset_name`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification
from hf_vit_plus.hub.card import DATASETS_BUILDERS, hub_dataset_id, local_data_name, write_model_card

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


def _metadata(card: str) -> dict:
    return yaml.safe_load(card.split("---")[1])


def _tiny_vit() -> ViTPlusForImageClassification:
    torch.manual_seed(0)
    return ViTPlusForImageClassification(ViTPlusConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                       intermediate_size=64, image_size=16, patch_size=8,
                                                       num_labels=2))  # fmt: skip


def _assert_local(card: str, builder: str | None) -> None:
    metadata = _metadata(card)
    assert "datasets" not in metadata and "model-index" not in metadata, metadata
    assert "huggingface.co/datasets/" not in card
    if builder is not None:
        assert local_data_name(builder) in card


@pytest.mark.parametrize("builder", sorted(DATASETS_BUILDERS))
def test_a_builder_name_is_never_a_hub_data_set(builder, tmp_path):
    assert hub_dataset_id(builder) is None and hub_dataset_id(builder.upper()) is None
    model = _tiny_vit()
    card = write_model_card(tmp_path, family="vit", model_config=model.config, training_args={"learning_rate": 1e-3},
                            eval_results={"eval_accuracy": 0.5}, dataset_name=builder).read_text()  # fmt: skip
    _assert_local(card, builder)


@pytest.mark.parametrize("name", ["data/train.jsonl", "./pairs", "/srv/data/images", "~/corpus.txt", "train.csv"])
def test_a_path_is_never_a_hub_data_set(name, tmp_path):
    assert hub_dataset_id(name) is None
    card = write_model_card(tmp_path, family="vit", model_config=_tiny_vit().config, training_args={},
                            eval_results={"eval_accuracy": 0.5}, dataset_name=name).read_text()  # fmt: skip
    _assert_local(card, None)


def test_hub_ids_stay_hub_ids(tmp_path):
    assert hub_dataset_id("beans") == "beans"
    assert hub_dataset_id("zalando-datasets/fashion_mnist") == "zalando-datasets/fashion_mnist"
    card = write_model_card(tmp_path, family="vit", model_config=_tiny_vit().config, training_args={},
                            eval_results={"eval_accuracy": 0.5}, dataset_name="beans").read_text()  # fmt: skip
    assert _metadata(card)["datasets"] == ["beans"] and "https://huggingface.co/datasets/beans" in card


def test_a_builder_given_as_the_data_set_id_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"dataset_id 'json' names local files .* pass dataset_id=None"):
        write_model_card(tmp_path, family="vit", model_config=_tiny_vit().config, training_args={},
                         eval_results={}, dataset_name="my data", dataset_id="json")  # fmt: skip


def _json_rows(folder) -> str:
    g = torch.Generator().manual_seed(0)
    path = folder / "train.json"
    with path.open("w") as file:
        for i in range(8):
            row = {"pixel_values": torch.randn(3, 16, 16, generator=g).tolist(), "labels": i % 2}
            file.write(json.dumps(row) + "\n")
    return str(path)


def _image_folder(folder) -> str:
    for label in ("cat", "dog"):
        (folder / "images" / label).mkdir(parents=True)
        for i in range(4):
            colour = (40 * i, 0, 200 if label == "cat" else 0)
            Image.new("RGB", (16, 16), colour).save(folder / "images" / label / f"{i}.png")
    return str(folder / "images")


def _to_tensors(batch: dict) -> dict:
    images = [torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255) for image in batch["image"]]
    return {"pixel_values": [image.permute(2, 0, 1) for image in images], "labels": batch["label"]}  # (3, H, W)


@pytest.mark.parametrize("builder", ["json", "imagefolder"])
def test_a_trainer_card_of_local_files_names_them_and_no_hub_data_set(builder, tmp_path):
    """What transformers' example scripts do with --train_file / --train_dir: `load_dataset(builder, ...)`, Trainer,
    `create_model_card`; with the package imported the card is the family's."""
    from datasets import load_dataset
    from transformers import Trainer, TrainingArguments

    cache = str(tmp_path / "cache")
    if builder == "json":
        data = load_dataset("json", data_files=_json_rows(tmp_path), split="train", cache_dir=cache)
        data = data.with_format("torch")
    else:
        data = load_dataset("imagefolder", data_dir=_image_folder(tmp_path), split="train", cache_dir=cache)
        data = data.with_transform(_to_tensors)
    assert data.info.dataset_name == builder  # what the card used to take for a Hub id
    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=1, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, save_strategy="no", remove_unused_columns=False)  # fmt: skip
    trainer = Trainer(model=_tiny_vit(), args=args, train_dataset=data, eval_dataset=data)
    trainer.train()
    trainer.evaluate()
    trainer.create_model_card()
    card = (tmp_path / "run" / "README.md").read_text()
    assert "hf_vit_plus" in card  # the family's card, not transformers' stock one
    _assert_local(card, builder)
