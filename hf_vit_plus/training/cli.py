"""`hf-vit-plus train {families}` and `hf-vit-plus demo`.

Both run the Accelerate loop of `hf_vit_plus.training.loop`; start them under `accelerate launch` (or torchrun)
for several processes, e.g. `accelerate launch --multi_gpu --num_processes 2 -m hf_vit_plus.cli train vit ...`.
`hf-vit-plus train FAMILY RUN_FILE [flags]` takes the options of a run file (e.g. a run's run_config.yaml), the flags
on top; --print_config prints the run's resolved options and exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from ..cli_utils import CommandParser, HelpFormatter, parse_bool
from ..data.number_words import number_to_words
from ..errors import UsageError, check_model_location
from ..families import FAMILIES, Family
from ..utils.extras import require
from .args import FAMILIES as FAMILY_IDS
from .args import TrainingArguments, family_arguments
from .options import OPTION_GROUPS, RENAMED, applies, base_type, flag_fields, group_fields, help_text, option_default
from .run_file import RUN_FILE_SUFFIXES, read_run_file

# the command's description: the module's, with the families of `hf_vit_plus.families`
DESCRIPTION = __doc__.replace("{families}", "{" + ",".join(FAMILIES) + "}")
# The demo keeps the last training state only: enough to resume, small on disk.
DEMO_DEFAULTS = dict(num_train_epochs=30.0, save_steps="epoch", save_total_limit=1)
# A run that SIGTERM stopped saved its state and ends with the status of a process SIGTERM ended (128 + 15): `&&`, a
# scheduler's "after success" dependency or a launcher sees an unfinished run, and a requeue sees a preempted one.
SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM


def add_parser(subparsers) -> None:
    train_parser = subparsers.add_parser(
        "train",
        help=f"train a model with Accelerate (one loop for the {number_to_words(len(FAMILIES))} families)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    family_parsers = train_parser.add_subparsers(
        dest="family_command", required=True, metavar="{" + ",".join(FAMILIES) + "}", parser_class=FamilyParser
    )
    for name, family in FAMILIES.items():
        parser = family_parsers.add_parser(
            name, help=family.help, description=f"Train {family.help} with Accelerate.", formatter_class=HelpFormatter
        )
        add_training_arguments(parser, name)
        parser.set_defaults(func=run_train)

    demo = subparsers.add_parser(
        "demo",
        help="train a small ViT on the built-in digits, evaluate, write the card and figures, reload and predict",
        formatter_class=HelpFormatter,
    )
    demo.add_argument("--output_dir", default="outputs/demo", help="where the model, card and figures go")
    demo.add_argument(
        "--num_train_epochs", type=float, default=DEMO_DEFAULTS["num_train_epochs"], help="passes over the digits"
    )
    demo.add_argument("--max_steps", type=int, default=None, help="stop after this many updates (quick runs)")
    hidden = dict(default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    demo.add_argument("--max_train_steps", dest="max_steps", type=int, **hidden)  # the pre-0.3 name
    demo.add_argument("--seed", type=int, default=42, help="random seed of the initial weights and the data order")
    demo.add_argument("--report_to", default="tensorboard", help="tracker(s) of accelerate's log_with, or 'none'")
    demo.add_argument("--min_accuracy", type=float, default=0.0, help="exit with status 1 below this accuracy")
    demo.add_argument(
        "--num_threads",
        type=int,
        default=None,
        help="torch threads per process (default: OMP_NUM_THREADS if set, else 1: the model is tiny, and one thread "
        "per process avoids oversubscribing a shared machine)",
    )
    demo.add_argument("--push_to_hub", action="store_true", help="push the model folder (needs --hub_model_id)")
    demo.add_argument("--hub_model_id", default=None, help="Hub repository to push to, 'namespace/name'")
    demo.add_argument("--hub_revision", default=None, help="branch to push to (created if missing; default: main)")
    demo.add_argument(
        "--license", default="apache-2.0", help="the model card's licence: a Hub licence id (e.g. apache-2.0, mit)"
    )
    demo.set_defaults(func=run_demo)


# ------------------------------------------------------------------------------------- the options' command line
# The flags of `hf-vit-plus train FAMILY`, one section of `--help` per option group, made from the groups and read
# into `TrainingArguments` (the module's docstring is the command's description).
class FamilyParser(CommandParser):
    """The parser of `hf-vit-plus train FAMILY`: its RUN_FILE positional keeps a value only when it names a run file
    (`.yaml`, `.yml`, `.json`); a stray value after an unknown flag stays with that flag in the error."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        run_file = getattr(namespace, "run_file", None)
        if extras and run_file and not str(run_file).lower().endswith(RUN_FILE_SUFFIXES):
            extras = [extras[0], run_file, *extras[1:]]
            namespace.run_file = None
        return namespace, extras


