"""The options of a training run, one dataclass for every family.

`TrainingArguments` serves the library loop from Python (`train(family_arguments("vit", ...))`) and the command
line (`hf-vit-plus train vit ...`) alike. Each field carries its help text and which families it applies to in its
metadata, as transformers' `HfArgumentParser` reads them: `add_training_arguments` adds one flag per field of the
family, so `train vit --help` lists no text-only flag. Which fields apply, the help that differs per family and the
defaults all come from the family's record (`hf_vit_plus.families`): the same flag means the same thing everywhere.

Names follow transformers' `TrainingArguments` and its example scripts (`--max_steps`, `--lr_scheduler_type`,
`--save_steps`, `--dataset_config_name`, ...). The pre-0.3 names (`RENAMED`) are still accepted: as hidden
flags on the command line and as keywords of `family_arguments`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli_utils import CommandParser, HelpFormatter, one_of, parse_bool
from ..data.images import labelled_image_datasets
from ..errors import UsageError, check_exists, check_model_location
from ..families import FAMILIES as FAMILY_RECORDS
from ..families import Family
from ..tokenization import MAX_VOCAB_SIZE

FAMILIES = tuple(FAMILY_RECORDS)
SCHEDULERS = ("auto", "cosine", "noam", "linear", "constant")
# what each schedule is, for the help of --lr_scheduler_type ('auto': the family's own)
SCHEDULER_DESCRIPTIONS = {
    "cosine": "linear warm-up then cosine decay",
    "noam": "the paper's warm-up then inverse square root ('noam')",
    "linear": "linear warm-up then linear decay",
    "constant": "linear warm-up then a constant rate",
}
MIXED_PRECISION = ("no", "fp16", "bf16")
# Training recipes of the image classifiers (`hf_vit_plus.training.recipes`): "none" (plain training, as before 0.3),
# "deit"
RECIPES = ("none", "deit")
AUTO_AUGMENTS = ("none", "randaugment", "trivialaugment")
TEXT_FAMILIES = tuple(name for name, family in FAMILY_RECORDS.items() if family.data == "text")
# Families that read user data (Hub, folders, files); the others train on a built-in data set (--dataset).
USER_DATA_FAMILIES = tuple(name for name, family in FAMILY_RECORDS.items() if family.user_data)
# Each family's defaults (`Family.training_defaults`).
FAMILY_DEFAULTS: dict[str, dict] = {name: dict(family.training_defaults) for name, family in FAMILY_RECORDS.items()}

# The pre-0.3 names -> today's (transformers' names for the same options).
RENAMED = {
    "max_train_steps": "max_steps",
    "lr_scheduler": "lr_scheduler_type",
    "checkpointing_steps": "save_steps",
    "checkpoints_total_limit": "save_total_limit",
    "hub_private": "hub_private_repo",
    "dataset_config": "dataset_config_name",
    "image_column": "image_column_name",
    "label_column": "label_column_name",
    "label_smoothing": "label_smoothing_factor",
}


# Which families a flag is on: a predicate of the family's record, or OWN: the families that name the flag in their
# `Family.flags` (options of one kind of data, e.g. --block_size of the language model).
OWN = "own"


def every(family: Family) -> bool:
    return True


def reads_text(family: Family) -> bool:
    return family.data == "text"


def reads_user_data(family: Family) -> bool:
    return family.user_data


def reads_text_files(family: Family) -> bool:
    return family.data == "text" and family.user_data


def reads_image_folders(family: Family) -> bool:
    return family.data == "images" and family.user_data


def has_builtin_datasets(family: Family) -> bool:
    return bool(family.datasets)


def _option(default: Any, help: str | Callable[[Family], str], families: Callable[[Family], bool] | str = every,
            choices=None, nargs=None):  # fmt: skip
    """A field that is also a command-line flag of `families`. `help` may be computed from the family's record (see
    `help_text`)."""
    metadata = {"help": help, "families": families, "choices": choices}
    if nargs is not None:  # a list of values
        metadata["nargs"] = nargs
    return field(default=default, metadata=metadata)


def applies(flag: dataclasses.Field, family: Family) -> bool:
    """Whether the flag of field `flag` is on `family`'s command line."""
    families = flag.metadata["families"]
    return flag.name in family.flags if families == OWN else families(family)


