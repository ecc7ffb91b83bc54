"""Push checkpoints to a Hub and pull them back, over real HTTP on loopback (tests/hub_server.py).

The push and the pulls run the real huggingface_hub client in fresh processes whose HF_ENDPOINT points at the
loopback server (HF_ENDPOINT is read when huggingface_hub is imported). One push process does every push of
this module (main, v2 through the CLI, the failing pushes), to keep the number of torch imports low.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusImageProcessor
from hf_vit_plus.hub import push as push_module
from hf_vit_plus.hub.card import write_model_card
from hf_vit_plus.hub.figures import plot_training_curves
from hf_vit_plus.hub.push import push_checkpoint
from tests.utils import folder_snapshot, run_with_package, run_without_package

REPO = "test-org/vit-tiny"
FAULT_REPO = "test-org/vit-fault"
PRIVATE_REPO = "test-org/vit-private"
TOKEN = "hf_test_token_123"
LOG_HISTORY = [
    {"loss": 1.2, "step": 1},
    {"loss": 0.9, "step": 2},
    {"eval_loss": 0.95, "eval_accuracy": 0.5, "eval_runtime": 0.1, "step": 2},
]


def _save_checkpoint(folder: Path, seed: int) -> ViTPlusForImageClassification:
    torch.manual_seed(seed)
    config = ViTPlusConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_labels=3,
        id2label={0: "cat", 1: "dog", 2: "owl"},
        label2id={"cat": 0, "dog": 1, "owl": 2},
    )
    model = ViTPlusForImageClassification(config).eval()
    torch.nn.init.normal_(model.classifier.weight, std=0.5)
    model.save_pretrained(folder)
    ViTPlusImageProcessor.from_model_config(config).save_pretrained(folder)
    figure = plot_training_curves(LOG_HISTORY, folder / "figures" / "training_curves.png")
    write_model_card(
        folder,
        family="vit",
        model_config=config,
        training_args={"learning_rate": 3e-4, "seed": seed},
        eval_results={"eval_accuracy": 0.5, "eval_loss": 0.95},
        dataset_name="sklearn-digits",
        figures=[figure],
        repo_id=REPO,
    )
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Three tiny checkpoints (main, v2, and one for the failing pushes), an image, and expected logits."""
    root = tmp_path_factory.mktemp("hub_checkpoints")
    image = Image.fromarray((np.random.default_rng(0).random((40, 50, 3)) * 255).astype(np.uint8))
    image.save(root / "image.png")
    expected = {}
    for name, seed in (("main", 0), ("v2", 1), ("fault", 2)):
        model = _save_checkpoint(root / name, seed)
        pixel_values = ViTPlusImageProcessor.from_pretrained(root / name)(images=image, return_tensors="pt")
        with torch.no_grad():
            expected[name] = model(pixel_values["pixel_values"]).logits[0].tolist()
    return root, expected


@pytest.fixture(scope="module")
def pushed(hub_server, checkpoints):
    """Every push of this module, in one client process: main with push_checkpoint, v2 with the CLI, then three
    pushes of another checkpoint to FAULT_REPO with injected faults (LFS upload, then commit, then none)."""
    root, _ = checkpoints
    fault_weights = (root / "fault" / "model.safetensors").read_bytes()
    hub_server.fail_next("lfs_upload", status=403, match=hashlib.sha256(fault_weights).hexdigest())
    hub_server.fail_next("commit", status=500, match=FAULT_REPO)
    before = folder_snapshot(root / "fault")
    try:
        result = run_with_package(
            f"""
            import contextlib, io, json
            from huggingface_hub import HfApi
            from hf_vit_plus.cli import main
            from hf_vit_plus.hub.push import HubPushError, push_checkpoint

            out = {{}}
            info = push_checkpoint({str(root / "main")!r}, {REPO!r})
            out["main"] = {{"url": str(info), "oid": info.oid}}
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                code = main(["push", {str(root / "v2")!r}, {REPO!r}, "--revision", "v2", "--token", {TOKEN!r},
                             "--commit_message", "v2: retrained weights"])
            out["cli"] = {{"code": code, "stdout": stdout.getvalue()}}
            with contextlib.redirect_stdout(io.StringIO()):
                out["cli_private"] = main(["push", {str(root / "main")!r}, {PRIVATE_REPO!r}, "--private",
                                           "--token", {TOKEN!r}])
            out["faults"] = []
            for attempt in range(3):
                try:
                    info = push_checkpoint({str(root / "fault")!r}, {FAULT_REPO!r})
                    out["faults"].append({{"ok": True, "oid": info.oid}})
                except HubPushError as err:
                    remote = HfApi().model_info({FAULT_REPO!r})
                    out["faults"].append({{
                        "ok": False, "step": err.step, "message": str(err),
                        "remote_files": [s.rfilename for s in remote.siblings],
                    }})
            api = HfApi()
            out["refs"] = {{b.name: b.target_commit for b in api.list_repo_refs({REPO!r}).branches}}
            out["files_v2"] = sorted(api.list_repo_files({REPO!r}, revision="v2"))
            out["tree_figures"] = [
                [e.path, type(e).__name__, getattr(e, "lfs", None) is not None]
                for e in api.list_repo_tree({REPO!r}, path_in_repo="figures", revision="v2")
            ]
            print(json.dumps(out))
            """,
            cwd=root,
            env=hub_server.env(),
        )
    finally:
        hub_server.clear_faults()
    result["fault_folder_unchanged"] = folder_snapshot(root / "fault") == before
    return result


