"""The options of a training run: `TrainingArguments`, the union of the option groups (`options.py`), and how they
are given: on the command line, in a run file, or from Python.

`hf-vit-plus train FAMILY [RUN_FILE] [flags]` takes one flag per field of the groups that applies to the family
(`cli.add_training_arguments`), in one section of `--help` per group; flags are written with underscores or dashes
(`--output_dir`, `--output-dir`), as transformers' `HfArgumentParser` reads them. A run file (`.yaml`, `.json`; e.g.
the `run_config.yaml` a run writes, `run_file.py`) gives options in place of the flags, and flags given with it
override it, as the example scripts of transformers take their options from one file. From Python:
`family_arguments("vit", ...)`.

An option that is not given takes the family's default (its record, `hf_vit_plus.families`), else its own
(`options.default_choice`), here and nowhere else; `TrainingArguments.given` says where each given one came from, and
`TrainingArguments.chosen_by` who chose every value. What is left None (the learning rate of a family with a recipe,
the epochs of a built-in data set, ...) is decided once, with the rest of the run, by the plan (`plan.py`), which the
loop, the tasks and the outputs read instead of the arguments. The arguments are frozen: nothing writes to them after
they are made.

The pre-0.3 names (`RENAMED`) are still accepted: as hidden flags, as keys of a run file and as keywords of
`family_arguments`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli_utils import one_of
from ..data.files import is_glob, matching_files
from ..errors import UsageError, check_exists, check_model_location
from ..families import FAMILIES as FAMILY_RECORDS
from ..families import Family
from ..tokenization import MAX_VOCAB_SIZE
from .fsdp_config import read_fsdp_config
from .options import (
    AUTO_AUGMENTS,
    MIXED_PRECISION,
    OWN,
    RECIPES,
    RENAMED,
    SCHEDULERS,
    UNSET,
    CheckpointArguments,
    DataArguments,
    HubArguments,
    LoaderArguments,
    LoggingArguments,
    LoraArguments,
    ModelArguments,
    OptimizationArguments,
    ParallelismArguments,
    RecipeArguments,
    base_type,
    default_choice,
    flag_fields,
    group_fields,
    option_fields,
)

FAMILIES = tuple(FAMILY_RECORDS)


# The groups are listed last first: a dataclass takes its bases' fields in reverse order of its bases.
@dataclass(frozen=True, kw_only=True)
class TrainingArguments(
    HubArguments,
    LoraArguments,
    LoggingArguments,
    CheckpointArguments,
    ParallelismArguments,
    RecipeArguments,
    OptimizationArguments,
    LoaderArguments,
    DataArguments,
    ModelArguments,
):
    """The options of a training run, for every family: the fields of the option groups (`options.py`), one per
    `hf-vit-plus train FAMILY` flag, each with its help in its metadata, as transformers' `HfArgumentParser` reads
    it. Build one with `family_arguments` or `parse_args`; an option left out takes the family's default, else its own.

    Args:
        family: the family the run trains (a key of `hf_vit_plus.families.FAMILIES`): which options apply, and their
            defaults.
        given: option -> where it was given: "--max_steps" (on the command line or from Python), a run file's name;
            by default, every option passed to the constructor, as "--name".
        run_file: the run file the options were read from, if any (`run_file.read_run_file`).

    Attributes:
        defaults: option -> (its default for the family, who chose it: "the vit family", "the default";
            `options.default_choice`), given or not: what the plan compares a run file's value with.
        chosen_by: option -> who chose its value: where it was given, else its default's chooser.
    """

    family: str = "vit"
    given: Mapping[str, str] = field(default=UNSET, compare=False, repr=False)
    run_file: str | None = field(default=None, compare=False, repr=False)
    defaults: Mapping[str, tuple[Any, str]] = field(init=False, compare=False, repr=False)
    chosen_by: Mapping[str, str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # the one place the defaults are given to the options left out, and where each value's chooser is recorded
        if self.family not in FAMILIES:
            raise UsageError(f"Unknown family {self.family!r}; expected one of {FAMILIES}.")
        record = FAMILY_RECORDS[self.family]
        defaults = {flag.name: default_choice(flag, record) for flag in option_fields()}
        passed = [name for name in defaults if getattr(self, name) is not UNSET]
        given = {name: f"--{name}" for name in passed} if self.given is UNSET else dict(self.given)
        chosen_by = {}
        for name, (value, source) in defaults.items():
            if getattr(self, name) is UNSET:
                object.__setattr__(self, name, value)
                chosen_by[name] = source
            elif name in given:
                chosen_by[name] = given[name]
            else:  # a value set from Python without saying where it came from (`dataclasses.replace`)
                chosen_by[name] = source if getattr(self, name) == value else f"--{name}"
        object.__setattr__(self, "given", given)
        object.__setattr__(self, "defaults", defaults)
        object.__setattr__(self, "chosen_by", chosen_by)
        self.validate()

    def _check_license(self) -> None:
        """--license is one of the Hub's licence ids (`hf_vit_plus.hub.card.HUB_LICENSES`), or a UsageError."""
        from ..hub.card import check_license

        try:
            check_license(self.license)
        except ValueError as error:
            raise UsageError(f"--license: {error}") from error

    def validate(self) -> None:
        """Raise a `UsageError` (a `ValueError`) naming the offending option.

        A value left None that the plan decides (`PLANNED`) is checked when the plan has decided it.
        """
        family = FAMILY_RECORDS[self.family]
        self._validate_data_choice(family)
        check_values(self.to_dict(), required=REQUIRED_VALUES - PLANNED)
        check_report_to(self.report_to)
        if self.recipe not in RECIPES:
            raise UsageError(f"--recipe must be one of {RECIPES}, got {self.recipe!r}.")
        if self.auto_augment is not None and self.auto_augment not in AUTO_AUGMENTS:
            raise UsageError(f"--auto_augment must be one of {AUTO_AUGMENTS}, got {self.auto_augment!r}.")
        if self.lr_scheduler_type not in SCHEDULERS:
            raise UsageError(f"--lr_scheduler_type must be one of {SCHEDULERS}, got {self.lr_scheduler_type!r}.")
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISION:
            raise UsageError(f"--mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}.")
        if self.fsdp_config is not None:
            if not self.fsdp:
                raise UsageError("--fsdp_config needs --fsdp (it tunes the sharding --fsdp switches on).")
            read_fsdp_config(self.fsdp_config)
        if isinstance(self.num_train_epochs, bool):
            raise UsageError(f"--num_train_epochs must be a number > 0, got {self.num_train_epochs!r}.")
        if self.max_steps is None and self.num_train_epochs is not None:
            number("--num_train_epochs", self.num_train_epochs, low=0.0, low_open=True)
        steps = self.save_steps
        if steps not in ("epoch", "none") and not (str(steps).isdigit() and int(steps) > 0):
            raise UsageError(f"--save_steps must be 'epoch', 'none' or a positive integer, got {steps!r}.")
        if self.lora_r is not None:
            integer("--lora_r", self.lora_r)
            if not self.model_name_or_path:
                raise UsageError(
                    "--lora_r trains an adapter of a pre-trained model: give it with --model_name_or_path (an adapter "
                    "of freshly initialised weights would be useless without them)."
                )
        elif self.lora_alpha is not None or self.lora_target_modules is not None:
            raise UsageError("--lora_alpha and --lora_target_modules need --lora_r (the adapter's rank).")
        if self.lora_alpha is not None:
            number("--lora_alpha", self.lora_alpha, low=0.0, low_open=True)
        number("--lora_dropout", self.lora_dropout, low=0.0, high=1.0)
        if self.push_to_hub and not self.hub_model_id:
            raise UsageError("--push_to_hub needs --hub_model_id (e.g. 'my-user/vit-digits').")
        self._check_license()
        for flag in ("source_lang", "target_lang"):
            code = getattr(self, flag)
            if code is not None and not re.fullmatch(r"[a-z]{2,3}(-[A-Za-z0-9]{2,8})*", code):
                raise UsageError(f"--{flag} must be a language code such as 'en', 'de' or 'pt-BR' (ISO 639), got "
                                 f"{code!r}.")  # fmt: skip
        if self.train_dir and self.train_file:
            raise UsageError("Give either --train_dir (an image folder) or --train_file, not both.")
        if family.data == "images" and self.train_file:
            raise UsageError(
                f"The {self.family} family reads images: use --train_dir or --dataset_name, not --train_file."
            )
        if family.data == "text" and self.train_dir:
            raise UsageError(
                f"The {self.family} family reads text: use --train_file or --dataset_name, not --train_dir."
            )
        if self.dataset_name and (self.train_dir or self.train_file):
            raise UsageError("Give either --dataset_name (Hub) or local data (--train_dir / --train_file), not both.")
        if self.validation_file and not self.train_file:
            raise UsageError("--validation_file needs --train_file.")
        if self.validation_dir and not self.train_dir:
            raise UsageError("--validation_dir needs --train_dir.")
        self._validate_loading()

    def _validate_loading(self) -> None:
        """--streaming, --max_tokens_per_batch and the loader's workers: what each needs and refuses (a run file holds
        every option of its run: only values given as flags conflict)."""
        given = {name for name, label in self.given.items() if label == f"--{name}"}
        if self.streaming:
            if not (self.dataset_name or self.train_dir or self.train_file):
                raise UsageError(
                    "--streaming reads --dataset_name, --train_dir or --train_file as a stream; the built-in data is "
                    "small and read whole: give your data, or leave out --streaming."
                )
            if self.max_steps is None:
                raise UsageError(
                    "--streaming needs --max_steps: the length of a stream is not known before it is read, so the "
                    "run's length (and its learning-rate schedule) is given in updates."
                )
            if self.max_train_samples is not None:
                raise UsageError(
                    "--max_train_samples cuts a data set read whole; a stream's run is as long as --max_steps says."
                )
            if "validation_split_percentage" in given:
                raise UsageError(
                    "--validation_split_percentage splits a data set read whole; a stream without a validation split "
                    "holds out its first --max_eval_samples examples."
                )
        elif "shuffle_buffer_size" in given:
            raise UsageError("--shuffle_buffer_size is the shuffle buffer of a stream: it needs --streaming.")
        if self.max_tokens_per_batch is not None:
            if self.family == "seq2seq" and self.max_steps is None:
                raise UsageError(
                    "--max_tokens_per_batch needs --max_steps: how many batches a token budget makes of an epoch is "
                    "known only once the examples are tokenized, so the run's length is given in updates."
                )
            if "per_device_train_batch_size" in given:
                raise UsageError(
                    "Give either --max_tokens_per_batch (a budget of tokens per batch) or "
                    "--per_device_train_batch_size (a number of examples), not both."
                )
        if self.dataloader_num_workers == 0:
            for name in ("dataloader_persistent_workers", "dataloader_prefetch_factor"):
                if getattr(self, name):
                    raise UsageError(f"--{name} sets the loader's worker processes: it needs --dataloader_num_workers "
                                     ">= 1.")  # fmt: skip

    def _validate_data_choice(self, family: Family) -> None:
        """--dataset names the built-in images of the families that have some (`Family.datasets`); the other
        families read --dataset_name or files."""
        if not family.datasets:
            if self.dataset is not None:
                owners = one_of(f.id for f in FAMILY_RECORDS.values() if f.datasets)
                raise UsageError(
                    f"--dataset ({self.dataset!r}) chooses the images of the {owners} family; the {self.family} "
                    "family reads --dataset_name (a Hub data set) or local data."
                )
            return
        if self.dataset not in family.datasets:
            raise UsageError(f"Unknown --dataset {self.dataset!r}; expected one of {', '.join(family.datasets)}.")
        given = [f"--{name}" for name in ("dataset_name", "train_dir", "train_file") if getattr(self, name)]
        if given and not family.user_data:
            raise UsageError(
                f"The {self.family} family trains on built-in images ({', '.join(given)} given): choose them with "
                f"--dataset ({', '.join(family.datasets)})."
            )
        if given and self.given.get("dataset") == "--dataset":  # a run file holds every option: not its own
            raise UsageError(
                f"Give either --dataset (built-in images) or your own data ({', '.join(given)}), not both."
            )

    def check_paths(self) -> None:
        """Raise a `UsageError` naming the option whose local data or model path does not exist, or an output folder
        that cannot be written (run before any work starts; `validate` only checks values)."""
        check_output_dir(self.output_dir)
        for name, kind in (("train_dir", "dir"), ("validation_dir", "dir"), ("train_file", "file"),
                           ("validation_file", "file")):  # fmt: skip
            value = getattr(self, name)
            if value and kind == "file" and is_glob(value):  # shards: "data/train-*.parquet"
                if not matching_files(value):
                    raise UsageError(f"--{name} {value!r} matches no file.")
            elif value:
                check_exists(value, f"--{name}", kind)
        for name in ("model_name_or_path", "tokenizer_name"):
            if getattr(self, name):
                check_model_location(getattr(self, name), f"--{name}")

    def group(self, group: type):
        """The options of one group (e.g. `OptimizationArguments`), as an instance of it.

        Args:
            group: one of `options.OPTION_GROUPS`.

        Returns:
            The group's options.
        """
        return group(**{f.name: getattr(self, f.name) for f in group_fields(group)})

    def to_dict(self) -> dict:
        """The options as a plain dict, e.g. for a tracker's config or a model card.

        Returns:
            Option name -> value, and the family.
        """
        return {"family": self.family, **{f.name: getattr(self, f.name) for f in option_fields()}}