def help_text(flag: dataclasses.Field, family: Family) -> str:
    """The help of the flag of field `flag` on `family`'s command line: the family's `flag_help`, else the field's
    (computed from the record when it is a function, which then reads `flag_help` itself)."""
    text = flag.metadata["help"]
    return family.flag_help.get(flag.name, text) if isinstance(text, str) else text(family)


def _builtin_data_help(family: Family) -> str:
    builtin = ", ".join(f"{f.id}: {f.builtin_data}" for f in FAMILY_RECORDS.values() if f.user_data)
    text = f"data set on the Hub (or a local folder `load_dataset` reads); default: the built-in data ({builtin})"
    if family.data == "images":
        names = one_of(repr(d.name) for d in labelled_image_datasets().values())
        text += f"; {names} read the built-in labelled images (evaluated on their whole test split)"
    return text


def _datasets_help(family: Family) -> str:
    choices = one_of(f"{d.name!r} ({d.description})" for d in family.datasets.values())
    return f"built-in images: {choices}; evaluated on the test split"


def _epochs_help(family: Family) -> str:
    text = family.flag_help.get("num_train_epochs", "passes over the training data (unless --max_steps is given)")
    if family.datasets and family.training_defaults.get("num_train_epochs") is None:
        text += "; default: " + ", ".join(f"{d.default_epochs:g} for {d.name}" for d in family.datasets.values())
    return text


def _scheduler_help(family: Family) -> str:
    return f"learning-rate schedule; 'auto': {SCHEDULER_DESCRIPTIONS[family.lr_scheduler]}"


