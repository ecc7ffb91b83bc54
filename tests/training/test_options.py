"""A run's options (issue 59): in groups, one meaning per flag, each default defined once, resolved once into a frozen
plan that the loop reads instead of the arguments, and a run file that reproduces the run.

- `--help` shows the option groups; flags are written with underscores or dashes.
- `hf-vit-plus train FAMILY RUN_FILE [flags]`: the options of a .yaml / .json file, the flags on top; bad files are
  one-line errors.
- `--print_config` prints the resolved options as a run file, and printing from that file gives the same text.
- Every run writes OUTPUT_DIR/run_config.yaml; training again from it gives the same plan, the same first lines and
  bitwise the same weights (CPU).
- `--learning_rate` is the peak learning rate of every family (seq2seq's paper schedule included).
- Each family's defaults are defined once, and the plan says who chose each.
- Nothing writes to (or, after the plan, reads) the arguments the run was given.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import tokenize
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from hf_vit_plus.cli import main
from hf_vit_plus.families import FAMILIES, get_family
from hf_vit_plus.training.args import TrainingArguments, family_arguments, flag_fields
from hf_vit_plus.training.loop import train
from hf_vit_plus.training.plan import preview_plan
from hf_vit_plus.training.recipes import RECIPE_NONE
from hf_vit_plus.training.tasks import get_task
from tests.utils import REPO_ROOT, TINY_VIT_OVERRIDES, run_report

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py

# a tiny ViT run of 3 updates (no checkpoints, no card: the reproduction and the path checks only need the weights)
TINY_VIT = [
    "--config_overrides", TINY_VIT_OVERRIDES, "--max_steps", "3", "--max_train_samples", "64",
    "--max_eval_samples", "32", "--per_device_train_batch_size", "16", "--report_to", "none", "--save_steps", "none",
    "--write_card", "false",
]  # fmt: skip


def run_cli(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    """(exit status, stdout, stderr lines) of `hf-vit-plus argv` in this process."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors and --help
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def first_lines(report: str) -> list[str]:
    """The lines a run starts with (`plan.describe`), up to the "Training ..." line."""
    lines = report.splitlines()
    return lines[: next(i for i, line in enumerate(lines) if line.startswith("Training "))]


# ------------------------------------------------------------------------------------------------ groups, dashes
def test_help_shows_the_option_groups(capsys):
    code, out, _ = run_cli(["train", "vit", "--help"], capsys)
    assert code == 0
    for title in ("model:", "data:", "optimization and schedule:", "the recipe:", "precision and parallelism:",
                  "output folder, checkpoints and resume:", "logging, evaluation and tracking:", "LoRA:",
                  "Hub and model card:"):  # fmt: skip
        assert f"\n{title}\n" in out, title
    assert "RUN_FILE" in out and "--print_config" in out
    code, out, _ = run_cli(["train", "seq2seq", "--help"], capsys)
    assert "\nthe recipe:\n" not in out  # a family shows only the groups it has flags in
    assert "peak learning rate of the paper's schedule" in out and "(default: 0.00125)" in out


def test_the_arguments_are_the_union_of_small_frozen_groups():
    from hf_vit_plus.training.options import OPTION_GROUPS, OptimizationArguments, group_fields, option_fields

    assert all(issubclass(TrainingArguments, group) for group in OPTION_GROUPS)
    assert all(dataclasses.fields(group) and group.__dataclass_params__.frozen for group in OPTION_GROUPS)
    names = [flag.name for flag in option_fields()]
    assert len(names) == len(set(names))  # each option in one group
    assert max(len(group_fields(group)) for group in OPTION_GROUPS) <= 25
    args = family_arguments("seq2seq", max_steps=3)
    optimization = args.group(OptimizationArguments)
    assert isinstance(optimization, OptimizationArguments) and optimization.learning_rate == 1.25e-3
    assert optimization.max_steps == 3


