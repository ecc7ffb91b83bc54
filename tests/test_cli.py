"""`hf-vit-plus` and user errors: a sparse ViT trained from the command line ends with its card and
figures; unknown --config_overrides keys are refused; every user error is one line `hf-vit-plus <cmd>: error: ...`
on stderr with exit status 2, while an error inside the run keeps its traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from hf_vit_plus.cli import main
from hf_vit_plus.errors import UsageError
from tests.utils import COMMAND_CODE, REPO_ROOT, TINY_VIT_OVERRIDES

QUICK_RUN = [
    "--max_steps", "2", "--max_train_samples", "64", "--max_eval_samples", "32",
    "--per_device_train_batch_size", "16", "--report_to", "none", "--save_steps", "none",
]  # fmt: skip


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """(exit status, stderr lines) of `hf-vit-plus argv` run in this process."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    return code, capsys.readouterr().err.strip().splitlines()


def assert_usage_error(code: int, lines: list[str], command: str, message: str) -> None:
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"hf-vit-plus {command}: error: "), lines
    assert message in lines[0], lines


# ------------------------------------------------------------------------------------ 1: sparse ViT card and figures
@pytest.mark.parametrize("attention_type", ["strided", "fixed"])
def test_sparse_vit_trained_from_the_cli_writes_card_and_figures(tmp_path, capsys, attention_type):
    """The stride is left to the config (patches per row): the figure must use the model's own pattern."""
    output_dir = tmp_path / attention_type
    argv = ["train", "vit", "--output_dir", str(output_dir), *QUICK_RUN,
            "--config_overrides", f"attention_type={attention_type},{TINY_VIT_OVERRIDES}"]  # fmt: skip
    assert main(argv) == 0
    written = {p.name for p in output_dir.iterdir()}
    assert {"model.safetensors", "config.json", "README.md", "training_curves.png", "attention_maps.png",
            "sparse_attention_pattern.png"} <= written, sorted(written)  # fmt: skip
    assert "sparse_attention_pattern.png" in (output_dir / "README.md").read_text()


def test_pattern_from_config_uses_the_model_pattern_of_each_family(tmp_path, capsys):
    from hf_vit_plus import Seq2SeqTransformerConfig, SparseTransformerConfig, ViTPlusConfig
    from hf_vit_plus.interpret import pattern_from_config
    from hf_vit_plus.models.sparse_layouts import pattern_from_config as model_pattern_from_config

    vit = ViTPlusConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, attention_type="fixed")  # fmt: skip
    assert (vit.sparse_stride, vit.sparse_summary_size) == (4, 1)  # resolved from the image geometry
    pattern = pattern_from_config(vit)
    model_pattern = model_pattern_from_config(vit)
    assert (pattern.kind, pattern.stride, pattern.summary_size, pattern.causal) == (
        "fixed", model_pattern.stride, model_pattern.summary_size, False,
    )  # fmt: skip
    assert pattern.stride == 4 and pattern.length <= vit.num_patches + 1

    seq2seq = Seq2SeqTransformerConfig(d_model=16, encoder_ffn_dim=16, decoder_ffn_dim=16, encoder_attention_heads=2,
                                       encoder_attention_type="strided", encoder_sparse_stride=4)  # fmt: skip
    pattern = pattern_from_config(seq2seq)
    assert (pattern.kind, pattern.stride, pattern.causal) == ("strided", 4, False)

    lm = SparseTransformerConfig(attention_type="strided", sparse_stride=8, max_position_embeddings=256)
    pattern = pattern_from_config(lm)
    assert (pattern.kind, pattern.stride, pattern.causal, pattern.length) == ("strided", 8, True, 64)

    # `explain pattern` on saved configs (the ViT one failed with "needs a stride", the seq2seq one was refused)
    for name, config in (("vit", vit), ("seq2seq", seq2seq)):
        config.save_pretrained(tmp_path / name)
        png = tmp_path / f"{name}.png"
        assert run_cli(["explain", "pattern", str(tmp_path / name), "--output", str(png)], capsys) == (0, [])
        assert png.stat().st_size > 0


