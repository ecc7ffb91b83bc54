"""Every user mistake on `hf-vit-plus train` is one `error:` line and exit status 2, found before the first update:
one regression test per root cause that fuzzing found (each used to train a NaN model and exit 0, abort the
process, fail after training, or print a traceback)."""

from __future__ import annotations

import contextlib
import io
import re
from types import SimpleNamespace

import pytest

from hf_vit_plus.cli import main

QUICK = ["--max_train_samples", "32", "--max_eval_samples", "16", "--per_device_train_batch_size", "8",
         "--report_to", "none", "--save_steps", "none", "--write_card", "false"]  # fmt: skip

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture
def no_updates(monkeypatch):
    """Run everything up to the first update, then stop: every check must have happened by then."""
    from hf_vit_plus.training import loop

    started = []

    def run_epochs(run, progress):
        started.append(run)
        progress.stop_reason = "stop_after_steps"

    monkeypatch.setattr(loop, "run_epochs", run_epochs)
    monkeypatch.setattr(
        loop, "stop_early", lambda run, progress, seconds: SimpleNamespace(stop_reason="stop_after_steps")
    )
    return started


def run(argv: list[str]) -> tuple[int, list[str]]:
    """(exit status, the `error:` lines on stderr); progress bars of the data loading may precede them."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
    assert "Traceback" not in stderr.getvalue(), stderr.getvalue()[-2000:]
    return code, [line for line in lines if ": error: " in line]


@pytest.fixture
def data_files(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "one.txt").write_text("hello world\n")
    (tmp_path / "one.csv").write_text("source,target\n1,one\n")
    (tmp_path / "data.xyz").write_text("x\n")
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "a_file").write_text("x")
    return tmp_path


CASES = [
    ("vit", ["--config_overrides", "layer_norm_eps=nan"], r"`layer_norm_eps` must be a finite positive number"),
    ("vit", ["--learning_rate", "inf"], r"--learning_rate must be a finite number, got inf"),
    ("vit", ["--learning_rate", "nan"], r"--learning_rate must be a finite number, got nan"),
    ("vit", ["--weight_decay", "nan"], r"--weight_decay must be a finite number"),
    ("vit", ["--weight_decay", "-1"], r"--weight_decay must be >= 0, got -1.0"),
    ("vit", ["--max_grad_norm", "-1"], r"--max_grad_norm must be >= 0"),
    ("seq2seq", ["--vocab_size", "99999999999999"], r"--vocab_size must be an integer from 260 to 4,194,304"),
    ("vit", ["--config_overrides", "num_labels=3"], r"has 10 classes but the model .* has num_labels=3"),
    ("seq2seq", ["--config_overrides", "vocab_size=50"], r"The tokenizer has \d+ tokens but the model's vocab_size"),
    ("sparse-lm", ["--config_overrides", "max_position_embeddings=16"], r"--block_size 128 exceeds"),
    ("sparse-lm", ["--block_size", "0"], r"--block_size must be a positive integer, got 0"),
    ("seq2seq", ["--max_source_length", "-1"], r"--max_source_length must be a positive integer, got -1"),
    ("vit", ["--adam_beta1", "1.5"], r"--adam_beta1 must be in \[0, 1\), got 1.5"),
    ("vit", ["--adam_epsilon", "-1"], r"--adam_epsilon must be > 0"),
    ("vit", ["--seed", "-1"], r"--seed must be an integer from 0 to 4,294,967,295, got -1"),
    ("vit", ["--warmup_steps", "-5"], r"--warmup_steps must be an integer >= 0, got -5"),
    ("vit", ["--report_to", "nonexistent_tracker"], r"Unknown --report_to tracker 'nonexistent_tracker'"),
    ("vit", ["--per_device_train_batch_size", "100000"], r"fewer than one global batch"),
]


@pytest.mark.parametrize(("family", "flags", "message"), CASES, ids=[" ".join(c[1]) for c in CASES])
def test_value_mistakes_are_one_line_before_training(family, flags, message, tmp_path, no_updates):
    code, lines = run(["train", family, "--output_dir", str(tmp_path / "out"), *QUICK, *flags])
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"hf-vit-plus train {family}: error: ")
    assert re.search(message, lines[0]), lines[0]
    assert no_updates == []  # refused before the run started


DATA_CASES = [
    ("vit", ["--output_dir", "{dir}/a_file"], r"--output_dir '.*a_file' is a file"),
    ("vit", ["--dataset_name", "{dir}/nonexistent"], r"--dataset_name '.*nonexistent' does not exist"),
    ("vit", ["--train_dir", "{dir}/empty_dir"], r"--train_dir '.*empty_dir' holds no files"),
    ("sparse-lm", ["--train_file", "{dir}/empty.txt"], r"--train_file '.*empty.txt' is empty"),
    ("sparse-lm", ["--train_file", "{dir}/data.xyz"], r"Cannot read '.*data.xyz': expected one of the extensions"),
    ("sparse-lm", ["--train_file", "{dir}/one.txt"], r"The training data has 1 example\(s\)"),
    ("seq2seq", ["--train_file", "{dir}/one.csv"], r"The training data has 1 example\(s\)"),
]


@pytest.mark.parametrize(("family", "flags", "message"), DATA_CASES, ids=[" ".join(c[1]) for c in DATA_CASES])
def test_data_mistakes_are_one_line_before_training(family, flags, message, data_files, no_updates):
    flags = [flag.format(dir=data_files) for flag in flags]
    output = [] if "--output_dir" in flags else ["--output_dir", str(data_files / "out")]
    code, lines = run(["train", family, *output, *QUICK, *flags])
    assert code == 2 and len(lines) == 1, lines
    assert re.search(message, lines[0]), lines[0]
    assert no_updates == []


def test_convert_names_an_unknown_timm_model_and_a_corrupt_file(tmp_path):
    pytest.importorskip("timm")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"garbage")
    code, lines = run(["convert", "timm", str(bad), str(tmp_path / "out"), "--timm_name", "vit_tiny_patch16_2244"])
    assert code == 2 and len(lines) == 1 and "--timm_name 'vit_tiny_patch16_2244' is not a timm model" in lines[0]
    assert "Did you mean 'vit_tiny_patch16_224'" in lines[0]
    code, lines = run(["convert", "timm", str(bad), str(tmp_path / "out"), "--timm_name", "vit_tiny_patch16_224"])
    assert code == 2 and len(lines) == 1 and "corrupt or truncated" in lines[0], lines


def test_valid_values_still_reach_training(tmp_path, no_updates):
    code, lines = run(["train", "vit", "--output_dir", str(tmp_path / "out"), *QUICK, "--weight_decay", "0",
                       "--max_grad_norm", "0", "--seed", "0", "--warmup_steps", "0"])  # fmt: skip
    assert code == 0 and len(no_updates) == 1, lines