def _pull_code(repo_id: str, image: Path, with_package: bool) -> str:
    return f"""
    import json
    import sys
    from pathlib import Path

    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification
    {"import hf_vit_plus" if with_package else ""}

    image = Image.open({str(image)!r})
    out = {{"package_loaded": "hf_vit_plus" in sys.modules}}
    loads = [("main", None, True), ("v2", "v2", True)]
    if {with_package}:
        loads.append(("main_installed_classes", None, False))
        from huggingface_hub import snapshot_download

        snapshot = snapshot_download({repo_id!r}, revision="v2")
        out["snapshot_v2"] = {{
            "files": sorted(p.relative_to(snapshot).as_posix() for p in Path(snapshot).rglob("*") if p.is_file()),
            "weights": open(Path(snapshot) / "model.safetensors", "rb").read().hex(),
        }}
    for name, revision, trust in loads:
        kwargs = {{"revision": revision, "trust_remote_code": trust}}
        model = AutoModelForImageClassification.from_pretrained({repo_id!r}, **kwargs).eval()
        processor = AutoImageProcessor.from_pretrained({repo_id!r}, **kwargs)
        with torch.no_grad():
            logits = model(**processor(images=image, return_tensors="pt")).logits[0].tolist()
        mixin = sys.modules[type(model).__module__.rsplit(".", 1)[0] + ".hub_mixin"]
        out[name] = {{"logits": logits, "module": type(model).__module__, "labels": model.config.id2label,
                      "card_hook": mixin.push_to_hub_hook() is not None}}
    print(json.dumps(out))
    """


def _assert_pulled(result: dict, expected: dict) -> None:
    for name in ("main", "v2"):
        assert np.allclose(result[name]["logits"], expected[name], atol=1e-5), name
        assert result[name]["labels"] == {"0": "cat", "1": "dog", "2": "owl"}
    assert not np.allclose(result["main"]["logits"], result["v2"]["logits"], atol=1e-3)


def test_push_main_and_branch_have_their_own_files(hub_server, pushed, checkpoints):
    root, _ = checkpoints
    assert len(pushed["main"]["oid"]) == 40 and all(c in "0123456789abcdef" for c in pushed["main"]["oid"])
    assert pushed["main"]["url"].endswith(f"/{REPO}/commit/{pushed['main']['oid']}")
    repo = hub_server.repo(REPO)
    assert set(repo.branches) == {"main", "v2"}
    assert repo.branches["main"] == pushed["main"]["oid"] and repo.branches["v2"] != repo.branches["main"]
    main_files = hub_server.files(REPO, "main")
    for name in ("config.json", "model.safetensors", "preprocessor_config.json", "README.md",
                 "modeling_vit_plus.py", "configuration_vit_plus.py", "image_processing_vit_plus.py",
                 "figures/training_curves.png"):  # fmt: skip
        assert name in main_files, name
    assert main_files["model.safetensors"].is_lfs and main_files["figures/training_curves.png"].is_lfs
    assert not main_files["config.json"].is_lfs
    for revision in ("main", "v2"):
        local = (root / revision / "model.safetensors").read_bytes()
        assert hub_server.read_file(REPO, "model.safetensors", revision) == local
    assert hub_server.read_file(REPO, "README.md") == (root / "main" / "README.md").read_bytes()
    # what the client reads back through the refs and tree routes
    assert pushed["refs"] == repo.branches
    assert pushed["files_v2"] == sorted(hub_server.files(REPO, "v2"))
    assert pushed["tree_figures"] == [["figures/training_curves.png", "RepoFile", True]]


def test_cli_push_to_a_new_branch_with_token_and_message(hub_server, pushed):
    assert pushed["cli"]["code"] == 0
    v2_oid = hub_server.repo(REPO).branches["v2"]
    assert pushed["cli"]["stdout"].strip().endswith(f"/commit/{v2_oid}")
    assert hub_server.repo(REPO).commits[v2_oid].title == "v2: retrained weights"
    branch_calls = [r for r in hub_server.requests if r["route"] == "create_branch" and REPO in r["path"]]
    assert branch_calls and all(r["authorization"] == f"Bearer {TOKEN}" for r in branch_calls)
    assert pushed["cli_private"] == 0
    assert hub_server.repo(PRIVATE_REPO).private and not hub_server.repo(REPO).private
    assert "model.safetensors" in hub_server.files(PRIVATE_REPO)


