"""The options of a training run, in groups by concern: one small frozen dataclass per group, one field per
`hf-vit-plus train FAMILY` flag, as transformers' `HfArgumentParser` reads dataclasses (the help in each field's
metadata, the group's title in `_argument_group_name`, shown as a section of `--help`).

Names follow transformers' `TrainingArguments` and its example scripts (`--max_steps`, `--lr_scheduler_type`,
`--save_steps`, `--dataset_config_name`, ...). Each field also says which families have its flag (`families`: a
predicate of the family's record, or `OWN`: the families that list it in `Family.flags`) and its own default
(`default`, in the metadata: every field's dataclass default is `UNSET`, so that `TrainingArguments` knows which
options were given). A default lives in one place: here for every family, in the family's record
(`Family.training_defaults`) for one family, in the recipe (`recipes.py`) for what `--recipe` decides; None here
means that the record, the recipe or the data decides it when the run is planned (`plan.py`).

`TrainingArguments` (`args.py`) is the union of the groups. The FSDP schema (--fsdp_config's keys) is next to the
sharding it tunes (`fsdp_config.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..cli_utils import one_of
from ..families import FAMILIES as FAMILY_RECORDS
from ..families import Family
from .fsdp_config import fsdp_config_help, read_fsdp_config
from .recipes import recipe_flag_help


class _Unset:
    """The dataclass default of every option: the option was not given (`TrainingArguments` then takes the family's
    default or the option's own)."""

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self):
        return "UNSET"


UNSET: Any = _Unset()

# Who chose a value the user did not give, when it is the option's own default: never listed in a run's first lines
# (the help and --print_config say it).
THE_DEFAULT = "the default"

# what --lr_scheduler_type names (each a schedule of transformers: `SCHEDULE_FUNCTIONS`); 'auto': the family's own
SCHEDULERS = ("auto", "cosine", "noam", "linear", "constant")
SCHEDULER_DESCRIPTIONS = {
    "cosine": "linear warm-up then cosine decay",
    "noam": "the paper's schedule, transformers' inverse_sqrt: linear warm-up then inverse square root decay",
    "linear": "linear warm-up then linear decay",
    "constant": "linear warm-up then a constant rate",
}
# transformers' `SchedulerType` of each choice (`transformers.get_scheduler` builds it)
SCHEDULE_FUNCTIONS = {
    "cosine": "cosine",
    "noam": "inverse_sqrt",
    "linear": "linear",
    "constant": "constant_with_warmup",
}
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
MIXED_PRECISION = ("no", "fp16", "bf16")
RECIPES = ("none", "deit")
AUTO_AUGMENTS = ("none", "randaugment", "trivialaugment")


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


def option(
    default: Any,
    help: str | Callable[[Family], str],
    families: Callable[[Family], bool] | str = every,
    choices: tuple | None = None,
    nargs: str | None = None,
):
    """A field that is also a command-line flag of `families`, with its own `default` (see the module's docstring).
    `help` may be computed from the family's record (`help_text`)."""
    metadata = {"help": help, "families": families, "choices": choices, "default": default}
    if nargs is not None:  # a list of values
        metadata["nargs"] = nargs
    return field(default=UNSET, metadata=metadata)


def _builtin_data_help(family: Family) -> str:
    from ..data.images import labelled_image_datasets

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


# ------------------------------------------------------------------------------------------------------ the groups
@dataclass(frozen=True)
class ModelArguments:
    """The model trained: a fresh one of the family's config (or a preset), or a saved one fine-tuned."""

    _argument_group_name: ClassVar[str] = "model"
    model_name_or_path: str | None = option(
        None, "fine-tune a saved model (folder or Hub id) instead of training a fresh one"
    )
    config_name: str | None = option(None, "config folder or Hub id of a fresh model")
    config_overrides: str | None = option(
        None, "comma-separated config fields of the model, e.g. 'num_hidden_layers=2,hidden_size=64'"
    )
    tokenizer_name: str | None = option(None, "saved tokenizer (folder or Hub id)", reads_text)
    ignore_mismatched_sizes: bool = option(
        False, "replace a pretrained classification head of another size (another number of labels)", OWN
    )
    model_type: str | None = option(
        None,
        "train a fresh transformers model of this type instead of a ViTPlus, e.g. 'resnet' (a small CNN for the "
        "images: the inductive-bias baseline and a teacher) or 'vit' (transformers' ViTForImageClassification); "
        "sized for the data, --config_overrides on top",
        OWN,
    )