# ------------------------------------------------------------------------------------------ 2: unknown config fields
@pytest.mark.parametrize(
    "family, key, suggestion",
    [
        ("vit_plus", "hiden_size", "hidden_size"),
        ("seq2seq_transformer", "num_hiden_layers", "num_hidden_layers"),  # an attribute_map alias
        ("sparse_transformer", "sparse_strid", "sparse_stride"),
    ],
)
def test_unknown_config_field_names_the_closest_one(family, key, suggestion):
    from transformers import CONFIG_MAPPING

    from hf_vit_plus.training.tasks import check_config_overrides

    config_class = CONFIG_MAPPING[family]
    expected = rf"^Unknown config field '{key}' for {family}; did you mean '{suggestion}'\?$"
    with pytest.raises(ValueError, match=expected):
        check_config_overrides(config_class, {key: 64})
    # the config's own fields, the aliases and PretrainedConfig's standard fields are accepted
    check_config_overrides(config_class, {"hidden_size": 64, "num_labels": 3, "id2label": {}, "output_attentions": 1})


def test_unknown_config_field_is_refused_by_the_python_api(tmp_path):
    from hf_vit_plus.training.args import family_arguments
    from hf_vit_plus.training.loop import train

    args = family_arguments("vit", output_dir=str(tmp_path / "run"), report_to="none", max_steps=1,
                            config_overrides=TINY_VIT_OVERRIDES.replace("hidden_size", "hiden_size"))  # fmt: skip
    with pytest.raises(ValueError, match="Unknown config field 'hiden_size' for vit_plus; did you mean 'hidden_size'"):
        train(args)
    assert not (tmp_path / "run" / "model.safetensors").exists()


# ------------------------------------------------------------------------------------- 3: one-line errors, status 2
# {missing}: a path that does not exist; {out}: the output folder, which must not be created
USER_ERRORS = [
    (["train", "vit", "--train_dir", "{missing}"], "train vit", "--train_dir '{missing}' does not exist"),
    (["train", "vit", "--mixed_precision", "fp8"], "train vit", "invalid choice: 'fp8'"),
    (["train", "vit", "--bogus_flag", "1"], "train vit", "unrecognized arguments: --bogus_flag 1"),
    (["train", "vit", "--config_overrides", "hiden_size=64"], "train vit",
     "Unknown config field 'hiden_size' for vit_plus; did you mean 'hidden_size'?"),
    (["train", "vit", "--config_overrides", "hidden_size"], "train vit", "'name=value'"),
    (["train", "vit", "--config_overrides", "hidden_size=30,num_attention_heads=4"], "train vit",
     "must be divisible by `num_attention_heads`"),
    (["train", "vit", "--config_name", "giant-patch16-224"], "train vit", "Unknown ViT preset"),
    (["train", "vit", "--resume_from_checkpoint", "{missing}"], "train vit", "does not exist"),
    (["train", "vit", "--model_name_or_path", "{missing}"], "train vit", "--model_name_or_path"),
    (["train", "vit", "--per_device_train_batch_size", "0"], "train vit", "must be a positive integer"),
    (["train", "seq2seq", "--train_dir", "{missing}"], "train seq2seq", "unrecognized arguments: --train_dir"),
    (["train", "vit", "--block_size", "64"], "train vit", "unrecognized arguments: --block_size 64"),
    # no abbreviations: argparse took --dataset for --dataset_name's prefix ("ambiguous option" next to
    # --dataset_config_name), --max_step for --max_steps
    (["train", "vit", "--dataset", "digits"], "train vit",
     "unrecognized arguments: --dataset digits (--dataset: did you mean --dataset_name?)"),
    (["train", "vit", "--max_step", "3"], "train vit", "--max_step: did you mean --max_steps?"),
    (["train", "vit", "--learning_rat=0.1"], "train vit", "--learning_rat: did you mean --learning_rate?"),
    (["train", "sparse-lm", "--train_file", "{missing}.txt"], "train sparse-lm", "--train_file"),
    (["train", "sparse-lm", "--config_name", "{missing}"], "train sparse-lm", "--config_name"),
    (["train", "sparse-lm", "--config_overrides", "sparse_strid=8"], "train sparse-lm", "'sparse_stride'"),
    (["explain", "all", "{missing}", __file__], "explain all", "does not exist"),
    (["explain", "pattern", "{missing}"], "explain pattern", "does not exist"),
    (["explain", "rollout", "{missing}", "{missing}.png"], "explain rollout", "does not exist"),
    (["explain", "pattern", "--kind", "strided", "--stride", "0"], "explain pattern", "positive integer"),
    (["push", "{missing}", "user/repo"], "push", "does not exist"),
    (["push", "{missing}", "user/repo", "--revisio", "b"], "push", "--revisio: did you mean --revision?"),
    (["convert", "timm", "{missing}.safetensors", "{out}"], "convert", "does not exist"),
    (["convert", "transformers", "{missing}", "{out}"], "convert", "does not exist"),
]  # fmt: skip


