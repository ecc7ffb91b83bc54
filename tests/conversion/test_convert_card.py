"""`hf-vit-plus convert` writes a model card (issue 48, point 6): for each source (timm, transformers, Marian) the card
validates, names the source's Hub id as base_model (never a local path), carries the source's licence (or the one
given with --license) and, for Marian, its languages, and says that it is a conversion, by what, and how far the
converted model's logits are from the source's. A bad --license fails before any work; --no_card writes none."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from hf_vit_plus.cli import main
from hf_vit_plus.hub.card import load_card_metadata, validate_card_metadata
from tests.models.test_marian_conversion import marian_model, save_marian_folder

DIFFERENCE = re.compile(
    r"max \|difference\| of the logits on a seeded random input \(a batch of 2, both models in float32\): (\S+)\. "
)
NOT_FOUND = "**Licence: the source's licence was not found.**"


def convert(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `hf-vit-plus convert ...`."""
    capsys.readouterr()
    code = main(["convert", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_card(folder: Path) -> tuple[dict, str]:
    """(metadata, body) of `folder/README.md`, after checking that it validates and that huggingface_hub reads it:
    no model-index (no evaluation was run) and no stray model_name."""
    path = folder / "README.md"
    assert validate_card_metadata(path, require_datasets=False) == []
    card = ModelCard.load(path)
    metadata = load_card_metadata(path)
    assert "model-index" not in metadata and "model_name" not in metadata and "base_model_relation" not in metadata
    assert card.data.license == metadata["license"]
    return metadata, card.text


def logits_difference(body: str) -> float:
    [value] = DIFFERENCE.findall(body)
    return float(value)


# ------------------------------------------------------------------------------------------------- tiny sources
def tiny_vit_folder(folder: Path, card: str | None = None, name_or_path: str | None = None):
    """A tiny transformers ViTForImageClassification saved in `folder`, with an optional README.md and a config.json
    that names `name_or_path` (as transformers 4 saved it)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8,
        num_labels=3,
    )  # fmt: skip
    model = ViTForImageClassification(config).eval()
    with torch.no_grad():  # a random head: logits far from zero, so that a wrong conversion shows
        model.classifier.weight.normal_(std=0.5)
    model.save_pretrained(folder)
    if card is not None:
        (folder / "README.md").write_text(card)
    if name_or_path is not None:
        config_path = folder / "config.json"
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "_name_or_path": name_or_path}))
    return model


def tiny_timm_file(path: Path) -> Path:
    """timm's `test_vit` (a tiny ViT) at 32 x 32 with 3 classes, its state dict saved as safetensors."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("test_vit", pretrained=False, img_size=32, num_classes=3)
    torch.nn.init.normal_(model.head.weight, std=0.5)  # timm zero-initialises its head
    save_file({key: value.contiguous() for key, value in model.state_dict().items()}, path)
    return path


TIMM_FLAGS = ["--timm_name", "test_vit", "--image_size", "32", "--num_classes", "3"]
OPUS_MT_CARD = "---\nlanguage:\n- en\n- de\ntags:\n- translation\nlicense: cc-by-4.0\n---\n\n# opus-mt-en-de\n"


# ------------------------------------------------------------------------------------------------------- timm
def test_timm_card_names_the_timm_model_and_says_the_licence_was_not_found(tmp_path, capsys):
    weights = tiny_timm_file(tmp_path / "tiny.safetensors")
    code, out, err = convert(["timm", str(weights), str(tmp_path / "out"), *TIMM_FLAGS], capsys)
    assert code == 0 and "with its model card (README.md)" in out
    metadata, body = read_card(tmp_path / "out")
    assert metadata["pipeline_tag"] == "image-classification" and "base_model" not in metadata
    # nothing states the licence of a file: the default, and the card says it is one
    assert metadata["license"] == "unknown" and NOT_FOUND in body
    assert "converted from timm's `test_vit` with the weights of the file `tiny.safetensors`" in body
    assert "by `hf-vit-plus convert` (hf_vit_plus " in body and str(tmp_path) not in body
    difference = logits_difference(body)
    assert math.isfinite(difference) and difference < 1e-4
    assert f"max |difference| of the logits on a seeded random input: {difference:.2g}" in err  # the log line


def test_timm_card_takes_base_model_and_licence_from_the_flags(tmp_path, capsys):
    weights = tiny_timm_file(tmp_path / "tiny.safetensors")
    flags = ["--base_model", "timm/test_vit.r160_in1k", "--license", "mit"]
    code, _, _ = convert(["timm", str(weights), str(tmp_path / "out"), *TIMM_FLAGS, *flags], capsys)
    assert code == 0
    metadata, body = read_card(tmp_path / "out")
    assert metadata["base_model"] == "timm/test_vit.r160_in1k" and metadata["license"] == "mit"
    assert "([`timm/test_vit.r160_in1k`](https://huggingface.co/timm/test_vit.r160_in1k) on the Hub)" in body
    assert "Licence: `mit`, as given to `hf-vit-plus convert --license`." in body and NOT_FOUND not in body


def test_timm_pretrained_weights_carry_timms_licence_and_hub_id_in_the_text():
    """timm's pretrained config states the licence of timm's own weights (`CHECKPOINT=pretrained`, which downloads),
    not of a file the user gives."""
    from hf_vit_plus.conversion.cli import _timm_source

    config = {"hf_hub_id": "timm/test_vit.r160_in1k", "license": "apache-2.0"}
    pretrained = _timm_source("pretrained", "test_vit", config)
    assert pretrained.license == "apache-2.0" and pretrained.license_origin.startswith("timm's pretrained config")
    assert "timm's pretrained weights (`timm/test_vit.r160_in1k`)" in pretrained.description
    assert pretrained.hub_id is None and pretrained.base_model is None  # a timm base model only with --base_model
    assert _timm_source("weights.safetensors", "test_vit", config).license is None


# ----------------------------------------------------------------------------------------------- transformers
def test_transformers_folder_card_has_the_source_cards_licence_and_no_local_base_model(tmp_path, capsys):
    tiny_vit_folder(tmp_path / "vit", card="---\nlicense: mit\n---\n# a tiny ViT\n")
    code, _, _ = convert(["transformers", str(tmp_path / "vit"), str(tmp_path / "out")], capsys)
    assert code == 0
    metadata, body = read_card(tmp_path / "out")
    assert metadata["license"] == "mit" and "base_model" not in metadata
    assert "Licence: `mit`, as the source's model card says." in body
    assert "converted from transformers' `ViTForImageClassification` in the local folder `vit`" in body
    assert str(tmp_path) not in body
    assert 0 <= logits_difference(body) < 1e-4


def test_transformers_folder_card_takes_base_model_from_the_config_and_the_flags_win(tmp_path, capsys):
    tiny_vit_folder(tmp_path / "vit", card="---\nlicense: mit\n---\n", name_or_path="google/vit-base-patch16-224")
    assert convert(["transformers", str(tmp_path / "vit"), str(tmp_path / "from-config")], capsys)[0] == 0
    metadata, body = read_card(tmp_path / "from-config")
    assert metadata["base_model"] == "google/vit-base-patch16-224"
    assert "[`google/vit-base-patch16-224`](https://huggingface.co/google/vit-base-patch16-224)" in body
    flags = ["--base_model", "test-org/vit-source", "--license", "apache-2.0"]
    assert convert(["transformers", str(tmp_path / "vit"), str(tmp_path / "from-flags"), *flags], capsys)[0] == 0
    metadata, body = read_card(tmp_path / "from-flags")
    assert metadata["base_model"] == "test-org/vit-source" and metadata["license"] == "apache-2.0"
    assert "as given to `hf-vit-plus convert --license`" in body and NOT_FOUND not in body
    # a local path in `_name_or_path` (transformers 4 wrote the folder it loaded from) is no base model
    tiny_vit_folder(tmp_path / "local-name", name_or_path=str(tmp_path / "vit"))
    assert convert(["transformers", str(tmp_path / "local-name"), str(tmp_path / "out3")], capsys)[0] == 0
    metadata, body = read_card(tmp_path / "out3")
    assert "base_model" not in metadata and metadata["license"] == "unknown" and NOT_FOUND in body


def test_transformers_hub_id_is_the_base_model_and_its_card_gives_the_licence(tmp_path, hub_server):
    """A Hub id as CHECKPOINT (read from the loopback Hub): the card's base_model is that id, and the licence is that
    of the Hub model's own card."""
    from tests.utils import run_with_package

    tiny_vit_folder(tmp_path / "vit", card="---\nlicense: bsd-3-clause\n---\n# a tiny ViT\n")
    result = run_with_package(
        f"""
        import contextlib, io, json
        from huggingface_hub import HfApi
        from hf_vit_plus.cli import main
        api = HfApi(token="hf_x")
        api.create_repo("test-org/tiny-vit", exist_ok=True)
        api.upload_folder(repo_id="test-org/tiny-vit", folder_path={str(tmp_path / "vit")!r})
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["convert", "transformers", "test-org/tiny-vit", {str(tmp_path / "out")!r}])
        print(json.dumps({{"code": code}}))
        """,
        cwd=tmp_path,
        env=hub_server.env(),
    )
    assert result["code"] == 0
    metadata, body = read_card(tmp_path / "out")
    assert metadata["base_model"] == "test-org/tiny-vit" and metadata["license"] == "bsd-3-clause"
    assert "converted from transformers' `ViTForImageClassification` [`test-org/tiny-vit`]" in body
    assert "(https://huggingface.co/test-org/tiny-vit) by `hf-vit-plus convert`" in body  # named once
    assert 0 <= logits_difference(body) < 1e-4


# ------------------------------------------------------------------------------------------------------ Marian
def test_marian_card_has_the_opus_mt_licence_and_languages(tmp_path, capsys):
    """opus-mt models are CC-BY-4.0: the licence and languages of the folder's own card reach the converted card."""
    save_marian_folder(tmp_path / "opus-mt-en-de")
    (tmp_path / "opus-mt-en-de" / "README.md").write_text(OPUS_MT_CARD)
    # the card wins over the tokenizer config's languages
    (tmp_path / "opus-mt-en-de" / "tokenizer_config.json").write_text('{"source_lang": "eng", "target_lang": "deu"}')
    code, _, err = convert(["marian", str(tmp_path / "opus-mt-en-de"), str(tmp_path / "out")], capsys)
    assert code == 0
    metadata, body = read_card(tmp_path / "out")
    assert metadata["license"] == "cc-by-4.0" and metadata["language"] == ["en", "de"]
    assert metadata["pipeline_tag"] == "translation" and "base_model" not in metadata
    assert "the Marian translation model (transformers' `MarianMTModel`) in the local folder `opus-mt-en-de`" in body
    assert "Licence: `cc-by-4.0`, as the source's model card says." in body
    difference = logits_difference(body)
    assert math.isfinite(difference) and difference < 1e-4
    assert "max |difference| of the logits on a seeded random input" in err


def test_marian_card_without_a_source_card(tmp_path, capsys):
    """No README.md: the languages of the tokenizer config, the Hub id of config.json's `_name_or_path`, the default
    licence with the note that the source's was not found."""
    save_marian_folder(tmp_path / "marian")  # tokenizer_config.json: source_lang en, target_lang de
    config_path = tmp_path / "marian" / "config.json"
    config_path.write_text(
        json.dumps({**json.loads(config_path.read_text()), "_name_or_path": "Helsinki-NLP/opus-mt-en-de"})
    )
    assert convert(["marian", str(tmp_path / "marian"), str(tmp_path / "out")], capsys)[0] == 0
    metadata, body = read_card(tmp_path / "out")
    assert metadata["language"] == ["en", "de"] and metadata["base_model"] == "Helsinki-NLP/opus-mt-en-de"
    assert metadata["license"] == "unknown" and NOT_FOUND in body
    # a licence the Hub does not know cannot go in the card: named, and the default with the note
    (tmp_path / "marian" / "README.md").write_text("---\nlicense: CC-BY 4.0 International\n---\n")
    assert convert(["marian", str(tmp_path / "marian"), str(tmp_path / "out2")], capsys)[0] == 0
    metadata, body = read_card(tmp_path / "out2")
    assert metadata["license"] == "unknown"
    assert "**Licence: the source's licence `CC-BY 4.0 International` is not a Hub licence id.**" in body


def test_a_licence_other_with_its_name_is_carried(tmp_path, capsys):
    card = "---\nlicense: other\nlicense_name: opus-terms\nlicense_link: LICENSE\n---\n"
    tiny_vit_folder(tmp_path / "vit", card=card)
    assert convert(["transformers", str(tmp_path / "vit"), str(tmp_path / "out")], capsys)[0] == 0
    metadata, body = read_card(tmp_path / "out")
    assert (metadata["license"], metadata["license_name"], metadata["license_link"]) == (
        "other",
        "opus-terms",
        "LICENSE",
    )
    assert "Licence: `other (opus-terms)`, as the source's model card says." in body


# ------------------------------------------------------------------------------------- the measure is a measure
def test_a_wrong_conversion_shows_in_the_card_and_the_log(tmp_path, capsys, monkeypatch, caplog):
    """The reported difference is measured, not a constant: a converter that got one weight wrong gives a large
    difference in the card, and a warning."""
    from hf_vit_plus.conversion import vit

    convert_right = vit.vit_plus_from_transformers

    def convert_wrong(hf_model):
        model = convert_right(hf_model)
        with torch.no_grad():
            model.classifier.bias.add_(1.0)
        return model

    monkeypatch.setattr(vit, "vit_plus_from_transformers", convert_wrong)
    tiny_vit_folder(tmp_path / "vit")
    with caplog.at_level(logging.WARNING, logger="hf_vit_plus.conversion.cli"):
        assert convert(["transformers", str(tmp_path / "vit"), str(tmp_path / "out")], capsys)[0] == 0
    _, body = read_card(tmp_path / "out")
    assert logits_difference(body) == pytest.approx(1.0, abs=1e-4)
    assert "the conversion may be wrong" in caplog.text


def test_parity_measures_cast_both_models_to_float32():
    from transformers import MarianMTModel

    from hf_vit_plus.conversion import seq2seq_from_marian
    from hf_vit_plus.conversion.parity import seq2seq_logits_difference

    marian = marian_model().to(torch.bfloat16)
    converted = seq2seq_from_marian(marian)
    assert converted.dtype == torch.bfloat16
    assert seq2seq_logits_difference(marian, converted) < 1e-4
    assert marian.dtype == converted.dtype == torch.float32 and not marian.training
    other = MarianMTModel(marian.config)  # other weights: far apart
    assert seq2seq_logits_difference(other, converted) > 1e-2


# ------------------------------------------------------------------------------------------ flags: fail fast, skip
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--license", "apache2"], r"--license: Unknown licence 'apache2': expected a Hub licence id such as"),
        (["--license", "other"], r"--license 'other' needs a licence name"),
        (["--base_model", "./my-vit"], r"--base_model './my-vit' is not a Hub model id \('namespace/name'\)"),
    ],
)
@pytest.mark.parametrize("source", ["timm", "transformers", "marian"])
def test_bad_card_flags_fail_before_any_work(tmp_path, capsys, source, flags, message):
    """The checkpoint does not exist: the error is the flag's, so it was found before the checkpoint was read."""
    code, out, err = convert([source, str(tmp_path / "missing.safetensors"), str(tmp_path / "out"), *flags], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hf-vit-plus convert: error: "), err
    assert re.search(message, lines[0]), lines[0]
    assert out == "" and not (tmp_path / "out").exists()


def test_no_card_writes_none(tmp_path, capsys):
    tiny_vit_folder(tmp_path / "vit", card="---\nlicense: mit\n---\n")
    code, out, err = convert(["transformers", str(tmp_path / "vit"), str(tmp_path / "out"), "--no_card"], capsys)
    assert code == 0 and "model card" not in out
    assert (tmp_path / "out" / "model.safetensors").is_file() and not (tmp_path / "out" / "README.md").exists()
    assert "max |difference| of the logits on a seeded random input" in err  # measured all the same