@dataclass(frozen=True)
class DataArguments:
    """The data: built-in, on the Hub or local files, its columns, and how much of it is read."""

    _argument_group_name: ClassVar[str] = "data"
    dataset_name: str | None = option(None, _builtin_data_help, reads_user_data)
    dataset_config_name: str | None = option(None, "configuration of --dataset_name", reads_user_data)
    dataset: str | None = option(None, _datasets_help, has_builtin_datasets)
    train_dir: str | None = option(None, "image folder (one sub-folder per class) to train on", reads_image_folders)
    validation_dir: str | None = option(
        None, "image folder to evaluate on (default: a split of --train_dir)", reads_image_folders
    )
    train_file: str | None = option(None, "text/csv/tsv/json(l) file to train on", reads_text_files)
    validation_file: str | None = option(
        None, "text/csv/tsv/json(l) file to evaluate on (default: a split of --train_file)", reads_text_files
    )
    image_column_name: str | None = option(
        None, "column of the images (default: the first of image, img, picture)", OWN
    )
    label_column_name: str | None = option(
        None, "column of the class labels (default: the first of label, labels, fine_label)", OWN
    )
    source_column: str | None = option(
        None, "column of the source texts (default: the first of source, src, input)", OWN
    )
    target_column: str | None = option(
        None, "column of the target texts (default: the first of target, tgt, output)", OWN
    )
    text_column: str | None = option(None, "column of the texts (default: the first of text, content)", OWN)
    validation_split_percentage: float = option(
        10.0, "percentage of the training data held out when the data has no validation split", reads_user_data
    )
    max_train_samples: int | None = option(None, "train on the first N examples only (quick runs)")
    max_eval_samples: int | None = option(None, "evaluate on the first N examples only")
    max_source_length: int = option(64, "source tokens kept per example (longer ones are cut)", OWN)
    max_target_length: int = option(64, "target tokens kept per example (longer ones are cut)", OWN)
    source_lang: str | None = option(None, "language code of the sources (e.g. en), for the model card", OWN)
    target_lang: str | None = option(None, "language code of the targets (e.g. de), for the model card", OWN)
    block_size: int = option(128, "tokens per training sequence: the text is cut into blocks", OWN)
    vocab_size: int = option(1000, "size of the BPE vocabulary trained on the data", OWN)


@dataclass(frozen=True)
class LoaderArguments:
    """How the training data is read and batched: whole or as a stream, in batches of examples or of tokens, by how
    many worker processes (`hf_vit_plus.data.pipeline`). None: the plan decides it from the run (`plan.DataPlan`)."""

    _argument_group_name: ClassVar[str] = "data loading"
    streaming: bool = option(
        False,
        "read the training data as a stream (`datasets` streaming) instead of loading it whole: Hub data sets, local "
        "parquet / arrow / jsonl / csv shards, WebDataset tars, image folders; each process reads its own part; needs "
        "--max_steps; evaluation on the validation split or file, else on the first --max_eval_samples examples, held "
        "out",
        reads_user_data,
    )
    shuffle_buffer_size: int = option(
        10_000,
        "with --streaming: examples (undecoded) in the seeded shuffle buffer of each process and worker (0: the "
        "stream's own order)",
        reads_user_data,
    )
    max_tokens_per_batch: int | None = option(
        None,
        "batches by a token budget per process instead of a number of examples (fairseq's --max-tokens)",
        OWN,
    )
    dataloader_num_workers: int = option(0, "worker processes per data loader (0: the main process loads)")
    dataloader_pin_memory: bool | None = option(
        None, "copy batches to page-locked memory for faster transfers (default: on an accelerator)"
    )
    dataloader_persistent_workers: bool | None = option(
        None, "keep the worker processes between epochs (default: when there are workers)"
    )
    dataloader_prefetch_factor: int | None = option(
        None, "batches each worker prepares ahead (default: torch's, when there are workers)"
    )