@dataclass
class TrainingArguments:
    """The options of a training run, for every family: one field per `hf-vit-plus train FAMILY` flag.

    Each field but `family` carries its help text in its metadata, as transformers' `HfArgumentParser` reads it:
    `hf-vit-plus train FAMILY --help` and the command-line reference list them. Build one with `family_arguments`
    (which applies the family's defaults) or `parse_args`.

    Args:
        family: the family the run trains (a key of `hf_vit_plus.families.FAMILIES`): which fields apply, and the
            defaults that depend on its built-in data set and recipe.
    """

    family: str = "vit"
    output_dir: str = _option("outputs/run", "where the final model, card, figures, logs and checkpoints/ go")
    overwrite_output_dir: bool = _option(
        False, "take OUTPUT_DIR over from a run that holds it (its lock: another live run, or one on another host)"
    )
    # --- model
    model_name_or_path: str | None = _option(
        None, "fine-tune a saved model (folder or Hub id) instead of training a fresh one"
    )
    config_name: str | None = _option(None, "config folder or Hub id of a fresh model")
    config_overrides: str | None = _option(
        None, "comma-separated config fields of the model, e.g. 'num_hidden_layers=2,hidden_size=64'"
    )
    tokenizer_name: str | None = _option(None, "saved tokenizer (folder or Hub id)", reads_text)
    ignore_mismatched_sizes: bool = _option(
        False, "replace a pretrained classification head of another size (another number of labels)", OWN
    )
    # --- data
    dataset_name: str | None = _option(None, _builtin_data_help, reads_user_data)
    dataset_config_name: str | None = _option(None, "configuration of --dataset_name", reads_user_data)
    dataset: str | None = _option(None, _datasets_help, has_builtin_datasets)
    train_dir: str | None = _option(None, "image folder (one sub-folder per class) to train on", reads_image_folders)
    validation_dir: str | None = _option(
        None, "image folder to evaluate on (default: a split of --train_dir)", reads_image_folders
    )
    train_file: str | None = _option(None, "text/csv/tsv/json(l) file to train on", reads_text_files)
    validation_file: str | None = _option(
        None, "text/csv/tsv/json(l) file to evaluate on (default: a split of --train_file)", reads_text_files
    )
    image_column_name: str | None = _option(
        None, "column of the images (default: the first of image, img, picture)", OWN
    )
    label_column_name: str | None = _option(
        None, "column of the class labels (default: the first of label, labels, fine_label)", OWN
    )
    source_column: str | None = _option(
        None, "column of the source texts (default: the first of source, src, input)", OWN
    )
    target_column: str | None = _option(
        None, "column of the target texts (default: the first of target, tgt, output)", OWN
    )
    text_column: str | None = _option(None, "column of the texts (default: the first of text, content)", OWN)
    validation_split_percentage: float = _option(
        10.0, "percentage of the training data held out when the data has no validation split", reads_user_data
    )
    max_train_samples: int | None = _option(None, "train on the first N examples only (quick runs)")
    max_eval_samples: int | None = _option(None, "evaluate on the first N examples only")
    max_source_length: int = _option(64, "source tokens kept per example (longer ones are cut)", OWN)
    max_target_length: int = _option(64, "target tokens kept per example (longer ones are cut)", OWN)
    source_lang: str | None = _option(None, "language code of the sources (e.g. en), for the model card", OWN)
    target_lang: str | None = _option(None, "language code of the targets (e.g. de), for the model card", OWN)
    block_size: int = _option(128, "tokens per training sequence: the text is cut into blocks", OWN)
    vocab_size: int = _option(1000, "size of the BPE vocabulary trained on the data", OWN)
    dataloader_num_workers: int = _option(0, "worker processes per data loader (0: the main process loads)")
    # --- optimisation
    per_device_train_batch_size: int = _option(32, "training examples per process and micro-batch")
    per_device_eval_batch_size: int = _option(64, "evaluation examples per process and batch")
    gradient_accumulation_steps: int = _option(
        1, "micro-batches per optimiser update (global batch: per-device batch x processes x this)"
    )
    learning_rate: float = _option(1e-3, "peak learning rate")
    weight_decay: float = _option(0.05, "AdamW weight decay of the matrices (tensors of rank < 2 are not decayed)")
    adam_beta1: float = _option(0.9, "Adam's beta1")
    adam_beta2: float = _option(0.999, "Adam's beta2")
    adam_epsilon: float = _option(1e-8, "Adam's epsilon")
    max_grad_norm: float = _option(1.0, "clip the gradient norm to this value (0: no clipping)")
    divergence_factor: float = _option(
        3.0,
        "stop the run, saving nothing more, when the training loss becomes non-finite or its logged mean grows past "
        "this many times its best (and 1 nat above it); 0: never",
    )
    num_train_epochs: float | None = _option(3.0, _epochs_help)
    max_steps: int | None = _option(None, "optimiser updates in all; overrides --num_train_epochs")
    lr_scheduler_type: str = _option("auto", _scheduler_help, choices=SCHEDULERS)
    warmup_steps: int | None = _option(None, "updates of warm-up (overrides --warmup_ratio)")
    warmup_ratio: float = _option(0.1, "share of the updates spent warming up")
    label_smoothing_factor: float | None = _option(
        0.0, "label smoothing of the training loss (set in the model's config)", OWN
    )
    # --- the data-efficient recipe of the image classifiers (DeiT, Touvron et al. 2021; `training/recipes.py`).
    # None: the --recipe's value ('none': off), set from the data when the run starts.
    recipe: str = _option(
        "none",
        "training recipe: 'none' (plain training, no augmentation) or 'deit' (DeiT's data-efficient recipe scaled "
        "to the data: augmentation, Mixup/CutMix, label smoothing, stochastic depth, weight EMA; each flag below "
        "that is not given takes the recipe's value)",
        OWN,
        choices=RECIPES,
    )
    auto_augment: str | None = _option(
        None,
        "automatic augmentation of each training image (torchvision.transforms.v2): 'randaugment', 'trivialaugment' "
        "or 'none' (default: the recipe's)",
        OWN,
        choices=AUTO_AUGMENTS,
    )
    auto_augment_magnitude: int | None = _option(
        None, "RandAugment's magnitude, torchvision's scale 0-30 (default: the recipe's)", OWN
    )
    auto_augment_prob: float | None = _option(
        None, "share of the training images that get the automatic augmentation (default: the recipe's)", OWN
    )
    random_resized_crop_scale: float | None = _option(
        None, "random resized crop: the smallest share of the image area kept (1: no crop; default: the recipe's)", OWN
    )
    horizontal_flip: bool | None = _option(
        None, "flip training images left-right half of the time (default: the recipe's, where it fits the data)", OWN
    )
    random_erasing_prob: float | None = _option(
        None, "probability of erasing a random rectangle of a training image (default: the recipe's)", OWN
    )
    mixup_alpha: float | None = _option(
        None, "Mixup's Beta(alpha, alpha) (0: off; default: the recipe's); the loss takes the soft targets", OWN
    )
    cutmix_alpha: float | None = _option(
        None, "CutMix's Beta(alpha, alpha) (0: off; default: the recipe's); with Mixup, one of the two per batch", OWN
    )
    mixup_prob: float | None = _option(
        None, "probability that a training batch is mixed (Mixup or CutMix; default: the recipe's)", OWN
    )
    ema_decay: float | None = _option(
        None,
        "keep an exponential moving average of the weights with this decay, evaluated and saved as the model (0: "
        "none; default: the recipe's)",
        OWN,
    )
    teacher: str | None = _option(
        None,
        "DeiT's hard-label distillation from this teacher: a folder or Hub id that AutoModelForImageClassification "
        "opens (a timm model through TimmWrapper too); the ViT gets a distillation token",
        OWN,
    )
    model_type: str | None = _option(
        None,
        "train a fresh transformers model of this type instead of a ViTPlus, e.g. 'resnet' (a small CNN for the "
        "images: the inductive-bias baseline and a teacher) or 'vit' (transformers' ViTForImageClassification); "
        "sized for the data, --config_overrides on top",
        OWN,
    )
    mixed_precision: str | None = _option(
        None, "mixed precision; default: the accelerate config / launcher setting", choices=MIXED_PRECISION
    )
    activation_checkpointing: bool = _option(False, "recompute block activations in the backward pass (less memory)")
    torch_compile: bool = _option(
        False,
        "compile the model's forward and backward with torch.compile (inductor; on the CPU too, with a C++ compiler), "
        "as transformers' --torch_compile: the first updates wait for the compilation, the rest run faster",
    )
    use_cpu: bool = _option(False, "train on the CPU even when an accelerator is present")
    fsdp: bool = _option(
        False,
        "shard parameters, gradients and optimizer state over the processes with FSDP2 (torch's fully_shard through "
        "Accelerate's FSDP plugin; on CPU too); start the run with accelerate launch or torchrun",
    )
    fsdp_config: str | None = _option(None, lambda family: _fsdp_config_help())
    ddp_timeout: int = _option(
        1800,
        "seconds a process waits for the others in a collective operation (transformers' --ddp_timeout): a process "
        "that stops answering ends the run after this long, naming it",
    )
    seed: int = _option(42, "random seed of the initial weights and of the data order")
    # --- logging, evaluation, checkpoints
    logging_steps: int = _option(10, "log the mean training loss every N updates")
    eval_steps: int | None = _option(None, "evaluate every N updates (default: at the end of every epoch)")
    save_steps: str = _option("epoch", "save the training state every N updates, at every 'epoch', or 'none'")
    save_total_limit: int | None = _option(2, "training states kept in OUTPUT_DIR/checkpoints (the oldest go)")
    resume_from_checkpoint: str | None = _option(
        None, "training state to resume from: a checkpoint folder, or 'latest' (newest in OUTPUT_DIR/checkpoints)"
    )
    stop_after_steps: int | None = _option(
        None, "stop after this many updates and save the state, to resume later (time-limited jobs)"
    )
    max_train_minutes: float | None = _option(
        None,
        "a time budget: the run ends at its last update or after this many minutes of training, whichever comes "
        "first, and the learning-rate schedule follows the clock where the updates fall behind it (so a run cut "
        "short still anneals); the values set from the run's length (recipe, warm-up) stay those of its updates",
    )
    report_to: str = _option("tensorboard", "tracker(s) of accelerate's log_with: tensorboard, wandb, ..., all, none")
    project_name: str | None = _option(None, "project name given to the trackers (default: hf_vit_plus-FAMILY)")
    # --- LoRA (PEFT): train an adapter of --model_name_or_path instead of every weight (hf_vit_plus.training.lora)
    lora_r: int | None = _option(
        None, "train a LoRA adapter of this rank on --model_name_or_path (frozen); saves the adapter, not the model"
    )
    lora_alpha: float | None = _option(None, "LoRA scale numerator: updates are scaled by alpha / r (default: 2r)")
    lora_dropout: float = _option(0.0, "dropout on the LoRA branch's input")
    lora_target_modules: list[str] | None = _option(
        None, "linear layers to adapt, by name (default: q_proj k_proj v_proj o_proj; fc1 fc2 are the MLP's; or "
        "all-linear)", nargs="+",
    )  # fmt: skip
    # --- outputs
    push_to_hub: bool = _option(False, "push the model folder to the Hub at the end (needs --hub_model_id)")
    hub_model_id: str | None = _option(None, "Hub repository to push to, 'namespace/name'")
    license: str = _option(
        "apache-2.0", "the model card's licence: a Hub licence id (e.g. apache-2.0, mit, cc-by-4.0)"
    )
    hub_revision: str | None = _option(None, "branch to push to (created if missing; default: main)")
    hub_private_repo: bool = _option(False, "create the Hub repository private")
    write_card: bool = _option(True, "write README.md (the model card) and its figures next to the model")

    def _check_license(self) -> None:
        """--license is one of the Hub's licence ids (`hf_vit_plus.hub.card.HUB_LICENSES`), or a UsageError."""
        from ..hub.card import check_license

        try:
            check_license(self.license)
        except ValueError as error:
            raise UsageError(f"--license: {error}") from error

    def __post_init__(self) -> None:
        family = FAMILY_RECORDS.get(self.family)
        if family is not None and family.datasets:  # the defaults that depend on the built-in data set
            if self.dataset is None:
                self.dataset = family.training_defaults.get("dataset") or next(iter(family.datasets))
            if self.num_train_epochs is None and self.dataset in family.datasets:
                self.num_train_epochs = family.datasets[self.dataset].default_epochs
        if family is not None and "recipe" in family.flags and self.recipe in RECIPES:
            from .recipes import static_recipe_values

            # the recipe's values that need no data (the others are set when the run starts)
            for name, value in static_recipe_values(self.recipe, family.id).items():
                if getattr(self, name) is None:
                    setattr(self, name, value)
        self.validate()

    def validate(self) -> None:
        """Raise a `UsageError` (a `ValueError`) naming the offending option."""
        if self.family not in FAMILIES:
            raise UsageError(f"Unknown family {self.family!r}; expected one of {FAMILIES}.")
        family = FAMILY_RECORDS[self.family]
        self._validate_data_choice(family)
        for name, check in VALUE_CHECKS.items():
            value = getattr(self, name)
            left_to_recipe = name in RECIPE_SETS and "recipe" in family.flags and self.recipe != "none"
            if value is not None or (name in REQUIRED_VALUES and not left_to_recipe):
                check(f"--{name}", value)
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
        if self.num_train_epochs is None or isinstance(self.num_train_epochs, bool):
            raise UsageError(f"--num_train_epochs must be a number > 0, got {self.num_train_epochs!r}.")
        if self.max_steps is None:
            number("--num_train_epochs", self.num_train_epochs, low=0.0, low_open=True)
        steps = self.save_steps
        if steps not in ("epoch", "none") and not (str(steps).isdigit() and int(steps) > 0):
            raise UsageError(f"--save_steps must be 'epoch', 'none' or a positive integer, got {steps!r}.")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise UsageError(f"--save_total_limit must be >= 1, got {self.save_total_limit!r}.")
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

    def check_paths(self) -> None:
        """Raise a `UsageError` naming the option whose local data or model path does not exist, or an output folder
        that cannot be written (run before any work starts; `validate` only checks values)."""
        check_output_dir(self.output_dir)
        for name, kind in (("train_dir", "dir"), ("validation_dir", "dir"), ("train_file", "file"),
                           ("validation_file", "file")):  # fmt: skip
            if getattr(self, name):
                check_exists(getattr(self, name), f"--{name}", kind)
        for name in ("model_name_or_path", "tokenizer_name"):
            if getattr(self, name):
                check_model_location(getattr(self, name), f"--{name}")

    @property
    def fsdp_options(self) -> dict:
        """--fsdp_config as a dict (`read_fsdp_config`); empty without it."""
        return read_fsdp_config(self.fsdp_config) if self.fsdp_config else {}

    @property
    def save_every(self) -> int | None:
        """Updates between two saved training states; None when they are saved per epoch or not at all."""
        return int(self.save_steps) if str(self.save_steps).isdigit() else None

    def to_dict(self) -> dict:
        """The options as a plain dict (`dataclasses.asdict`), e.g. for a tracker's config or a model card.

        Returns:
            Field name -> value.
        """
        return dataclasses.asdict(self)


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
            "ddp_timeout",
        ),
        _positive,
    ),  # fmt: skip
    **dict.fromkeys(("dataloader_num_workers", "warmup_steps"), _non_negative),
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
    "divergence_factor", "ddp_timeout",
    "validation_split_percentage", "label_smoothing_factor",
}  # fmt: skip
# Required values that a family with recipes (`--recipe`) may leave unset: the recipe sets them when the run starts.
RECIPE_SETS = {"learning_rate", "warmup_ratio", "label_smoothing_factor"}