def test_flags_take_dashes_or_underscores(tmp_path):
    from hf_vit_plus.cli import build_parser
    from hf_vit_plus.training.cli import args_from_namespace

    parser = build_parser()
    dashes = parser.parse_args(["train", "vit", "--output-dir", str(tmp_path), "--max-steps", "3",
                                "--per-device-train-batch-size=8", "--lr-scheduler-type", "linear"])  # fmt: skip
    underscores = parser.parse_args(["train", "vit", "--output_dir", str(tmp_path), "--max_steps", "3",
                                     "--per_device_train_batch_size=8", "--lr_scheduler_type", "linear"])  # fmt: skip
    assert args_from_namespace(dashes) == args_from_namespace(underscores)
    assert args_from_namespace(dashes).output_dir == str(tmp_path)
    assert args_from_namespace(dashes).given["max_steps"] == "--max_steps"


# ------------------------------------------------------------------------------------------------------ run files
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_run_file_gives_the_options_and_flags_after_it_override_it(tmp_path, capsys, suffix):
    # a key with dashes, a number written as a string (YAML reads 1e-3 so): as the flags take them
    values = {"max-steps": 5, "learning_rate": "1e-3", "config_overrides": TINY_VIT_OVERRIDES, "family": "vit"}
    path = tmp_path / f"run{suffix}"
    path.write_text(json.dumps(values) if suffix == ".json" else "\n".join(f"{k}: {v}" for k, v in values.items()))
    from hf_vit_plus.cli import build_parser
    from hf_vit_plus.training.cli import args_from_namespace

    args = args_from_namespace(build_parser().parse_args(["train", "vit", str(path), "--max_steps", "3"]))
    assert (args.max_steps, args.learning_rate, args.config_overrides) == (3, 1e-3, TINY_VIT_OVERRIDES)
    assert args.given["max_steps"] == "--max_steps" and args.given["learning_rate"] == path.name
    assert args.num_train_epochs == 30.0 and "num_train_epochs" not in args.given  # the family's default
    plan = preview_plan(args, get_task("vit"))
    assert plan.chosen_by["learning_rate"] == path.name and plan.chosen_by["max_steps"] == "--max_steps"
    # the run itself
    code, _, err = run_cli(["train", "vit", str(path), "--max_steps", "2", *TINY_VIT[4:],
                            "--output_dir", str(tmp_path / "run")], capsys)  # fmt: skip
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "log_history.json").read_text())[-1]["step"] == 2