@pytest.mark.parametrize("argv, command, message", USER_ERRORS, ids=[" ".join(case[0]) for case in USER_ERRORS])
def test_user_errors_are_one_line_with_status_2(tmp_path, capsys, argv, command, message):
    paths = dict(missing=str(tmp_path / "missing"), out=str(tmp_path / "out"))
    argv = [arg.format(**paths) for arg in argv]
    if argv[0] == "train":
        argv += ["--output_dir", paths["out"], "--report_to", "none"]
    code, lines = run_cli(argv, capsys)
    assert_usage_error(code, lines, command, message.format(**paths))
    assert not (tmp_path / "out").exists(), "no work may start on a user error"


def test_a_sparse_seq2seq_checkpoint_without_sparse_attention_is_named(tmp_path, capsys):
    from hf_vit_plus import Seq2SeqTransformerConfig

    Seq2SeqTransformerConfig(d_model=16, encoder_ffn_dim=16, decoder_ffn_dim=16).save_pretrained(tmp_path / "dense")
    code, lines = run_cli(["explain", "pattern", str(tmp_path / "dense")], capsys)
    assert_usage_error(code, lines, "explain pattern", "encoder_attention_type='dense'")


def test_an_error_inside_the_run_keeps_its_traceback(monkeypatch, tmp_path):
    """Only `UsageError`s become one-line errors: a ValueError raised while training is a bug and propagates."""
    from hf_vit_plus.training import loop

    def broken_train(args):
        raise ValueError("a bug deep inside training")

    monkeypatch.setattr(loop, "train", broken_train)
    with pytest.raises(ValueError, match="a bug deep inside training") as info:
        main(["train", "vit", "--output_dir", str(tmp_path / "out"), "--report_to", "none"])
    assert not isinstance(info.value, UsageError)