@dataclass(frozen=True)
class OptimizationArguments:
    """The optimiser, the learning-rate schedule, the batches and the length of the run."""

    _argument_group_name: ClassVar[str] = "optimization and schedule"
    per_device_train_batch_size: int = option(32, "training examples per process and micro-batch")
    per_device_eval_batch_size: int = option(64, "evaluation examples per process and batch")
    gradient_accumulation_steps: int = option(
        1, "micro-batches per optimiser update (global batch: per-device batch x processes x this)"
    )
    learning_rate: float | None = option(None, "peak learning rate: the schedule rises to it, then decays")
    weight_decay: float = option(0.05, "AdamW weight decay of the matrices (tensors of rank < 2 are not decayed)")
    adam_beta1: float = option(0.9, "Adam's beta1")
    adam_beta2: float = option(0.999, "Adam's beta2")
    adam_epsilon: float = option(1e-8, "Adam's epsilon")
    max_grad_norm: float = option(1.0, "clip the gradient norm to this value (0: no clipping)")
    num_train_epochs: float | None = option(None, _epochs_help)
    max_steps: int | None = option(None, "optimiser updates in all; overrides --num_train_epochs")
    max_train_minutes: float | None = option(
        None,
        "a time budget: the run ends at its last update or after this many minutes of training, whichever comes "
        "first, and the learning-rate schedule follows the clock where the updates fall behind it (so a run cut "
        "short still anneals); the values set from the run's length (recipe, warm-up) stay those of its updates",
    )
    lr_scheduler_type: str = option("auto", _scheduler_help, choices=SCHEDULERS)
    warmup_steps: int | None = option(None, "updates of warm-up (overrides --warmup_ratio)")
    warmup_ratio: float | None = option(None, "share of the updates spent warming up")
    label_smoothing_factor: float | None = option(
        None, "label smoothing of the training loss (set in the model's config)", OWN
    )
    seed: int = option(42, "random seed of the initial weights and of the data order")
    divergence_factor: float = option(
        3.0,
        "stop the run, saving nothing more, when the training loss becomes non-finite or its logged mean grows past "
        "this many times its best (and 1 nat above it); 0: never",
    )


@dataclass(frozen=True)
class RecipeArguments:
    """The data-efficient recipe of the image classifiers (DeiT, Touvron et al. 2021; `training/recipes.py`). None:
    the --recipe's value ('none': off), set from the data when the run is planned."""

    _argument_group_name: ClassVar[str] = "the recipe"
    recipe: str = option(
        "none",
        "training recipe: 'none' (plain training, no augmentation) or 'deit' (DeiT's data-efficient recipe scaled "
        "to the data: augmentation, Mixup/CutMix, label smoothing, stochastic depth, weight EMA; each flag of the "
        "recipe that is not given takes the recipe's value)",
        OWN,
        choices=RECIPES,
    )
    auto_augment: str | None = option(
        None,
        "automatic augmentation of each training image (torchvision.transforms.v2): 'randaugment', 'trivialaugment' "
        "or 'none' (default: the recipe's)",
        OWN,
        choices=AUTO_AUGMENTS,
    )
    auto_augment_magnitude: int | None = option(
        None, "RandAugment's magnitude, torchvision's scale 0-30 (default: the recipe's)", OWN
    )
    auto_augment_prob: float | None = option(
        None, "share of the training images that get the automatic augmentation (default: the recipe's)", OWN
    )
    random_resized_crop_scale: float | None = option(
        None, "random resized crop: the smallest share of the image area kept (1: no crop; default: the recipe's)", OWN
    )
    horizontal_flip: bool | None = option(
        None, "flip training images left-right half of the time (default: the recipe's, where it fits the data)", OWN
    )
    random_erasing_prob: float | None = option(
        None, "probability of erasing a random rectangle of a training image (default: the recipe's)", OWN
    )
    mixup_alpha: float | None = option(
        None, "Mixup's Beta(alpha, alpha) (0: off; default: the recipe's); the loss takes the soft targets", OWN
    )
    cutmix_alpha: float | None = option(
        None, "CutMix's Beta(alpha, alpha) (0: off; default: the recipe's); with Mixup, one of the two per batch", OWN
    )
    mixup_prob: float | None = option(
        None, "probability that a training batch is mixed (Mixup or CutMix; default: the recipe's)", OWN
    )
    ema_decay: float | None = option(
        None,
        "keep an exponential moving average of the weights with this decay, evaluated and saved as the model (0: "
        "none; default: the recipe's)",
        OWN,
    )
    teacher: str | None = option(
        None,
        "DeiT's hard-label distillation from this teacher: a folder or Hub id that AutoModelForImageClassification "
        "opens (a timm model through TimmWrapper too); the ViT gets a distillation token",
        OWN,
    )


