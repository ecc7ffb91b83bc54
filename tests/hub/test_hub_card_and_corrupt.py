"""Checkpoints go to the Hub with the family's model card, and a corrupt weights file is named when loading.

- `model.push_to_hub(repo)` (transformers' entry point, overridden by `hf_vit_plus.models.hub_mixin.HubMixin`) and
  `hf-vit-plus push DIR REPO` on a `save_pretrained` folder without README.md upload the family's card rendered
  from the config; a README.md in DIR, or already in the repository, is kept byte for byte; DIR is never written.
  One client process (real huggingface_hub, loopback server of tests/hub_server.py) does every push.
- A truncated or garbage `model.safetensors` makes `from_pretrained` (the family's classes, the Auto classes, a
  Hub download in the cache) and `hf-vit-plus convert` raise `CorruptCheckpointError` (an `OSError`) naming the
  file, with safetensors' error as `__cause__`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, PreTrainedModel

from hf_vit_plus import (
    Seq2SeqTransformerConfig,
    SparseTransformerConfig,
    SparseTransformerForCausalLM,
    ViTPlusConfig,
    ViTPlusForImageClassification,
)
from hf_vit_plus.families import get_family
from hf_vit_plus.hub.card import load_card_metadata, validate_card_metadata
from hf_vit_plus.models.hub_mixin import CorruptCheckpointError
from tests.utils import folder_snapshot, run_with_package

# family -> (tiny config, the family's name as the card states it); the classes are the family record's
FAMILIES = {
    "vit": (
        lambda: ViTPlusConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=16,
            patch_size=8, num_labels=3,
        ),
        "A Vision Transformer (ViT; Dosovitskiy et al., ICLR 2021) image classifier",
    ),
    "vit-mpp": (
        lambda: ViTPlusConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=16,
            patch_size=8,
        ),
        "A Vision Transformer (ViT; Dosovitskiy et al., ICLR 2021) encoder pre-trained by masked patch prediction",
    ),
    "seq2seq": (
        lambda: Seq2SeqTransformerConfig(
            vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        ),
        'An encoder-decoder Transformer ("Attention Is All You Need", Vaswani et al., NeurIPS 2017)',
    ),
    "sparse-lm": (
        lambda: SparseTransformerConfig(
            vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=32, attention_type="fixed", sparse_stride=8, sparse_summary_size=2,
        ),
        "A decoder-only language model with factorized sparse self-attention (Sparse Transformer",
    ),
    "image-lm": (
        lambda: SparseTransformerConfig.for_images(
            4, 4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        ),
        "An autoregressive image model with factorized sparse self-attention (Sparse Transformer",
    ),
}  # fmt: skip
OWN_README = "---\nlicense: mit\ntags:\n- mine\n---\n\n# A card written by hand\n\nÜnïcode, kept byte for byte.\r\n"
KEPT_REPO = "test-org/vit-kept-card"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """root/<family>: a `save_pretrained` folder of each family's tiny model (no README.md); root/<family>-readme:
    the same with a hand-written README.md."""
    root = tmp_path_factory.mktemp("saved")
    for family, (config, _) in FAMILIES.items():
        torch.manual_seed(0)
        get_family(family).head_class(config()).save_pretrained(root / family)
        shutil.copytree(root / family, root / f"{family}-readme")
        (root / f"{family}-readme" / "README.md").write_bytes(OWN_README.encode("utf-8"))
    return root


# ------------------------------------------------------------------------------------------------ the model card
@pytest.fixture(scope="module")
def pushed(hub_server, saved):
    """Every push of this module, in one client process."""
    before = {family: folder_snapshot(saved / family) for family in FAMILIES}
    code = f"""
    import contextlib, io, json, os
    from pathlib import Path
    from huggingface_hub import HfApi
    from transformers import AutoModelForImageClassification
    from hf_vit_plus.cli import main
    from hf_vit_plus.families import FAMILIES

    root = Path({str(saved)!r})
    out = {{}}
    for family, record in FAMILIES.items():
        model = record.auto_head_class.from_pretrained(root / family)
        info = model.push_to_hub(f"test-org/{{family}}-model")
        with contextlib.redirect_stdout(io.StringIO()):
            cli = main(["push", str(root / family), f"test-org/{{family}}-cli"])
            cli_readme = main(["push", str(root / f"{{family}}-readme"), f"test-org/{{family}}-cli-readme"])
        out[family] = {{"oid": info.oid, "cli": cli, "cli_readme": cli_readme}}

    # a README.md already in the repository is kept; tags the caller asks for are added to it
    api = HfApi()
    api.create_repo({KEPT_REPO!r})
    api.upload_file(path_or_fileobj={OWN_README.encode("utf-8")!r}, path_in_repo="README.md", repo_id={KEPT_REPO!r})
    model = AutoModelForImageClassification.from_pretrained(root / "vit")
    model.push_to_hub({KEPT_REPO!r}, commit_message="weights only")
    out["kept_files"] = sorted(api.list_repo_files({KEPT_REPO!r}))
    model.push_to_hub({KEPT_REPO!r}, revision="tagged", tags=["extra-tag"])

    # a corrupt file in the Hub cache is named too
    cached = Path(api.hf_hub_download("test-org/vit-model", "model.safetensors"))
    cached.resolve().write_bytes(cached.resolve().read_bytes()[:100])
    try:
        AutoModelForImageClassification.from_pretrained("test-org/vit-model")
        out["cache"] = None
    except OSError as err:
        out["cache"] = {{"type": type(err).__name__, "message": str(err), "path": str(cached),
                         "cause": type(err.__cause__).__name__}}

    # last (it registers the copy's attention kernels in this process): the model code loaded as remote code
    import sys
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    from hf_vit_plus.integrations import push_with_family_card

    remote = get_class_from_dynamic_module("modeling_vit_plus.ViTPlusForImageClassification", str(root / "vit"))
    mixin = sys.modules[remote.__module__.rsplit(".", 1)[0] + ".hub_mixin"]
    out["remote_copy"] = {{"is_a_copy": mixin.__name__ != "hf_vit_plus.models.hub_mixin",
                           "has_the_package_hook": mixin.push_to_hub_hook() is push_with_family_card}}
    print(json.dumps(out))
    """
    result = run_with_package(code, saved, hub_server.env())
    result["unchanged"] = {family: folder_snapshot(saved / family) == before[family] for family in FAMILIES}
    return result


def _assert_family_card(text: str, family: str, repo_id: str, tmp_path: Path) -> None:
    spec, name = get_family(family).card, FAMILIES[family][1]
    assert "[More Information Needed]" not in text and "{{" not in text and "{%" not in text
    assert name in text
    assert "No evaluation results were recorded for this checkpoint: it has not been evaluated" in text
    assert "training data, training procedure and evaluation were not recorded" in text
    assert f'from_pretrained("{repo_id}", trust_remote_code=True)' in text
    card = tmp_path / f"{family}.md"
    card.write_text(text, encoding="utf-8")
    meta = load_card_metadata(card)
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == spec.pipeline_tag
    assert meta["tags"][: len(spec.tags)] == list(spec.tags)
    assert "model-index" not in meta and "datasets" not in meta
    assert validate_card_metadata(card, require_datasets=False) == []


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_push_to_hub_uploads_the_family_card(hub_server, pushed, family, tmp_path):
    repo_id = f"test-org/{family}-model"
    assert hub_server.repo(repo_id).branches["main"] == pushed[family]["oid"]
    files = hub_server.files(repo_id)
    assert {"config.json", "model.safetensors", "README.md"} <= set(files)
    assert "hub_mixin.py" in files  # the mixin ships with the model code (remote code)
    _assert_family_card(hub_server.read_file(repo_id, "README.md").decode("utf-8"), family, repo_id, tmp_path)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cli_push_of_a_folder_without_readme_uploads_the_card_and_leaves_the_folder(
    hub_server, pushed, saved, family, tmp_path
):
    repo_id = f"test-org/{family}-cli"
    assert pushed[family]["cli"] == 0
    _assert_family_card(hub_server.read_file(repo_id, "README.md").decode("utf-8"), family, repo_id, tmp_path)
    assert not (saved / family / "README.md").exists()
    assert pushed["unchanged"][family]
    assert hub_server.read_file(repo_id, "model.safetensors") == (saved / family / "model.safetensors").read_bytes()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cli_push_keeps_the_folders_readme(hub_server, pushed, saved, family):
    assert pushed[family]["cli_readme"] == 0
    uploaded = hub_server.read_file(f"test-org/{family}-cli-readme", "README.md")
    assert uploaded == (saved / f"{family}-readme" / "README.md").read_bytes() == OWN_README.encode("utf-8")


def test_push_to_hub_keeps_a_readme_the_repository_has(hub_server, pushed):
    repo = hub_server.repo(KEPT_REPO)
    assert "model.safetensors" in pushed["kept_files"]
    assert hub_server.read_file(KEPT_REPO, "README.md") == OWN_README.encode("utf-8")
    assert repo.commits[repo.branches["main"]].title == "weights only"
    # asked for a tag: the same card, with the tag appended (transformers' behaviour)
    tagged = hub_server.read_file(KEPT_REPO, "README.md", revision="tagged").decode("utf-8")
    assert "# A card written by hand" in tagged and "Ünïcode, kept byte for byte." in tagged
    assert yaml.safe_load(tagged.split("---")[1]) == {"license": "mit", "tags": ["mine", "extra-tag"]}


def test_push_to_hub_goes_through_the_hook_the_package_sets(pushed):
    """`import hf_vit_plus` hands the models its push (models/ imports nothing of hub/); a copy of the model code
    loaded as remote code in a process that imported the package takes the package's hook too."""
    from hf_vit_plus.integrations import push_with_family_card
    from hf_vit_plus.models import hub_mixin

    assert hub_mixin.push_to_hub_hook() is push_with_family_card
    assert pushed["remote_copy"] == {"is_a_copy": True, "has_the_package_hook": True}