@pytest.mark.parametrize(
    "content, message",
    [
        ("max_step: 3\n", "Unknown option 'max_step' in the run file 'run.yaml'; did you mean 'max_steps'?"),
        ("block_size: 64\n", "'block_size' in the run file 'run.yaml' is not an option of the vit family"),
        ("family: seq2seq\n", "holds the options of a seq2seq run: use it with `hf-vit-plus train seq2seq`"),
        ("max_steps: many\n", "'max_steps' in the run file 'run.yaml' must be a int, got 'many'"),
        ("recipe: mae\n", "'recipe' in the run file 'run.yaml' must be 'none' or 'deit', got 'mae'"),
        ("- 1\n- 2\n", "must hold option: value pairs, got a list"),
        ("max_steps: [1\n", "cannot be read"),
        ("max_steps: 0\n", "--max_steps must be a positive integer, got 0"),
    ],
)
def test_a_bad_run_file_is_one_line_naming_the_value(tmp_path, capsys, content, message):
    path = tmp_path / "run.yaml"
    path.write_text(content)
    code, _, lines = run_cli(["train", "vit", str(path), "--output_dir", str(tmp_path / "out")], capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hf-vit-plus train vit: error: "), lines
    assert message in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_missing_or_foreign_run_file_is_refused(tmp_path, capsys):
    code, _, lines = run_cli(["train", "vit", str(tmp_path / "missing.yaml")], capsys)
    assert code == 2 and "does not exist" in lines[0], lines
    (tmp_path / "run.txt").write_text("max_steps: 3")
    code, _, lines = run_cli(["train", "vit", str(tmp_path / "run.txt")], capsys)
    assert code == 2 and "must be a .yaml, .yml or .json file of options" in lines[0], lines


# ----------------------------------------------------------------------------------- --print_config, run_config.yaml
@pytest.mark.parametrize("family", ["vit", "seq2seq"])
def test_print_config_round_trips(tmp_path, capsys, family):
    code, printed, err = run_cli(["train", family, "--output-dir", str(tmp_path / "out"), "--max_steps", "7",
                                  "--print_config"], capsys)  # fmt: skip
    assert code == 0, err
    assert not (tmp_path / "out").exists()  # nothing run, nothing written
    path = tmp_path / "printed.yaml"
    path.write_text(printed)
    code, again, err = run_cli(["train", family, str(path), "--print_config"], capsys)
    assert code == 0, err
    assert again == printed
    import yaml

    options = yaml.safe_load(printed)
    plan = preview_plan(family_arguments(family, output_dir=str(tmp_path / "out"), max_steps=7), get_task(family))
    assert set(options) == {"family"} | {flag.name for flag in flag_fields(family)}
    assert options == {key: value for key, value in plan.options_dict().items() if key in options}
    if family == "seq2seq":
        assert "learning_rate: 0.00125  # the seq2seq family" in printed
        assert "lr_scheduler_type: noam  # the seq2seq family" in printed
    else:
        assert "learning_rate: 0.002  # --recipe none" in printed and "max_steps: 7\n" in printed


def test_run_config_reproduces_a_short_run_bitwise(tmp_path, capsys):
    """Every run writes its resolved options as OUTPUT_DIR/run_config.yaml; `train vit that-file --output_dir B`
    plans the same run (the same options but the folder), starts with the same lines and ends with bitwise the same
    weights on the CPU."""
    from safetensors.torch import load_file

    with run_report() as report:
        code, _, err = run_cli(["train", "vit", *TINY_VIT, "--output_dir", str(tmp_path / "a")], capsys)
    assert code == 0, err
    run_config = tmp_path / "a" / "run_config.yaml"
    assert run_config.is_file()
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # a fresh process, as a repeated run is: no earlier run's precision
    with run_report() as again:
        code, _, err = run_cli(["train", "vit", str(run_config), "--output_dir", str(tmp_path / "b")], capsys)
    assert code == 0, err
    lines = first_lines(report.getvalue())
    assert first_lines(again.getvalue()) == lines
    assert any(line.startswith("Chosen by --recipe none: learning_rate 0.002") for line in lines), lines
    rewritten = (tmp_path / "b" / "run_config.yaml").read_text()
    assert rewritten == run_config.read_text().replace(str(tmp_path / "a"), str(tmp_path / "b"))
    first, second = (load_file(tmp_path / name / "model.safetensors") for name in ("a", "b"))
    assert first.keys() == second.keys() and all(first[key].equal(second[key]) for key in first)


# ------------------------------------------------------------------------------------------ one meaning per flag
def test_seq2seq_learning_rate_is_the_peak_of_the_logged_rates(tmp_path, capsys):
    """--learning_rate was a factor of the paper's schedule for seq2seq and a rate elsewhere: it is the peak rate
    of every family now, the paper's schedule through transformers' inverse_sqrt."""
    output = tmp_path / "s2s"
    with run_report() as report:
        code, _, err = run_cli(["train", "seq2seq", "--learning_rate", "5e-4", "--max_steps", "20",
                                "--logging_steps", "1", "--max_train_samples", "256", "--max_eval_samples", "16",
                                "--per_device_train_batch_size", "16", "--report_to", "none", "--save_steps", "none",
                                "--write_card", "false", "--output_dir", str(output)], capsys)  # fmt: skip
    assert code == 0, err
    history = json.loads((output / "log_history.json").read_text())
    rates = [entry["learning_rate"] for entry in history if "loss" in entry]
    assert len(rates) == 20 and max(rates) == 5e-4
    warmup = math.ceil(0.1 * 20)  # the family's warm-up ratio: the rate peaks there, then decays as 1 / sqrt(update)
    assert rates.index(5e-4) == warmup - 1 and rates[-1] == pytest.approx(5e-4 * math.sqrt(warmup / 20))
    said = "Schedule: noam (transformers' inverse_sqrt), peak learning rate 0.0005 after 2 warm-up updates"
    assert said in report.getvalue()


# ---------------------------------------------------------------------------------------- each default, once
def _definitions(family: str, name: str) -> list[str]:
    """Where a value of option `name` for `family` is defined: the option itself, the family's record, its recipe
    or its built-in data sets."""
    record = get_family(family)
    flag = next(f for f in flag_fields(family) if f.name == name)
    places = []
    if flag.metadata["default"] is not None:
        places.append("option")
    if name in record.training_defaults:
        places.append("record")
    if "recipe" in record.flags and name in RECIPE_NONE:
        places.append("recipe")
    if name == "num_train_epochs" and record.datasets:
        places.append("data set")
    if name == "lr_scheduler_type":
        places.append("record")  # Family.lr_scheduler: what 'auto' names
    return places


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_default_is_defined_once_and_the_plan_says_where(family):
    record = get_family(family)
    plan = preview_plan(family_arguments(family), get_task(family))  # no option given: every value a default
    for flag in flag_fields(family):
        name, chooser = flag.name, plan.chosen_by[flag.name]
        places = _definitions(family, name)
        # the record never repeats the option's own default, and nothing both the recipe and the record define
        if name in record.training_defaults:
            assert record.training_defaults[name] != flag.metadata["default"], f"{family}: {name} twice"
        assert not {"record", "recipe"} <= set(places), f"{family}: {name} in the record and the recipe"
        value = plan.option(name)
        if chooser == "the default":
            assert value == flag.metadata["default"] or name == "mixed_precision", (name, value)  # Accelerate's "no"
            assert "record" not in places and "recipe" not in places, (family, name)
        elif chooser == f"the {family} family":
            assert "record" in places and "recipe" not in places, (family, name)
        elif chooser.startswith("--recipe"):
            assert "recipe" in places and flag.metadata["default"] is None, (family, name)
        elif chooser.startswith("--dataset"):
            assert places == ["data set"], (family, name)
        else:
            pytest.fail(f"{family}: {name} chosen by {chooser!r} though no option was given")
    assert plan.chosen_by["output_dir"] == f"the {family} family"


# option -> the default numbers it has in some family (0 and 1 left out: bounds and switches, not restated defaults)
def _default_numbers() -> dict[str, set[float]]:
    numbers: dict[str, set[float]] = {}
    for family, record in FAMILIES.items():
        for flag in flag_fields(family):
            values = [flag.metadata["default"], record.training_defaults.get(flag.name)]
            if "recipe" in record.flags:
                values.append(RECIPE_NONE.get(flag.name))
            for value in values:
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value not in (0, 1):
                    numbers.setdefault(flag.name, set()).add(float(value))
    return numbers


NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w.])")