# --fsdp_config: transformers' keys (`TrainingArguments.fsdp_config`, an `fsdp_` prefix allowed), what each means, and
# its check (returning the value to use). Units, activation checkpointing and mixed precision: `training/sharding.py`.
def _boolean(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise UsageError(f"--fsdp_config {key} must be true or false, got {value!r}.")


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def check(key: str, value) -> str:
        if not isinstance(value, str) or value.upper() not in choices:
            raise UsageError(f"--fsdp_config {key} must be {one_of(choices)}, got {value!r}.")
        return value.upper()

    return check


def _class_names(key: str, value) -> list[str]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise UsageError(f"--fsdp_config {key} must be a class name or a list of them, got {value!r}.")
    return [n.strip() for n in names]


def _version(key: str, value) -> int:
    if isinstance(value, bool) or value not in (1, 2, "1", "2"):
        raise UsageError(f"--fsdp_config {key} must be 2 (FSDP2), got {value!r}.")
    return int(value)


PRECISIONS = ("bf16", "fp16", "fp32")
POLICY_FIELDS = ("param_dtype", "reduce_dtype", "output_dtype")


def _precision_policy(key: str, value):
    if isinstance(value, str) and value in PRECISIONS:
        return value
    if isinstance(value, dict) and value and all(k in POLICY_FIELDS and v in PRECISIONS for k, v in value.items()):
        return dict(value)
    raise UsageError(
        f"--fsdp_config {key} must be one of {PRECISIONS} or an object of {', '.join(POLICY_FIELDS)} -> one of "
        f'them (e.g. {{"param_dtype": "bf16", "reduce_dtype": "fp32"}}), got {value!r}.'
    )


FSDP_CONFIG_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "version": ("2 (FSDP2, the default; 1 is refused)", _version),
    "reshard_after_forward": ("free gathered parameters after each unit's forward, default true", _boolean),
    "activation_checkpointing": ("as --activation_checkpointing", _boolean),
    "cpu_offload": ("keep parameters on the CPU between uses (GPU runs)", _boolean),
    "cpu_ram_efficient_loading": (
        "only the main process reads --model_name_or_path's weights, the others receive them, default false",
        _boolean,
    ),
    "state_dict_type": (
        "training checkpoints SHARDED_STATE_DICT (default) or FULL_STATE_DICT",
        _choice("SHARDED_STATE_DICT", "FULL_STATE_DICT"),
    ),
    "auto_wrap_policy": (
        "TRANSFORMER_BASED_WRAP (the model's layers, default) or NO_WRAP",
        _choice("TRANSFORMER_BASED_WRAP", "NO_WRAP"),
    ),
    "transformer_layer_cls_to_wrap": ("layer classes to wrap (default: the model's _no_split_modules)", _class_names),
    "mixed_precision_policy": (
        "bf16, or {param_dtype, reduce_dtype, output_dtype: bf16|fp16|fp32}",
        _precision_policy,
    ),
}


