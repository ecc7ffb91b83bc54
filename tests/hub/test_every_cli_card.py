"""Every kind of card the command line writes passes the offline checks of the Hub's metadata spec (issue 48): a
trained model of each family, an adapter, a converted checkpoint and a card rendered from a config alone.

The checks: `validate_card_metadata` (keys and types, a Hub task, a Hub licence id, a model-index whose data set is a
Hub id listed in `datasets`, readable metric names, no loss, no stray `model_name`), huggingface_hub's own reading
of the card (`ModelCard.load`, the model-index through `model_index_to_eval_results` with every metric kept), and the
card's body (its relative figure links exist, its framework versions are there)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results

from hf_vit_plus.cli import main
from hf_vit_plus.hub.card import (
    HUB_LICENSES,
    PIPELINE_TAGS,
    load_card_metadata,
    model_card_from_config,
    validate_card_metadata,
)
from tests.utils import TINY_VIT_OVERRIDES

TINY = {
    "vit": TINY_VIT_OVERRIDES,
    "vit-mpp": TINY_VIT_OVERRIDES,
    "image-lm": TINY_VIT_OVERRIDES,
    "seq2seq": "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64",
    "sparse-lm": "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,"
    "max_position_embeddings=64,sparse_stride=8,sparse_summary_size=2",
}
KINDS = [*(f"train {family}" for family in TINY), "train vit --lora_r", "convert transformers", "config only"]


def _train(folder: Path, family: str, *extra: str) -> None:
    argv = ["train", family, "--output_dir", str(folder), "--max_steps", "2", "--max_train_samples", "32",
            "--max_eval_samples", "16", "--per_device_train_batch_size", "8", "--report_to", "none",
            "--save_steps", "none", "--config_overrides", TINY[family], *extra]  # fmt: skip
    if family == "sparse-lm":
        argv += ["--block_size", "64"]
    assert main(argv) == 0, family


@pytest.fixture(scope="module")
def cards(tmp_path_factory) -> dict[str, Path]:
    """The card (README.md) of each kind, written by the command line (config only: by the push's renderer)."""
    root = tmp_path_factory.mktemp("cli_cards")
    written = {}
    for family in TINY:
        _train(root / family, family)
        written[f"train {family}"] = root / family / "README.md"
    adapter = root / "adapter"
    assert main(["train", "vit", "--model_name_or_path", str(root / "vit"), "--lora_r", "4", "--output_dir",
                 str(adapter), "--max_steps", "2", "--max_train_samples", "32", "--max_eval_samples", "16",
                 "--per_device_train_batch_size", "8", "--report_to", "none",
                 "--save_steps", "none"]) == 0  # fmt: skip
    written["train vit --lora_r"] = adapter / "README.md"
    from tests.conversion.test_convert_card import tiny_vit_folder

    tiny_vit_folder(root / "source")
    assert main(["convert", "transformers", str(root / "source"), str(root / "converted")]) == 0
    written["convert transformers"] = root / "converted" / "README.md"
    config_only = root / "config-only"
    config_only.mkdir()
    config = json.loads((root / "seq2seq" / "config.json").read_text())
    card = model_card_from_config(config, repo_id="test-org/s2s")
    card.save(config_only / "README.md")
    written["config only"] = config_only / "README.md"
    return written


@pytest.mark.parametrize("kind", KINDS)
def test_every_cli_card_passes_the_hub_metadata_checks(cards, kind):
    path = cards[kind]
    assert validate_card_metadata(path, require_datasets=False) == [], kind
    metadata = load_card_metadata(path)
    assert metadata["license"] in HUB_LICENSES and metadata["pipeline_tag"] in PIPELINE_TAGS
    assert metadata["library_name"] == ("peft" if "lora" in kind else "transformers")
    assert "model_name" not in metadata
    card = ModelCard.load(path)  # huggingface_hub's own reading: raises on a model-index it cannot read
    if "model-index" in metadata:
        _, results = model_index_to_eval_results(metadata["model-index"])
        assert len(results) == len(card.data.eval_results) > 0
        assert {result.dataset_type for result in results} <= set(metadata["datasets"])
    else:
        assert card.data.eval_results is None
    body = card.text
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", body):  # relative figure links resolve in the folder
        assert "://" in link or (path.parent / link).is_file(), (kind, link)
    if kind != "train vit --lora_r":
        assert "## Framework versions" in body and "- torch " in body, kind
    if kind.startswith("train") and "lora" not in kind:
        assert "## Training data" in body and "## Compute" in body and "## Environmental impact" in body, kind