def test_python_m_entry_point_prints_one_line(tmp_path):
    """`python -m hf_vit_plus.cli` runs the module as __main__: the UsageError class must still be the package's.

    Python imports the package before the command runs, and the package filters no log: where torchao is installed,
    torch logs its notice about torchao's enums while transformers imports torchao (as for any transformers program),
    before the command can hide it as `hf-vit-plus` does. Those lines aside, the error is one line."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "hf_vit_plus.cli", "push", str(tmp_path / "missing"), "user/repo"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    notice = "register_constant() on Enum subclasses is deprecated"
    assert [line for line in proc.stderr.strip().splitlines() if notice not in line] == [
        f"hf-vit-plus push: error: Checkpoint folder {str(tmp_path / 'missing')!r} does not exist."
    ]


def test_the_command_prints_one_line_and_no_notice(tmp_path):
    """Through the `hf-vit-plus` launcher (the installed command) the command hides torch's notice about torchao's
    enums: the error is the only line."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    launcher = COMMAND_CODE
    proc = subprocess.run(
        [sys.executable, "-c", launcher, "push", str(tmp_path / "missing"), "user/repo"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"hf-vit-plus push: error: Checkpoint folder {str(tmp_path / 'missing')!r} does not exist."
    ]


# ------------------------------------------------------------------------------------------ 4: the flags themselves
def _subparsers(parser) -> dict:
    import argparse

    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def _all_parsers():
    """(prog, parser) of every command and sub-command of `hf-vit-plus`."""
    from hf_vit_plus.cli import build_parser

    pending = [build_parser()]
    while pending:
        parser = pending.pop()
        yield parser.prog, parser
        try:
            pending.extend(_subparsers(parser).values())
        except StopIteration:
            pass


def test_every_flag_has_help_and_an_underscore_name(capsys):
    import argparse

    for prog, parser in _all_parsers():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{prog}: {action.option_strings or action.dest} has no help"
            for option in action.option_strings:
                assert "-" not in option.lstrip("-"), f"{prog}: {option} (underscores are the visible spelling)"


@pytest.mark.parametrize(
    "family, absent",
    [
        ("vit", ["--train_file", "--text_column", "--block_size", "--tokenizer_name", "--source_column"]),
        ("vit-mpp", ["--label_column_name", "--mixup_alpha", "--teacher", "--label_smoothing_factor"]),
        ("seq2seq", ["--train_dir", "--image_column_name", "--block_size", "--ignore_mismatched_sizes", "--recipe"]),
        ("sparse-lm", ["--train_dir", "--source_column", "--vocab_size", "--label_smoothing_factor"]),
    ],
)
def test_family_flags_are_on_their_subcommand_only(capsys, family, absent):
    with pytest.raises(SystemExit):
        main(["train", family, "--help"])
    text = capsys.readouterr().out
    assert all(flag not in text for flag in absent), text
    assert "--max_train_steps" not in text and "--checkpointing_steps" not in text  # old names are hidden


def test_renamed_flags_are_hidden_aliases_of_the_new_ones():
    from hf_vit_plus.cli import build_parser
    from hf_vit_plus.training.cli import args_from_namespace

    parser = build_parser()
    old = parser.parse_args(["train", "vit", "--max_train_steps", "5", "--lr_scheduler", "linear",
                             "--checkpointing_steps", "none", "--checkpoints_total_limit", "3", "--hub_private",
                             "--dataset_config", "c", "--image_column", "img", "--label_column", "y"])  # fmt: skip
    new = parser.parse_args(["train", "vit", "--max_steps", "5", "--lr_scheduler_type", "linear",
                             "--save_steps", "none", "--save_total_limit", "3", "--hub_private_repo",
                             "--dataset_config_name", "c", "--image_column_name", "img",
                             "--label_column_name", "y"])  # fmt: skip
    assert args_from_namespace(old) == args_from_namespace(new)
    seq2seq = parser.parse_args(["train", "seq2seq", "--label_smoothing", "0.2"])
    assert args_from_namespace(seq2seq).label_smoothing_factor == 0.2
    assert parser.parse_args(["demo", "--max_train_steps", "7"]).max_steps == 7
    push = parser.parse_args(["push", "d", "u/r", "--branch", "b", "--no-create-branch", "--commit-message", "m"])
    assert (push.revision, push.create_branch, push.commit_message) == ("b", False, "m")


def _parser_tree(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parser_tree(child)


def test_no_parser_takes_an_abbreviation_of_a_flag():
    """Every parser of the command line (root, commands, the train families) has abbreviations off, and so has every
    script's: the package builds them from `cli_utils.CommandParser`, never `argparse.ArgumentParser` itself."""
    from hf_vit_plus.cli import build_parser

    parsers = list(_parser_tree(build_parser()))
    assert len(parsers) > 10 and all(not parser.allow_abbrev for parser in parsers)
    direct = [
        path.relative_to(REPO_ROOT).as_posix()
        for folder in ("hf_vit_plus", "scripts")
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
        if "argparse.ArgumentParser(" in path.read_text() and path.name != "cli_utils.py"
    ]
    assert not direct, f"parsers built without CommandParser (abbreviations on): {direct}"


def test_old_keyword_names_work_in_family_arguments(tmp_path):
    from hf_vit_plus.training.args import family_arguments

    old = family_arguments("vit", max_train_steps=3, checkpointing_steps="none", label_column="y")
    assert (old.max_steps, old.save_steps, old.label_column_name) == (3, "none", "y")
    with pytest.raises(ValueError, match="max_steps= or its old name max_train_steps="):
        family_arguments("vit", max_train_steps=3, max_steps=4)


def test_version_and_a_whole_sentence_of_top_level_help(capsys):
    import hf_vit_plus

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"hf-vit-plus {hf_vit_plus.__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Hugging Face models: convert checkpoints, draw attention figures, train with Accelerate" in text
    assert all(command in text for command in ("convert", "explain", "train", "demo", "push"))


def test_env_prints_the_versions_and_the_machine_for_bug_reports(capsys):
    import importlib.metadata

    import torch
    import transformers

    import hf_vit_plus

    assert main(["env"]) == 0
    lines = dict(line[2:].split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["hf_vit_plus"] == hf_vit_plus.__version__
    assert lines["transformers"] == transformers.__version__
    assert lines["torch"].startswith(torch.__version__.split("+")[0])
    for name in ("accelerate", "huggingface_hub", "datasets"):
        assert lines[name] == importlib.metadata.version(name)
    assert {"Python", "Device", "CPU", "CPU features"} <= set(lines)
    from hf_vit_plus.models.cpu_isa import describe_isa

    assert lines["Instruction set"] == describe_isa() and lines["Kernel paths"]
    assert lines["int8-dynamic quantization"].split()[0] in ("torchao", "FBGEMM's")


def test_env_reports_a_bad_instruction_set_cap_in_one_line(capsys, monkeypatch):
    monkeypatch.setenv("HF_VIT_PLUS_CPU_ISA", "sse9")
    assert main(["env"]) == 2
    captured = capsys.readouterr()
    assert "- Instruction set: invalid: HF_VIT_PLUS_CPU_ISA='sse9'" in captured.out
    assert captured.err.strip().splitlines() == [
        "hf-vit-plus env: error: HF_VIT_PLUS_CPU_ISA='sse9' is not an instruction set level: expected one of generic, "
        "avx2, avx512"
    ]