def add_training_arguments(parser: argparse.ArgumentParser, family: str) -> argparse.ArgumentParser:
    """Add the options of `family` to `parser`: a run file (positional), --print_config, and one flag per field of
    the option groups that applies to the family, in one section per group, with the family's defaults and help.

    A flag the command line does not give stays out of the namespace (its default is `argparse.SUPPRESS`): the
    arguments know which options were given (`TrainingArguments.given`), and the help states each default. The
    pre-0.3 names (`RENAMED`) are hidden flags with the same destination.

    Args:
        parser: the parser of `hf-vit-plus train FAMILY`.
        family: a family id.

    Returns:
        The parser.

    Raises:
        ValueError: an unknown family.
    """
    if family not in FAMILY_IDS:
        raise ValueError(f"Unknown family {family!r}; expected one of {FAMILY_IDS}.")
    record = FAMILIES[family]
    old_names = {new: old for old, new in RENAMED.items()}
    parser.add_argument(
        "run_file",
        nargs="?",
        default=None,
        metavar="RUN_FILE",
        help="a .yaml or .json file of options (e.g. the run_config.yaml a run writes into its output folder); the "
        "flags given with it override it",
    )
    parser.add_argument(
        "--print_config", action="store_true", help="print the run's resolved options as YAML (a run file) and exit"
    )
    for group in OPTION_GROUPS:
        flags = [f for f in group_fields(group) if applies(f, record)]
        if not flags:
            continue
        section = parser.add_argument_group(group._argument_group_name)
        for flag in flags:
            kwargs = _flag_kwargs(flag, record)
            section.add_argument(f"--{flag.name}", **kwargs)
            if flag.name in old_names:
                parser.add_argument(
                    f"--{old_names[flag.name]}", dest=flag.name, **dict(kwargs, help=argparse.SUPPRESS)
                )
    parser.set_defaults(family=family)
    return parser


def _flag_kwargs(flag: dataclasses.Field, record: Family) -> dict[str, Any]:
    """The `add_argument` keywords of an option's flag on `record`'s command line."""
    default = option_default(flag, record)
    text = help_text(flag, record)
    if default not in (None, False) and "default:" not in text:
        text += f" (default: {default})".replace("%", "%%")
    kwargs: dict[str, Any] = dict(default=argparse.SUPPRESS, help=text)
    kind = base_type(flag)
    if kind is bool:
        if default or default is None:  # `--write_card false` switches it off; None: the recipe decides
            kwargs.update(type=parse_bool, nargs="?", const=True, metavar="{true,false}")
        else:
            kwargs.update(action="store_true")
    else:
        kwargs.update(type=kind, choices=flag.metadata["choices"])
        if "nargs" in flag.metadata:
            kwargs.update(nargs=flag.metadata["nargs"])
    return kwargs