def test_no_help_text_or_comment_restates_a_default():
    """A default is written once, in its table; the help states it from there (`--help` adds "(default: X)", the
    recipe words its own from `recipes.py`). A help text written out, or a string or comment of the package that
    names an option, with a number equal to one of the option's defaults restates it, and drifts."""
    numbers = _default_numbers()
    found = []
    for family, record in FAMILIES.items():  # the help texts written out (the computed ones read the tables)
        for flag in flag_fields(family):
            for text in (flag.metadata["help"], record.flag_help.get(flag.name)):
                if isinstance(text, str) and {float(n) for n in NUMBER.findall(text)} & numbers.get(flag.name, set()):
                    found.append(f"{family} --{flag.name}: {text}")
    for path in sorted((REPO_ROOT / "hf_vit_plus").rglob("*.py")):
        with path.open("rb") as source:
            tokens = [t for t in tokenize.tokenize(source.readline) if t.type in (tokenize.STRING, tokenize.COMMENT)]
        for token in tokens:
            text = re.sub(r"\{[^{}]*\}", "", token.string)  # an f-string's fields are code, not restated values
            for name, defaults in numbers.items():
                for match in re.finditer(rf"\b{name}\b([^\n]{{0,40}})", text):
                    if {float(n) for n in NUMBER.findall(match[1])} & defaults:
                        found.append(f"{path.relative_to(REPO_ROOT)}:{token.start[0]}: {match[0]}")
    assert not found, "\n".join(found)