def test_push_to_hub_without_the_package_is_transformers_own(monkeypatch, saved):
    """Remote code on a machine without hf_vit_plus: no hook is set, and the mixin falls back to transformers' push."""
    from hf_vit_plus.models import hub_mixin

    calls = []
    monkeypatch.setattr(hub_mixin, "_push_to_hub_hook", None)  # as in a process that never imported the package
    monkeypatch.setattr(PreTrainedModel, "push_to_hub", lambda self, repo_id, **kw: calls.append((repo_id, kw)))
    model = ViTPlusForImageClassification.from_pretrained(saved / "vit")
    model.push_to_hub("test-org/x", revision="v1", tags=["a"])
    assert calls == [
        (
            "test-org/x",
            dict(
                commit_message=None, commit_description=None, private=None, token=None, revision="v1",
                create_pr=False, max_shard_size="50GB", tags=["a"],
            ),
        )
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------- corrupt safetensors
def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\x8fnot safetensors at all" * 40)


def _assert_names(err: BaseException, path: Path) -> None:
    assert isinstance(err, CorruptCheckpointError) and isinstance(err, OSError)
    assert str(path) in str(err) and "corrupt or truncated" in str(err)
    assert isinstance(err.__cause__, SafetensorError)
    assert err.paths == [path]


@pytest.mark.parametrize("how", ["truncated", "garbage"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_corrupt_weights_are_named_by_from_pretrained(saved, tmp_path, family, how):
    folder = Path(shutil.copytree(saved / family, tmp_path / family))
    _corrupt(folder / "model.safetensors", how)
    record = get_family(family)
    for loader in (record.head_class, record.auto_head_class):
        with pytest.raises(CorruptCheckpointError) as info:
            loader.from_pretrained(folder)
        _assert_names(info.value, folder / "model.safetensors")


def test_a_corrupt_shard_is_the_one_named(saved, tmp_path):
    model = SparseTransformerForCausalLM.from_pretrained(saved / "sparse-lm")
    model.save_pretrained(tmp_path, max_shard_size="10KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 2
    _corrupt(shards[1], "truncated")
    with pytest.raises(CorruptCheckpointError) as info:
        AutoModelForCausalLM.from_pretrained(tmp_path)
    _assert_names(info.value, shards[1])
    assert str(shards[0]) not in str(info.value)


def test_a_corrupt_file_in_the_hub_cache_is_named(pushed):
    cache = pushed["cache"]
    assert cache is not None and cache["type"] == "CorruptCheckpointError" and cache["cause"] == "SafetensorError"
    assert cache["path"] in cache["message"] and "force_download=True" in cache["message"]


def test_other_loading_errors_pass_through(saved, tmp_path):
    folder = Path(shutil.copytree(saved / "vit", tmp_path / "vit"))
    (folder / "model.safetensors").unlink()
    with pytest.raises(OSError) as info:
        ViTPlusForImageClassification.from_pretrained(folder)
    assert not isinstance(info.value, CorruptCheckpointError)


def test_convert_names_a_corrupt_timm_file(tmp_path):
    pytest.importorskip("timm")
    from hf_vit_plus.conversion.cli import convert_checkpoint

    bad = tmp_path / "timm.safetensors"
    bad.write_bytes(b"\x8fnot safetensors at all" * 40)
    with pytest.raises(CorruptCheckpointError) as info:
        convert_checkpoint("timm", str(bad), tmp_path / "out", timm_name="vit_tiny_patch16_224", num_classes=3)
    _assert_names(info.value, bad)
    assert not (tmp_path / "out").exists()


def test_convert_names_a_corrupt_transformers_checkpoint(tmp_path):
    from transformers import ViTConfig, ViTForImageClassification

    from hf_vit_plus.conversion.cli import convert_checkpoint

    config = ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=16, patch_size=8
    )
    ViTForImageClassification(config).save_pretrained(tmp_path / "hf")
    _corrupt(tmp_path / "hf" / "model.safetensors", "truncated")
    with pytest.raises(CorruptCheckpointError) as info:
        convert_checkpoint("transformers", str(tmp_path / "hf"), tmp_path / "out")
    _assert_names(info.value, tmp_path / "hf" / "model.safetensors")


def test_cli_push_card_needs_a_readable_config(tmp_path, monkeypatch, caplog):
    """A folder without README.md: its config.json must be JSON (checked before any request); a model type of
    another project gets no card, with a warning."""
    from hf_vit_plus.hub import push as push_module

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    (folder / "config.json").write_text("{not json")
    monkeypatch.setattr(push_module, "HfApi", lambda *a, **k: pytest.fail("reached the Hub client"))
    with pytest.raises(ValueError, match="config.json' is not valid JSON"):
        push_module.push_checkpoint(folder, "test-org/x")
    (folder / "config.json").write_text('{"model_type": "bert"}')
    with caplog.at_level("WARNING", logger=push_module.__name__):
        assert push_module._card_for_folder(folder, "test-org/x") is None
    assert "'bert' is not one of hf_vit_plus's" in caplog.text
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