def args_from_namespace(namespace: argparse.Namespace) -> TrainingArguments:
    """`TrainingArguments` of a namespace parsed by `add_training_arguments`: the run file's options (if one was
    given), then the flags given on top.

    Args:
        namespace: the parsed command line.

    Returns:
        The options.

    Raises:
        UsageError: a run file that cannot be read, or a bad value.
    """
    family = namespace.family
    values: dict[str, Any] = {}
    given: dict[str, str] = {}
    run_file = getattr(namespace, "run_file", None)
    if run_file:
        values = read_run_file(run_file, family)
        given = dict.fromkeys(values, Path(run_file).name)
    flags = {f.name: getattr(namespace, f.name) for f in flag_fields(family) if hasattr(namespace, f.name)}
    values.update(flags)
    given.update({name: f"--{name}" for name in flags})
    return TrainingArguments(family=family, given=given, run_file=run_file, **values)


def parse_args(family: str, argv: list[str] | None = None) -> TrainingArguments:
    """Parse the command line of `hf-vit-plus train FAMILY`.

    A bad value exits with argparse's error (status 2).

    Args:
        family: the family whose flags are parsed.
        argv: the arguments (a run file and flags); None: `sys.argv[1:]`.

    Returns:
        The parsed options.
    """
    parser = FamilyParser(description=f"Train the {family} family with Accelerate.", formatter_class=HelpFormatter)
    add_training_arguments(parser, family)
    namespace = parser.parse_args(argv)
    try:
        return args_from_namespace(namespace)
    except UsageError as error:
        parser.error(str(error))


def run_train(namespace: argparse.Namespace) -> int:
    """Train a family with Accelerate (`hf-vit-plus train FAMILY`), after checking what the arguments point to.

    Args:
        namespace: the parsed command line.

    Returns:
        The exit status: 0 when the run finished or stopped as asked (--stop_after_steps) or its options were printed
        (--print_config), 143 (`SIGTERM_EXIT_STATUS`) when SIGTERM stopped it (its state saved: resume it with
        --resume_from_checkpoint latest; on each machine's first process, 0 on the others), 1 otherwise.

    Raises:
        UsageError: a bad value, or data, model or checkpoint paths that do not exist.
    """
    require("train", "hf-vit-plus train")
    from .loop import train, user_errors

    args = args_from_namespace(namespace)  # checks the values
    check_inputs(args)
    if namespace.print_config:
        from .plan import preview_plan
        from .run_file import run_config_text
        from .tasks import get_task

        with user_errors():
            plan = preview_plan(args, get_task(args.family))
        print(run_config_text(plan), end="")
        return 0
    result = train(args)
    return _exit_status(result.stop_reason)


def _exit_status(stop_reason: str) -> int:
    if stop_reason == "SIGTERM":
        from accelerate import PartialState

        # Under a launcher, each machine's first process alone: the launcher ends a machine's other processes
        # when one fails, and the first one has its last lines to write (and the run's lock to release).
        return SIGTERM_EXIT_STATUS if PartialState().is_local_main_process else 0
    return 0 if stop_reason in ("finished", "stop_after_steps") else 1


def check_inputs(args: TrainingArguments) -> None:
    """Check what the arguments point to before any work starts: data and model paths, the checkpoint to resume
    from, and the --config_overrides keys (against the config class the run builds). Raises `UsageError`."""
    from .checkpoints import resolve_checkpoint
    from .tasks import check_config_overrides, get_task, parse_overrides

    args.check_paths()
    if args.resume_from_checkpoint:
        try:
            resolve_checkpoint(args.resume_from_checkpoint, args.output_dir)
        except (FileNotFoundError, ValueError) as error:  # missing folder, or not a training checkpoint
            raise UsageError(str(error)) from error
    task = get_task(args.family)
    # a saved config is read once a run, by the plan, which checks the keys against its class then: here only its
    # location; the class of a fresh config (or of a --config_name preset, checked here) is known now
    if args.model_name_or_path:
        check_model_location(args.model_name_or_path, "--model_name_or_path")
    elif args.config_name and not task.is_preset(args.config_name):
        check_model_location(args.config_name, "--config_name")
    else:
        check_config_overrides(task.config_class_for(args), parse_overrides(args.config_overrides))