@dataclass(frozen=True)
class ParallelismArguments:
    """Precision, devices and sharding (the Accelerator is built from them)."""

    _argument_group_name: ClassVar[str] = "precision and parallelism"
    mixed_precision: str | None = option(
        None, "mixed precision; default: the accelerate config / launcher setting", choices=MIXED_PRECISION
    )
    activation_checkpointing: bool = option(False, "recompute block activations in the backward pass (less memory)")
    torch_compile: bool = option(
        False,
        "compile the model's forward and backward with torch.compile (inductor; on the CPU too, with a C++ compiler), "
        "as transformers' --torch_compile: the first updates wait for the compilation, the rest run faster",
    )
    use_cpu: bool = option(False, "train on the CPU even when an accelerator is present")
    fsdp: bool = option(
        False,
        "shard parameters, gradients and optimizer state over the processes with FSDP2 (torch's fully_shard through "
        "Accelerate's FSDP plugin; on CPU too); start the run with accelerate launch or torchrun",
    )
    fsdp_config: str | None = option(None, lambda family: fsdp_config_help())
    ddp_timeout: int = option(
        1800,
        "seconds a process waits for the others in a collective operation (transformers' --ddp_timeout): a process "
        "that stops answering ends the run after this long, naming it",
    )

    @property
    def fsdp_options(self) -> dict:
        """--fsdp_config as a dict (`read_fsdp_config`); empty without it."""
        return read_fsdp_config(self.fsdp_config) if self.fsdp_config else {}


@dataclass(frozen=True)
class CheckpointArguments:
    """Where the run writes, its training states, and resuming from one."""

    _argument_group_name: ClassVar[str] = "output folder, checkpoints and resume"
    output_dir: str = option("outputs/run", "where the final model, card, figures, logs and checkpoints/ go")
    overwrite_output_dir: bool = option(
        False, "take OUTPUT_DIR over from a run that holds it (its lock: another live run, or one on another host)"
    )
    save_steps: str = option("epoch", "save the training state every N updates, at every 'epoch', or 'none'")
    save_total_limit: int | None = option(2, "training states kept in OUTPUT_DIR/checkpoints (the oldest go)")
    resume_from_checkpoint: str | None = option(
        None, "training state to resume from: a checkpoint folder, or 'latest' (newest in OUTPUT_DIR/checkpoints)"
    )
    stop_after_steps: int | None = option(
        None, "stop after this many updates and save the state, to resume later (time-limited jobs)"
    )

    @property
    def save_every(self) -> int | None:
        """Updates between two saved training states; None when they are saved per epoch or not at all."""
        return int(self.save_steps) if str(self.save_steps).isdigit() else None


@dataclass(frozen=True)
class LoggingArguments:
    """The training log, the evaluations and the trackers."""

    _argument_group_name: ClassVar[str] = "logging, evaluation and tracking"
    logging_steps: int = option(10, "log the mean training loss every N updates")
    eval_steps: int | None = option(None, "evaluate every N updates (default: at the end of every epoch)")
    report_to: str = option("tensorboard", "tracker(s) of accelerate's log_with: tensorboard, wandb, ..., all, none")
    project_name: str | None = option(None, "project name given to the trackers (default: hf_vit_plus-FAMILY)")


@dataclass(frozen=True)
class LoraArguments:
    """LoRA (PEFT): train an adapter of --model_name_or_path instead of every weight (`training/lora.py`)."""

    _argument_group_name: ClassVar[str] = "LoRA"
    lora_r: int | None = option(
        None, "train a LoRA adapter of this rank on --model_name_or_path (frozen); saves the adapter, not the model"
    )
    lora_alpha: float | None = option(None, "LoRA scale numerator: updates are scaled by alpha / r (default: 2r)")
    lora_dropout: float = option(0.0, "dropout on the LoRA branch's input")
    lora_target_modules: list[str] | None = option(
        None, "linear layers to adapt, by name (default: q_proj k_proj v_proj o_proj; fc1 fc2 are the MLP's; or "
        "all-linear)", nargs="+",
    )  # fmt: skip