# ------------------------------------------------------------------------------------------------- value checks
def integer(option: str, value, low: int = 1, high: int | None = None) -> None:
    """An int in [low, high] (bools and floats refused)."""
    if high is not None:
        what = f"an integer from {low:,} to {high:,}"
    else:
        what = "a positive integer" if low == 1 else f"an integer >= {low}"
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise UsageError(f"{option} must be {what}, got {value!r}.")


def number(option: str, value, low: float | None = None, high: float | None = None, low_open: bool = False,
           high_open: bool = True) -> None:  # fmt: skip
    """A finite number within the bounds (NaN and infinity refused: they train NaN models)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{option} must be a finite number, got {value!r}.")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left = "" if low is None else f"{'(' if low_open else '['}{low:g}"
        right = "" if high is None else f"{high:g}{')' if high_open else ']'}"
        what = f"in {left}, {right}" if low is not None and high is not None else (
            f"{'>' if low_open else '>='} {low:g}" if low is not None else f"{'<' if high_open else '<='} {high:g}"
        )  # fmt: skip
        raise UsageError(f"{option} must be {what}, got {value!r}.")


def _positive(option, value):
    integer(option, value, 1)


def _non_negative(option, value):
    integer(option, value, 0)


# Each numeric option and its range; checked when the option has a value (or always, for REQUIRED_VALUES).
VALUE_CHECKS: dict[str, Callable[[str, Any], None]] = {
    **dict.fromkeys(
        (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
            "logging_steps",
            "max_source_length",
            "max_target_length",
            "block_size",
            "max_steps",
            "stop_after_steps",
            "eval_steps",
            "max_train_samples",
            "max_eval_samples",
            "save_total_limit",
            "max_tokens_per_batch",
            "dataloader_prefetch_factor",
            "ddp_timeout",
        ),
        _positive,
    ),  # fmt: skip
    **dict.fromkeys(("dataloader_num_workers", "warmup_steps", "shuffle_buffer_size"), _non_negative),
    "vocab_size": lambda option, value: integer(option, value, 260, MAX_VOCAB_SIZE),  # BPE: 4 specials + 256 bytes
    "seed": lambda option, value: integer(option, value, 0, 2**32 - 1),  # numpy's seeds
    # 0 trains nothing: the initial weights evaluated and saved (a run's own untrained baseline)
    "learning_rate": lambda option, value: number(option, value, low=0.0),
    "weight_decay": lambda option, value: number(option, value, low=0.0),
    "adam_beta1": lambda option, value: number(option, value, low=0.0, high=1.0),
    "adam_beta2": lambda option, value: number(option, value, low=0.0, high=1.0),
    "adam_epsilon": lambda option, value: number(option, value, low=0.0, low_open=True),
    "max_grad_norm": lambda option, value: number(option, value, low=0.0),
    "divergence_factor": lambda option, value: number(option, value, low=0.0),
    "warmup_ratio": lambda option, value: number(option, value, low=0.0, high=1.0),
    "validation_split_percentage": lambda option, value: number(option, value, 0.0, 100.0, low_open=True),
    "label_smoothing_factor": lambda option, value: number(option, value, low=0.0, high=1.0),
    "auto_augment_magnitude": lambda option, value: integer(option, value, 0, 30),
    "random_resized_crop_scale": lambda option, value: number(option, value, 0.0, 1.0, low_open=True, high_open=False),
    "random_erasing_prob": lambda option, value: number(option, value, 0.0, 1.0, high_open=False),
    "mixup_alpha": lambda option, value: number(option, value, low=0.0),
    "cutmix_alpha": lambda option, value: number(option, value, low=0.0),
    "mixup_prob": lambda option, value: number(option, value, 0.0, 1.0, high_open=False),
    "auto_augment_prob": lambda option, value: number(option, value, 0.0, 1.0, high_open=False),
    "ema_decay": lambda option, value: number(option, value, 0.0, 1.0),
    "max_train_minutes": lambda option, value: number(option, value, low=0.0, low_open=True),
}
REQUIRED_VALUES = {
    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "logging_steps",
    "max_source_length", "max_target_length", "block_size", "vocab_size", "dataloader_num_workers", "seed",
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "warmup_ratio",
    "divergence_factor", "ddp_timeout", "validation_split_percentage", "label_smoothing_factor",
}  # fmt: skip
# Options that may be left None in the arguments: the plan decides them (the family's recipe, or the data).
PLANNED = {"learning_rate", "warmup_ratio", "label_smoothing_factor", "num_train_epochs"}


def check_values(values: Mapping[str, Any], required: set[str] | frozenset[str] = frozenset()) -> None:
    """Check each option of `values` that has a range (`VALUE_CHECKS`): those that are set, and those of `required`
    even when None. Raises a `UsageError` naming the option."""
    for name, check in VALUE_CHECKS.items():
        if name in values and (values[name] is not None or name in required):
            check(f"--{name}", values[name])


def check_report_to(report_to: str) -> None:
    """--report_to names trackers that accelerate knows and that are installed (or 'all' / 'none')."""
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    known = [kind.value for kind in LoggerType if kind.value != "all"]
    available = [str(getattr(kind, "value", kind)) for kind in get_available_trackers()]
    names = [name.strip() for name in str(report_to).split(",") if name.strip()]
    if not names:
        raise UsageError("--report_to is empty: name trackers, or 'none'.")
    for name in names:
        if name in ("all", "none"):
            if len(names) > 1:
                raise UsageError(f"--report_to {name!r} cannot be combined with other trackers ({report_to!r}).")
            continue
        if name not in known:
            raise UsageError(f"Unknown --report_to tracker {name!r}: expected 'none', 'all' or {one_of(known)}.")
        if name not in available:
            raise UsageError(
                f"--report_to {name!r}: the {name} package is not installed (installed trackers: "
                f"{', '.join(available) or 'none'})."
            )


def check_output_dir(output_dir: str) -> None:
    """The output folder is a folder (or does not exist yet) that this user can write in: found now, not after
    training when the model is saved."""
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"--output_dir {str(output_dir)!r} is a file; expected a folder (created if missing).")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--output_dir {str(output_dir)!r} cannot be created: {str(existing)!r} is a file.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            f"--output_dir {str(output_dir)!r} cannot be written: no write permission on {str(existing)!r}."
        )


def family_arguments(family: str, **values) -> TrainingArguments:
    """`TrainingArguments` of `family` with `values`; the options left out take the family's defaults.

    Example:
        `family_arguments("vit", output_dir="outputs/vit", max_steps=100)`.

    Args:
        family: a family id ("vit", "vit-mpp", "seq2seq", "sparse-lm", "image-lm").
        **values: options, in the Python spelling of the command line; the pre-0.3 names are accepted.

    Returns:
        The options.

    Raises:
        UsageError: an unknown family, or an option given under its new and its old name.
    """
    if family not in FAMILIES:
        raise UsageError(f"Unknown family {family!r}; expected one of {FAMILIES}.")
    for old, new in RENAMED.items():
        if old in values:
            if new in values:
                raise UsageError(f"Give {new}= or its old name {old}=, not both.")
            values[new] = values.pop(old)
    return TrainingArguments(family=family, **values)


__all__ = [
    "FAMILIES",
    "OWN",
    "RENAMED",
    "TrainingArguments",
    "base_type",
    "check_values",
    "family_arguments",
    "flag_fields",
]
