"""`hf-vit-plus train ... --push_to_hub` checks its target before training and, when the final push fails, says in
one line where the model is and how to retry: over real HTTP on loopback (tests/hub_server.py), in fresh processes
(HF_ENDPOINT is read when huggingface_hub is imported)."""

from __future__ import annotations

import pytest

from tests.utils import TINY_VIT_OVERRIDES, run_with_package

GOOD, BAD, READ_ONLY = "hf_good_token", "hf_expired_token", "hf_read_token"

RUN = """
import contextlib, io, json, os, pathlib, time
from hf_vit_plus.cli import main

def train(name, token, *extra):
    os.environ["HF_TOKEN"] = token
    err = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", "vit", "--output_dir", name, "--config_overrides", {overrides!r}, "--max_steps", "2",
                     "--max_train_samples", "32", "--max_eval_samples", "16", "--per_device_train_batch_size", "16",
                     "--report_to", "none", "--save_steps", "1", "--write_card", "false", "--push_to_hub",
                     "--hub_model_id", *extra])
    return {{"code": code, "stderr": err.getvalue(), "seconds": time.perf_counter() - start,
            "saved": pathlib.Path(name, "model.safetensors").is_file()}}
"""


@pytest.fixture
def tokens(hub_server):
    hub_server.invalid_tokens.add(BAD)
    hub_server.read_tokens.add(READ_ONLY)
    yield
    hub_server.invalid_tokens.discard(BAD)
    hub_server.read_tokens.discard(READ_ONLY)
    hub_server.clear_faults()


def test_push_target_is_checked_before_training_and_a_failed_push_says_how_to_retry(hub_server, tokens, tmp_path):
    """A bad (expired) token and a read-only token are refused in one line (exit 2) before any training: no model is
    written. With a good token the run creates the repository and the branch at the start and pushes the model folder
    to the branch at the end (not checkpoints/). A final push that fails (the commit refused) exits 1
    with one line, no traceback, naming the saved folder and the `hf-vit-plus push` command, which then succeeds."""
    hub_server.fail_next("commit", status=403, message="commit refused by the test", match="ff-end")
    result = run_with_package(
        RUN.format(overrides=TINY_VIT_OVERRIDES)
        + f"""
out = {{}}
out["bad"] = train("bad", {BAD!r}, "test-org/ff-bad")
out["read"] = train("read", {READ_ONLY!r}, "test-org/ff-read")
out["good"] = train("good", {GOOD!r}, "test-org/ff-good", "--hub_revision", "v1")
out["end"] = train("end", {GOOD!r}, "test-org/ff-end")
from huggingface_hub import HfApi
api = HfApi(token={GOOD!r})
out["good_files"] = sorted(api.list_repo_files("test-org/ff-good", revision="v1"))
out["end_files_before"] = sorted(api.list_repo_files("test-org/ff-end"))
retry = out["end"]["stderr"].split("Retry with: ")[-1].strip().split()
with contextlib.redirect_stdout(io.StringIO()):
    out["retry_code"] = main(retry[1:])
out["end_files_after"] = sorted(api.list_repo_files("test-org/ff-end"))
print(json.dumps(out))
""",
        cwd=tmp_path,
        env=hub_server.env(),
    )
    for case, fragment in (("bad", "refuses the token"), ("read", "read-only")):
        run = result[case]
        assert run["code"] == 2 and not run["saved"], run
        line = run["stderr"].strip()
        assert "\n" not in line and "Traceback" not in line, line
        assert line.startswith("hf-vit-plus train vit: error: --push_to_hub: ") and fragment in line, line
        assert "Nothing was trained" in line
    assert result["good"]["code"] == 0, result["good"]["stderr"][-2000:]
    assert "model.safetensors" in result["good_files"] and "README.md" in result["good_files"]
    assert not any(name.startswith(("checkpoints/", "logs/")) for name in result["good_files"])

    end = result["end"]
    assert end["code"] == 1 and end["saved"], end
    line = end["stderr"].strip().splitlines()[-1]
    assert "Traceback" not in end["stderr"], end["stderr"][-2000:]
    assert line.startswith("hf-vit-plus train vit: error: the model is saved in end, but pushing it to "
                           "'test-org/ff-end' failed at step 'commit'"), line  # fmt: skip
    assert "commit refused by the test" in line and line.endswith("Retry with: hf-vit-plus push end test-org/ff-end")
    assert "model.safetensors" not in result["end_files_before"]
    assert result["retry_code"] == 0 and "model.safetensors" in result["end_files_after"]
    assert not any(name.startswith("checkpoints/") for name in result["end_files_after"])


def test_an_unreachable_endpoint_is_named_before_training(tmp_path):
    """HF_ENDPOINT on a closed port: one line naming the endpoint, exit 2, nothing trained (it trained to the end and
    then failed with a traceback)."""
    import socket

    with socket.socket() as sock:  # a free port that nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    result = run_with_package(
        RUN.format(overrides=TINY_VIT_OVERRIDES) + 'print(json.dumps(train("run", "hf_x", "test-org/ff-none")))',
        cwd=tmp_path,
        env={
            "HF_ENDPOINT": endpoint,
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_ETAG_TIMEOUT": "5",
            "NO_PROXY": "127.0.0.1",
            "no_proxy": "127.0.0.1",
        },  # fmt: skip
    )
    line = result["stderr"].strip()
    assert result["code"] == 2 and not result["saved"] and "\n" not in line, result
    assert f"Cannot reach the Hub at {endpoint}" in line and "Nothing was trained" in line, line