def _fsdp_config_help() -> str:
    keys = "; ".join(f"{key}: {what}" for key, (what, _) in FSDP_CONFIG_KEYS.items())
    return f"FSDP settings with --fsdp: a JSON file or object with transformers' fsdp_config keys ({keys})"


def read_fsdp_config(value: str) -> dict:
    """--fsdp_config (a JSON file, or a JSON object on the command line) as a dict of `FSDP_CONFIG_KEYS` without
    their `fsdp_` prefix, each value checked; a `UsageError` names an unknown key (with the closest) or a bad value."""
    import difflib
    import json

    text = str(value).strip()
    if not text.startswith(("{", "[")):
        path = check_exists(text, "--fsdp_config", "file")
        text = path.read_text()
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--fsdp_config {str(value)!r} is not valid JSON: {error}.") from None
    if not isinstance(config, dict):
        raise UsageError(f"--fsdp_config must be a JSON object, got {type(config).__name__}.")
    options = {}
    for key, item in config.items():
        name = key.removeprefix("fsdp_")
        if name not in FSDP_CONFIG_KEYS:
            close = difflib.get_close_matches(name, FSDP_CONFIG_KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(
                f"--fsdp_config has an unknown key {key!r}: {hint}expected {one_of(list(FSDP_CONFIG_KEYS))}."
            )
        options[name] = FSDP_CONFIG_KEYS[name][1](key, item)
    return options


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


def add_training_arguments(parser: argparse.ArgumentParser, family: str) -> argparse.ArgumentParser:
    """Add one flag per field of `TrainingArguments` that applies to `family`, with the family's defaults and help;
    the pre-0.3 names (`RENAMED`) are added as hidden flags with the same destination."""
    if family not in FAMILIES:
        raise ValueError(f"Unknown family {family!r}; expected one of {FAMILIES}.")
    record = FAMILY_RECORDS[family]
    old_names = {new: old for old, new in RENAMED.items()}
    for f in flag_fields(family):
        default = record.training_defaults.get(f.name, f.default)
        kwargs: dict[str, Any] = dict(default=default, help=help_text(f, record))
        if _base_type(f.type) is bool:
            if default or default is None:  # `--write_card false` switches it off; None: the recipe decides
                kwargs.update(type=parse_bool, nargs="?", const=True, metavar="{true,false}")
            else:
                kwargs.update(action="store_true")
        else:
            kwargs.update(type=_base_type(f.type), choices=f.metadata["choices"])
            if "nargs" in f.metadata:
                kwargs.update(nargs=f.metadata["nargs"])
        parser.add_argument(f"--{f.name}", **kwargs)
        if f.name in old_names:
            hidden = dict(kwargs, help=argparse.SUPPRESS, default=argparse.SUPPRESS)
            parser.add_argument(f"--{old_names[f.name]}", dest=f.name, **hidden)
    parser.set_defaults(family=family)
    return parser


def args_from_namespace(namespace: argparse.Namespace) -> TrainingArguments:
    """`TrainingArguments` of a namespace parsed by `add_training_arguments` (fields without a flag keep their
    defaults)."""
    values = {f.name: getattr(namespace, f.name) for f in flag_fields() if hasattr(namespace, f.name)}
    return TrainingArguments(family=namespace.family, **values)


def parse_args(family: str, argv: list[str] | None = None) -> TrainingArguments:
    """Parse the command line of `hf-vit-plus train FAMILY`.

    A bad value exits with argparse's error (status 2).

    Args:
        family: the family whose flags are parsed.
        argv: the arguments; None: `sys.argv[1:]`.

    Returns:
        The parsed options.
    """
    parser = CommandParser(description=f"Train the {family} family with Accelerate.", formatter_class=HelpFormatter)
    add_training_arguments(parser, family)
    namespace = parser.parse_args(argv)
    try:
        return args_from_namespace(namespace)
    except UsageError as error:
        parser.error(str(error))


def family_arguments(family: str, **values) -> TrainingArguments:
    """`TrainingArguments` with the family's defaults and `values`.

    Example:
        `family_arguments("vit", output_dir="outputs/vit", max_steps=100)`.

    Args:
        family: a family id ("vit", "vit-mpp", "seq2seq", "sparse-lm", "image-lm").
        **values: fields, in the Python spelling of the command line; the pre-0.3 names are accepted.

    Returns:
        The options.

    Raises:
        UsageError: an unknown family, or a field given under its new and its old name.
    """
    if family not in FAMILY_DEFAULTS:
        raise UsageError(f"Unknown family {family!r}; expected one of {FAMILIES}.")
    for old, new in RENAMED.items():
        if old in values:
            if new in values:
                raise UsageError(f"Give {new}= or its old name {old}=, not both.")
            values[new] = values.pop(old)
    return TrainingArguments(family=family, **{**FAMILY_DEFAULTS[family], **values})


def flag_fields(family: str | None = None) -> list[dataclasses.Field]:
    """The fields of `TrainingArguments` that are command-line flags (of `family`, when given)."""
    return [
        f
        for f in dataclasses.fields(TrainingArguments)
        if "help" in f.metadata and (family is None or applies(f, FAMILY_RECORDS[family]))
    ]


def _base_type(annotation) -> type:
    text = str(annotation)
    for name, kind in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if text.startswith(name):
            return kind
    return str