def test_hub_error_mid_push_names_the_step_and_leaves_the_folder(pushed):
    lfs_fail, commit_fail, ok = pushed["faults"]
    assert lfs_fail["ok"] is False and lfs_fail["step"] == "LFS upload of model.safetensors"
    assert "model.safetensors" in lfs_fail["message"] and "403" in lfs_fail["message"]
    assert commit_fail["ok"] is False and commit_fail["step"] == "commit"
    assert "failed at step 'commit'" in commit_fail["message"] and "injected fault on commit" in commit_fail["message"]
    assert "local folder was not modified" in commit_fail["message"]
    # nothing was committed by the failed pushes: the repository still holds only its initial commit
    assert lfs_fail["remote_files"] == [".gitattributes"] and commit_fail["remote_files"] == [".gitattributes"]
    assert ok["ok"] is True and len(ok["oid"]) == 40
    assert pushed["fault_folder_unchanged"]


def test_pull_by_repo_id_and_revision_without_the_package(hub_server, pushed, checkpoints, tmp_path):
    root, expected = checkpoints
    result = run_without_package(_pull_code(REPO, root / "image.png", with_package=False), tmp_path, hub_server.env())
    assert result["package_loaded"] is False
    assert result["main"]["module"].startswith("transformers_modules.")
    assert not result["main"]["card_hook"]  # push_to_hub is transformers' own
    _assert_pulled(result, expected)


def test_pull_by_repo_id_and_revision_with_the_package(hub_server, pushed, checkpoints, tmp_path):
    root, expected = checkpoints
    result = run_with_package(_pull_code(REPO, root / "image.png", with_package=True), tmp_path, hub_server.env())
    assert result["package_loaded"] is True
    assert result["main_installed_classes"]["module"] == "hf_vit_plus.models.modeling_vit_plus"
    assert result["main"]["card_hook"] and result["main_installed_classes"]["card_hook"]  # the family's card
    assert np.allclose(result["main_installed_classes"]["logits"], expected["main"], atol=1e-5)
    _assert_pulled(result, expected)
    # every request of the module's clients reached a route of the server, and none hit a server bug
    assert [r for r in hub_server.requests if r["route"] in ("unrouted", "?") or r["error"]] == []
    snapshot = result["snapshot_v2"]
    assert snapshot["files"] == sorted(hub_server.files(REPO, "v2"))
    assert bytes.fromhex(snapshot["weights"]) == (root / "v2" / "model.safetensors").read_bytes()


def test_pickled_weights_are_refused_before_any_request(tmp_path, monkeypatch, capsys):
    def no_network(*args, **kwargs):
        raise AssertionError("push_checkpoint reached the Hub client")

    monkeypatch.setattr(push_module, "HfApi", no_network)
    folder = tmp_path / "ckpt"
    (folder / "checkpoint-10").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    (folder / "checkpoint-10" / "optimizer.pt").write_bytes(b"\x80\x04K.")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K.")
    with pytest.raises(ValueError, match="pickled") as info:
        push_checkpoint(folder, REPO)
    assert "pytorch_model.bin" in str(info.value) and "checkpoint-10/optimizer.pt" in str(info.value)

    from hf_vit_plus.cli import main

    assert main(["push", str(folder), REPO]) == 2  # a user error: status 2, as argparse
    assert "Refusing to push pickled files" in capsys.readouterr().err
    left = sorted(p.name for p in folder.iterdir())
    assert left == ["checkpoint-10", "config.json", "model.safetensors", "pytorch_model.bin"]


@pytest.mark.parametrize(
    "files, repo_id, match",
    [
        (None, REPO, "does not exist"),
        ({"model.safetensors": b"x"}, REPO, "no config.json"),
        ({"config.json": b"{}"}, REPO, "no \\*.safetensors"),
        ({"config.json": b"{}", "model.safetensors": b"x"}, "no-namespace", "namespace/name"),
    ],
)
def test_bad_folders_and_repo_ids_are_refused(tmp_path, monkeypatch, files, repo_id, match):
    monkeypatch.setattr(push_module, "HfApi", lambda *a, **k: pytest.fail("reached the Hub client"))
    folder = tmp_path / "ckpt"
    if files is not None:
        folder.mkdir()
        for name, content in files.items():
            (folder / name).write_bytes(content)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        push_checkpoint(folder, repo_id)


def test_server_answers_misses_with_hub_error_codes(hub_server):
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy

    def head(path: str) -> urllib.error.HTTPError:
        with pytest.raises(urllib.error.HTTPError) as info:
            opener.open(urllib.request.Request(hub_server.url + path, method="HEAD"), timeout=10)
        return info.value

    hub_server.state.create_repo("model", "test-org/misses", private=False)
    assert head("/test-org/nope/resolve/main/config.json").headers["X-Error-Code"] == "RepoNotFound"
    assert head("/test-org/misses/resolve/nope/config.json").headers["X-Error-Code"] == "RevisionNotFound"
    miss = head("/test-org/misses/resolve/main/config.json")
    assert miss.code == 404 and miss.headers["X-Error-Code"] == "EntryNotFound"
    assert miss.headers["X-Repo-Commit"] == hub_server.repo("test-org/misses").branches["main"]
    hub_server.state.create_repo("model", "test-org/secret", private=True)
    hidden = head("/test-org/secret/resolve/main/.gitattributes")  # no token: a private repo is not there
    assert hidden.code == 401 and hidden.headers["X-Error-Code"] == "RepoNotFound"