# ------------------------------------------------------------------------------------------- the arguments, once
# a tiny run of each kind of task: images (with the recipe's augmentation, mixing and EMA: the hooks that read it) and
# text (a tokenizer trained on the data, the model sized for it)
AFTER_THE_PLAN_RUNS = {
    "vit": dict(config_overrides=TINY_VIT_OVERRIDES, recipe="deit", max_train_samples=64, max_eval_samples=32,
                per_device_train_batch_size=16),
    "seq2seq": dict(config_overrides="d_model=16,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,"
                    "decoder_attention_heads=2,encoder_ffn_dim=32,decoder_ffn_dim=32", max_train_samples=32,
                    max_eval_samples=8, per_device_train_batch_size=8, vocab_size=300),
}  # fmt: skip


@pytest.mark.parametrize("family", list(AFTER_THE_PLAN_RUNS))
def test_nothing_writes_to_or_reads_the_arguments_after_the_plan(family, tmp_path, monkeypatch):
    """The arguments are frozen, no arguments object is made once the plan is built, and the loop, the tasks, their
    hooks, the outputs and the card read the plan's groups of resolved options, never an arguments object: neither
    the one the run was given nor another (the plan keeps none)."""
    from hf_vit_plus.training import loop
    from hf_vit_plus.training.options import OPTION_GROUPS
    from hf_vit_plus.training.plan import PLAN_GROUPS

    args = family_arguments(family, output_dir=str(tmp_path / "run"), max_steps=3, report_to="none", save_steps=2,
                            **AFTER_THE_PLAN_RUNS[family])  # fmt: skip
    plans, made_after, read_after = [], [], []
    real_build_plan = loop.build_plan

    def build_plan(*arguments, **keywords):
        plans.append(real_build_plan(*arguments, **keywords))
        return plans[-1]

    real_post_init = TrainingArguments.__post_init__

    def post_init(self):
        if plans:
            made_after.append(self)
        real_post_init(self)

    def getattribute(self, name):
        if plans and not name.startswith("__"):  # any arguments object, read once the plan is built
            read_after.append(name)
        return object.__getattribute__(self, name)

    monkeypatch.setattr(loop, "build_plan", build_plan)
    monkeypatch.setattr(TrainingArguments, "__post_init__", post_init)
    monkeypatch.setattr(TrainingArguments, "__getattribute__", getattribute)
    result = train(args)
    monkeypatch.undo()
    assert result.global_step == 3 and len(plans) == 1
    assert not made_after and not read_after, (made_after, read_after)
    plan = plans[0]
    fields = {field.name: getattr(plan, field.name) for field in dataclasses.fields(plan)}
    assert not [name for name, value in fields.items() if isinstance(value, TrainingArguments)]
    assert [type(fields[name]) for name in PLAN_GROUPS] == list(OPTION_GROUPS)
    for frozen in (args, plan, plan.launch, plan.schedule, *(fields[name] for name in PLAN_GROUPS)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            frozen.seed = 1  # any attribute: frozen dataclasses refuse them all
    assert (tmp_path / "run" / "README.md").is_file()  # the card was written, from the plan
    # a training state holds the resolved options as one dict, as the arguments would give it (same keys, same order)
    state = json.loads((tmp_path / "run" / "checkpoints" / "checkpoint-3" / "training_state.json").read_text())
    assert state["args"] == plan.options_dict() and list(state["args"]) == list(args.to_dict())


def test_the_loop_the_tasks_and_the_outputs_read_groups_not_the_arguments():
    """The plan holds the resolved options in their groups and no arguments object; the modules that run the plan
    read no `.options` of a plan or a run (the flat dict a training state saves is `RunPlan.options_dict`)."""
    import ast

    from hf_vit_plus.training.plan import PLAN_GROUPS, RunPlan

    annotations = {field.name: str(field.type) for field in dataclasses.fields(RunPlan)}
    assert not [name for name, kind in annotations.items() if "TrainingArguments" in kind], annotations
    assert {annotations[name] for name in PLAN_GROUPS} == {group.__name__ for group in PLAN_GROUPS.values()}
    found = []
    training = REPO_ROOT / "hf_vit_plus" / "training"
    paths = [training / name for name in ("loop.py", "setup.py", "outputs.py", "run_file.py", "plan.py")]
    for path in paths + sorted((training / "tasks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "options":
                found.append(f"{path.relative_to(REPO_ROOT).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_only_the_arguments_and_the_plan_make_options():
    """In the package, arguments are made only where they are given (args.py: the defaults while they are made) and
    resolved only by the plan (`dataclasses.replace` in plan.py): no other module rewrites them."""
    import ast

    places = []
    for path in sorted((REPO_ROOT / "hf_vit_plus").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in ("dataclasses.replace", "replace", "object.__setattr__", "setattr") and node.args:
                target = ast.unparse(node.args[0])
                if target in ("args", "options", "self") or target.endswith((".args", ".options")):
                    places.append(f"{path.relative_to(REPO_ROOT).as_posix()}: {name}({target}, ...)")
    assert sorted(set(places)) == [
        "hf_vit_plus/training/args.py: object.__setattr__(self, ...)",
        "hf_vit_plus/training/plan.py: dataclasses.replace(options, ...)",
    ], places


def test_redirected_stdout_is_the_run_file(tmp_path):
    """--print_config writes only the run file to stdout (logs go to stderr): `> run.yaml` keeps it."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["train", "image-lm", "--max_steps", "2", "--print_config", "--output_dir", str(tmp_path)]) == 0
    text = out.getvalue()
    assert text.startswith("# The resolved options of a `hf-vit-plus train image-lm` run.")
    assert "num_train_epochs: " in text and "  # --dataset digits" in text
    assert Path(tmp_path).exists() and not any(Path(tmp_path).iterdir())


def test_a_training_state_saved_with_the_old_seq2seq_factor_is_refused(tmp_path):
    """A seq2seq training state from before --learning_rate was the peak holds a schedule at the old factor (its
    base rate 0.25): resuming it would train at that rate. It is refused in one line, naming why."""
    from hf_vit_plus.training.checkpoints import STATE_FILE, STATE_FORMAT
    from hf_vit_plus.training.plan import resume_point

    old = tmp_path / "checkpoint-2"
    old.mkdir()
    state = {"format": STATE_FORMAT, "family": "seq2seq", "args": {"lr_scheduler_type": "auto", "learning_rate": 0.25}}
    (old / STATE_FILE).write_text(json.dumps(state))
    args = family_arguments("seq2seq", output_dir=str(tmp_path), resume_from_checkpoint=str(old))
    with pytest.raises(ValueError, match="was a factor of the paper's schedule; it is now the peak learning rate"):
        resume_point(args, get_task("seq2seq"))
    vit = family_arguments("vit", output_dir=str(tmp_path), resume_from_checkpoint=str(old))
    (old / STATE_FILE).write_text(json.dumps({"format": STATE_FORMAT, "family": "vit", "args": {}}))
    assert resume_point(vit, get_task("vit"))[0].path == old  # a cosine schedule's state resumes as it did