@dataclass(frozen=True)
class HubArguments:
    """The model card and the push to the Hub at the end."""

    _argument_group_name: ClassVar[str] = "Hub and model card"
    push_to_hub: bool = option(False, "push the model folder to the Hub at the end (needs --hub_model_id)")
    hub_model_id: str | None = option(None, "Hub repository to push to, 'namespace/name'")
    hub_revision: str | None = option(None, "branch to push to (created if missing; default: main)")
    hub_private_repo: bool = option(False, "create the Hub repository private")
    license: str = option("apache-2.0", "the model card's licence: a Hub licence id (e.g. apache-2.0, mit, cc-by-4.0)")
    write_card: bool = option(True, "write README.md (the model card) and its figures next to the model")


# In the order `--help` lists them.
OPTION_GROUPS: tuple[type, ...] = (
    ModelArguments,
    DataArguments,
    LoaderArguments,
    OptimizationArguments,
    RecipeArguments,
    ParallelismArguments,
    CheckpointArguments,
    LoggingArguments,
    LoraArguments,
    HubArguments,
)


def group_fields(group: type) -> list[dataclasses.Field]:
    """The option fields of one group, in their order."""
    return [f for f in dataclasses.fields(group) if "help" in f.metadata]


def option_fields() -> list[dataclasses.Field]:
    """Every option field, group by group."""
    return [f for group in OPTION_GROUPS for f in group_fields(group)]


def flag_fields(family: str | None = None) -> list[dataclasses.Field]:
    """The option fields of `TrainingArguments` (those that are flags of `family`, when given).

    Args:
        family: a family id, or None for every option.

    Returns:
        The fields, group by group.
    """
    return [f for f in option_fields() if family is None or applies(f, FAMILY_RECORDS[family])]


def base_type(flag: dataclasses.Field) -> type:
    """The type of an option's values (`bool`, `int`, `float` or `str`; a list's items), from its annotation."""
    text = str(flag.type)
    for name, kind in (("bool", bool), ("int", int), ("float", float), ("str", str), ("list[str]", str)):
        if text.startswith(name):
            return kind
    return str


def applies(flag: dataclasses.Field, family: Family) -> bool:
    """Whether the flag of field `flag` is on `family`'s command line."""
    families = flag.metadata["families"]
    return flag.name in family.flags if families == OWN else families(family)


def default_choice(flag: dataclasses.Field, family: Family) -> tuple[Any, str]:
    """The default of an option for `family` and who chose it: the family's record's (`Family.training_defaults`;
    "the vit family"), else the option's own (`THE_DEFAULT`). `TrainingArguments` gives it to the options left out,
    and records it for the plan.

    Args:
        flag: the option's field.
        family: the family's record.

    Returns:
        (the value, who chose it).
    """
    if flag.name in family.training_defaults:
        return family.training_defaults[flag.name], f"the {family.id} family"
    return flag.metadata["default"], THE_DEFAULT


def option_default(flag: dataclasses.Field, family: Family | None = None) -> Any:
    """The default of an option for `family` (`default_choice`), or its own without a family."""
    return flag.metadata["default"] if family is None else default_choice(flag, family)[0]


def help_text(flag: dataclasses.Field, family: Family) -> str:
    """The help of the flag of field `flag` on `family`'s command line: for a value the family's recipe decides, the
    recipe's (`recipes.recipe_flag_help`); else the family's `flag_help`; else the field's (computed from the record
    when it is a function)."""
    if "recipe" in family.flags:
        recipe_help = recipe_flag_help(flag.name, family.id)
        if recipe_help is not None:
            return recipe_help
    text = flag.metadata["help"]
    return family.flag_help.get(flag.name, text) if isinstance(text, str) else text(family)


__all__ = [
    "AUTO_AUGMENTS",
    "MIXED_PRECISION",
    "OPTION_GROUPS",
    "OWN",
    "RECIPES",
    "RENAMED",
    "SCHEDULERS",
    "SCHEDULE_FUNCTIONS",
    "THE_DEFAULT",
    "UNSET",
    "CheckpointArguments",
    "DataArguments",
    "HubArguments",
    "LoaderArguments",
    "LoggingArguments",
    "LoraArguments",
    "ModelArguments",
    "OptimizationArguments",
    "ParallelismArguments",
    "RecipeArguments",
    "applies",
    "base_type",
    "default_choice",
    "flag_fields",
    "group_fields",
    "help_text",
    "option",
    "option_default",
    "option_fields",
]