def run_demo(namespace: argparse.Namespace) -> int:
    """Train a small ViT on the digits (`hf-vit-plus demo`), then reload it and show its held-out predictions.

    Args:
        namespace: the parsed command line.

    Returns:
        The exit status: 1 when the held-out accuracy is below --min_accuracy or the loss diverged, 143 when SIGTERM
        stopped it (it prints how to resume), else 0.
    """
    require("train", "hf-vit-plus demo")
    import torch
    from accelerate import PartialState

    from .loop import train

    args = family_arguments(
        "vit",
        output_dir=namespace.output_dir,
        num_train_epochs=namespace.num_train_epochs,
        max_steps=namespace.max_steps,
        seed=namespace.seed,
        report_to=namespace.report_to,
        push_to_hub=namespace.push_to_hub,
        hub_model_id=namespace.hub_model_id,
        hub_revision=namespace.hub_revision,
        license=namespace.license,
        save_steps=DEMO_DEFAULTS["save_steps"],
        save_total_limit=DEMO_DEFAULTS["save_total_limit"],
    )
    check_inputs(args)
    threads = namespace.num_threads or int(os.environ.get("OMP_NUM_THREADS") or 1)
    torch.set_num_threads(max(1, threads))
    start = time.perf_counter()
    result = train(args)
    if result.interrupted:
        print(f"Demo interrupted ({result.stop_reason}); resume with: hf-vit-plus train vit --output_dir "
              f"{args.output_dir} --resume_from_checkpoint latest")  # fmt: skip
        return _exit_status(result.stop_reason)
    if not PartialState().is_main_process:
        return 0
    accuracy = result.eval_metrics["accuracy"]
    output_dir = Path(args.output_dir)
    print(f"\nHeld-out accuracy on {result.eval_metrics['samples']} digits: {accuracy:.2%} "
          f"({result.global_step} updates, {result.train_seconds:.0f} s of training, "
          f"{time.perf_counter() - start:.0f} s in all)")  # fmt: skip
    print(f"Reloading {output_dir} with AutoModelForImageClassification.from_pretrained:")
    for i, (predicted, truth) in enumerate(predictions_preview(output_dir, result.raw_datasets, n=10)):
        print(preview_line(i, predicted, truth))
    written = sorted(p.name for p in output_dir.iterdir() if p.is_file())
    print(f"Files in {output_dir}: {', '.join(written)}")
    (output_dir / "demo_summary.json").write_text(
        json.dumps({"accuracy": accuracy, "updates": result.global_step, "train_seconds": result.train_seconds})
    )
    if accuracy < namespace.min_accuracy:
        print(f"Accuracy {accuracy:.2%} is below --min_accuracy {namespace.min_accuracy:.2%}.")
        return 1
    return 0


def preview_line(index: int, predicted: str, truth: str) -> str:
    """One line of the demo's predictions: `index` numbers the validation image (it is not a digit; the class names
    are the digits' words)."""
    verdict = "ok" if predicted == truth else "WRONG"
    return f"  validation image {index}: predicted {predicted:<6} truth {truth:<6} {verdict}"


def predictions_preview(model_dir: Path, raw, n: int = 8) -> list[tuple[str, str]]:
    """(predicted, true) class names of the first `n` validation images, by the model reloaded from `model_dir`
    with the Auto classes, as a user would load it."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(model_dir).eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)
    mode = "L" if model.config.num_channels == 1 else "RGB"
    rows = raw["validation"].select(range(min(n, len(raw["validation"]))))
    inputs = processor(images=[row["image"].convert(mode) for row in rows], return_tensors="pt")
    with torch.no_grad():
        predicted = model(**inputs).logits.argmax(-1).tolist()
    names = raw["validation"].features["label"].names
    return [(model.config.id2label[p], names[row["label"]]) for p, row in zip(predicted, rows)]
