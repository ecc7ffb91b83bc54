"""Checkpoint manifests: each checkpoint's files are checked against the sizes and checksums written last into its
manifest.json, so "latest" passes over a damaged checkpoint (with a warning) and naming one is refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hf_vit_plus.training.args import TrainingArguments, family_arguments
from hf_vit_plus.training.checkpoints import (
    CHECKSUM_SPAN,
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    STATE_FILE,
    checkpoint_dirs,
    checkpoint_problem,
    complete_checkpoint_dirs,
    resolve_checkpoint,
    write_manifest,
)
from hf_vit_plus.training.loop import train
from tests.utils import TINY_VIT_OVERRIDES

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py

CHECKPOINTS_LOGGER = "hf_vit_plus.training.checkpoints"
LOOP_LOGGER = "hf_vit_plus.training.loop"  # its INFO line "Resumed from <checkpoint> at update <n> ..."
# 96 samples in batches of 16: 6 updates, a checkpoint every 2
RUN = dict(
    config_overrides=TINY_VIT_OVERRIDES,
    report_to="none",
    write_card=False,
    max_train_samples=96,
    max_eval_samples=16,
    per_device_train_batch_size=16,
    save_steps="2",
    save_total_limit=None,
    logging_steps=1,
    num_train_epochs=1.0,
)


def tiny_run(output_dir: Path, **overrides) -> TrainingArguments:
    return family_arguments("vit", output_dir=str(output_dir), **{**RUN, **overrides})


def stopped_run(tmp_path: Path, stop_after_steps: int = 4, **overrides) -> Path:
    """A run stopped after `stop_after_steps` of its 6 updates, with a checkpoint every 2; its output folder."""
    output_dir = tmp_path / "run"
    result = train(tiny_run(output_dir, stop_after_steps=stop_after_steps, **overrides))
    assert result.interrupted and result.global_step == stop_after_steps
    return output_dir


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def flip_middle(file: Path) -> None:
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    file.write_bytes(bytes(data))


def zero_start(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(bytes(64) + data[64:])


def damage(checkpoint: Path, kind: str) -> str:
    """Damage `checkpoint` as `kind` says; the phrase `checkpoint_problem` must report."""
    if kind == "truncated model":
        size = (checkpoint / "model.safetensors").stat().st_size
        truncate(checkpoint / "model.safetensors")
        return f"model.safetensors: {size // 2} bytes, the manifest says {size}"
    if kind == "flipped bytes in the model":
        flip_middle(checkpoint / "model.safetensors")
        return "model.safetensors: its content differs from the manifest's checksum"
    if kind == "corrupt optimizer":
        zero_start(checkpoint / "optimizer.bin")
        return "optimizer.bin: its content differs from the manifest's checksum"
    if kind == "missing scheduler":
        (checkpoint / "scheduler.bin").unlink()
        return "scheduler.bin: missing"
    if kind == "manifest not JSON":
        manifest = checkpoint / MANIFEST_FILE
        manifest.write_text(manifest.read_text()[:40])
        return "manifest.json: not valid JSON"
    raise AssertionError(kind)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == CHECKPOINTS_LOGGER and r.levelno == logging.WARNING]


def test_a_fresh_runs_checkpoints_have_manifests_that_match(tmp_path, caplog):
    output_dir = stopped_run(tmp_path)
    checkpoints = checkpoint_dirs(output_dir)
    assert [c.name for c in checkpoints] == ["checkpoint-2", "checkpoint-4"]
    for checkpoint in checkpoints:
        manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
        assert (manifest["format"], manifest["version"]) == (MANIFEST_FORMAT, 1)
        on_disk = {p.relative_to(checkpoint).as_posix(): p for p in checkpoint.rglob("*") if p.is_file()}
        assert set(manifest["files"]) == set(on_disk) - {MANIFEST_FILE}  # nested processor files too, no leftovers
        assert {"model.safetensors", "optimizer.bin", STATE_FILE, "processor/preprocessor_config.json"} <= set(on_disk)
        for name, entry in manifest["files"].items():
            assert entry["size"] == on_disk[name].stat().st_size
        assert checkpoint_problem(checkpoint) is None
    assert complete_checkpoint_dirs(output_dir) == checkpoints
    with caplog.at_level(logging.WARNING, logger=CHECKPOINTS_LOGGER):
        assert resolve_checkpoint("latest", output_dir) == checkpoints[-1]
    assert warnings_of(caplog) == []


@pytest.mark.parametrize(
    "kind",
    ["truncated model", "flipped bytes in the model", "corrupt optimizer", "missing scheduler", "manifest not JSON"],
)
def test_latest_passes_over_a_damaged_checkpoint_with_one_warning(tmp_path, caplog, kind):
    output_dir = stopped_run(tmp_path)
    earlier, newest = checkpoint_dirs(output_dir)
    problem = damage(newest, kind)
    assert checkpoint_problem(newest) == problem
    assert checkpoint_problem(earlier) is None
    with caplog.at_level(logging.WARNING, logger=CHECKPOINTS_LOGGER):
        assert resolve_checkpoint("latest", output_dir) == earlier
    assert warnings_of(caplog) == [f"checkpoint-4 is damaged ({problem}): resuming from checkpoint-2"]
    assert complete_checkpoint_dirs(output_dir) == [earlier]


def test_resuming_latest_after_damage_finishes_from_the_earlier_checkpoint(tmp_path, caplog):
    output_dir = stopped_run(tmp_path)
    earlier, newest = checkpoint_dirs(output_dir)
    truncate(newest / "model.safetensors")
    with caplog.at_level(logging.INFO, logger=LOOP_LOGGER):
        result = train(tiny_run(output_dir, resume_from_checkpoint="latest"))
    assert result.stop_reason == "finished" and result.global_step == 6
    resumed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Resumed from")]
    assert resumed == [f"Resumed from {earlier} at update 2 (epoch 0, batch 2)."]
    assert len(warnings_of(caplog)) == 1 and "checkpoint-4 is damaged" in warnings_of(caplog)[0]
    # updates 3 and 4 were trained again, and their checkpoint written anew
    assert [e["step"] for e in result.log_history if "loss" in e] == [1, 2, 3, 4, 5, 6]
    assert checkpoint_problem(newest) is None


def test_naming_a_damaged_checkpoint_is_a_one_line_usage_error(tmp_path, capsys):
    from hf_vit_plus.cli import main

    output_dir = stopped_run(tmp_path)
    damaged = checkpoint_dirs(output_dir)[-1]
    problem = damage(damaged, "truncated model")
    capsys.readouterr()
    argv = ["train", "vit", "--output_dir", str(output_dir), "--config_overrides", TINY_VIT_OVERRIDES, "--report_to",
            "none", "--write_card", "false", "--max_train_samples", "96", "--per_device_train_batch_size", "16",
            "--resume_from_checkpoint", str(damaged)]  # fmt: skip
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("hf-vit-plus train")
    assert f"{str(damaged)!r} is damaged: {problem}" in lines[0]
    with pytest.raises(ValueError, match="model.safetensors: .* bytes, the manifest says"):
        resolve_checkpoint(str(damaged), output_dir)


def test_a_checkpoint_without_a_manifest_still_resumes(tmp_path, caplog):
    """Checkpoints written before manifests existed have only their training_state.json to show."""
    output_dir = stopped_run(tmp_path)
    for checkpoint in checkpoint_dirs(output_dir):
        (checkpoint / MANIFEST_FILE).unlink()
        assert checkpoint_problem(checkpoint) is None
    newest = checkpoint_dirs(output_dir)[-1]
    with caplog.at_level(logging.INFO, logger=LOOP_LOGGER):
        assert resolve_checkpoint("latest", output_dir) == newest
        assert resolve_checkpoint(str(newest), output_dir) == newest
        result = train(tiny_run(output_dir, resume_from_checkpoint="latest"))
    assert warnings_of(caplog) == []  # nothing to say about a checkpoint without a manifest
    assert result.stop_reason == "finished" and result.global_step == 6
    assert any(r.getMessage().startswith(f"Resumed from {newest} at update 4") for r in caplog.records)


def test_all_checkpoints_damaged_is_a_clear_file_not_found_error(tmp_path, caplog):
    output_dir = stopped_run(tmp_path)
    earlier, newest = checkpoint_dirs(output_dir)
    damage(newest, "truncated model")
    damage(earlier, "corrupt optimizer")
    root = str(output_dir / "checkpoints")
    with caplog.at_level(logging.WARNING, logger=CHECKPOINTS_LOGGER):
        with pytest.raises(FileNotFoundError) as error:
            resolve_checkpoint("latest", output_dir)
    message = str(error.value)
    assert f"no complete checkpoint under {root!r}" in message and "\n" not in message
    assert "checkpoint-4 (model.safetensors: " in message
    assert "checkpoint-2 (optimizer.bin: its content differs from the manifest's checksum)" in message
    assert warnings_of(caplog) == []  # the error says it all
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        train(tiny_run(output_dir, resume_from_checkpoint="latest"))


def test_save_total_limit_keeps_the_newest_complete_checkpoint_over_damaged_newer_ones(tmp_path):
    """Resumed from checkpoint-2 because 4 and 6 are damaged, a run stopped at update 3 with --save_total_limit 1
    keeps checkpoint-3 (counting the damaged ones, it deleted it and left nothing to resume)."""
    output_dir = stopped_run(tmp_path, stop_after_steps=6, max_train_samples=128)  # 8 updates
    assert [c.name for c in checkpoint_dirs(output_dir)] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    damage(output_dir / "checkpoints" / "checkpoint-4", "corrupt optimizer")
    damage(output_dir / "checkpoints" / "checkpoint-6", "truncated model")
    resume = dict(resume_from_checkpoint="latest", save_total_limit=1, stop_after_steps=3, max_train_samples=128)
    result = train(tiny_run(output_dir, **resume))
    assert result.global_step == 3 and result.last_checkpoint.name == "checkpoint-3"
    # checkpoint-2 (complete, older) goes; the damaged newer ones stay for the user to look at
    assert [c.name for c in checkpoint_dirs(output_dir)] == ["checkpoint-3", "checkpoint-4", "checkpoint-6"]
    assert resolve_checkpoint("latest", output_dir) == result.last_checkpoint


def test_the_checksum_covers_both_ends_of_a_large_file(tmp_path):
    """Over 2 MiB only the first and last MiB are read: truncation and a damaged head or tail are caught, a change
    in between only by the size check (the cost of reading 2 MiB of a multi-GB optimiser state)."""
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    (checkpoint / STATE_FILE).write_text("{}")
    big = checkpoint / "optimizer.bin"
    big.write_bytes(bytes(range(256)) * (3 * CHECKSUM_SPAN // 256))
    write_manifest(checkpoint)
    assert not (checkpoint / f"{MANIFEST_FILE}.tmp").exists()
    assert checkpoint_problem(checkpoint) is None
    original = big.read_bytes()
    for position in (10, len(original) - 10):
        changed = bytearray(original)
        changed[position] ^= 0xFF
        big.write_bytes(bytes(changed))
        assert checkpoint_problem(checkpoint) == "optimizer.bin: its content differs from the manifest's checksum"
    big.write_bytes(original)
    flip_middle(big)  # the ends as written, the middle changed: unseen by design
    assert big.read_bytes() != original
    assert checkpoint_problem(checkpoint) is None


SPARSE_LM_TINY = ("hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,"
                  "max_position_embeddings=64,sparse_stride=8,sparse_summary_size=2")  # fmt: skip


@pytest.mark.parametrize("family", ["sparse-lm", "seq2seq"])
def test_saving_a_model_with_tied_weights_says_nothing_and_resumes_tied(family, tmp_path, caplog, capfd):
    """Every checkpoint of a model with tied weights logged accelerate's "Removed shared tensor {'lm_head.weight'}
    while saving. This should be OK, but check ..." (600 times in a 2-machine run). The checkpoint keeps one name per
    tensor, as before, and a resumed run has its weights tied again."""
    from safetensors import safe_open

    overrides = {"sparse-lm": dict(config_overrides=SPARSE_LM_TINY, block_size=64),
                 "seq2seq": dict(config_overrides="d_model=32,encoder_layers=1,decoder_layers=1")}[family]  # fmt: skip
    run = dict(report_to="none", write_card=False, max_train_samples=32, max_eval_samples=16,
               per_device_train_batch_size=8, save_steps="1", save_total_limit=None, **overrides)  # fmt: skip
    output_dir = tmp_path / "run"
    caplog.set_level(logging.DEBUG)
    result = train(family_arguments(family, output_dir=str(output_dir), max_steps=2, **run))
    assert result.global_step == 2
    said = caplog.text + "".join(capfd.readouterr())
    assert "Removed shared tensor" not in said and "shared tensor" not in said
    checkpoints = complete_checkpoint_dirs(output_dir)
    assert len(checkpoints) == 2
    with safe_open(checkpoints[-1] / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    tied = {"sparse-lm": ("model.embeddings.embed_tokens.weight", "lm_head.weight"),
            "seq2seq": ("model.shared.weight", "lm_head.weight")}[family]  # fmt: skip
    assert tied[0] in names and tied[1] not in names
    assert not {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"} & names
    resumed = train(family_arguments(family, output_dir=str(output_dir), max_steps=3,
                                     resume_from_checkpoint="latest", **run))  # fmt: skip
    assert resumed.global_step == 3
    model = resumed.model
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
