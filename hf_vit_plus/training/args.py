"""Command-line arguments of the training scripts, shared by the three families.

Every option lives in one dataclass, `TrainingArguments`, so the library loop can be called from Python
(`train(TrainingArguments(family="vit", ...))`) and from the command line (`parse_args("vit", argv)`) alike.
Each family supplies its own defaults (`FAMILY_DEFAULTS`): the same flag means the same thing everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from ..errors import UsageError, check_exists, check_model_location

FAMILIES = ("vit", "seq2seq", "sparse-lm")
SCHEDULERS = ("auto", "cosine", "noam", "linear", "constant")
MIXED_PRECISION = ("no", "fp16", "bf16")


@dataclass
class TrainingArguments:
    family: str = "vit"
    output_dir: str = "outputs/run"
    # --- model
    model_name_or_path: str | None = None
    config_name: str | None = None
    config_overrides: str | None = None
    tokenizer_name: str | None = None
    ignore_mismatched_sizes: bool = False
    # --- data
    dataset_name: str | None = None
    dataset_config: str | None = None
    train_dir: str | None = None
    validation_dir: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    image_column: str | None = None
    label_column: str | None = None
    source_column: str | None = None
    target_column: str | None = None
    text_column: str | None = None
    validation_split_percentage: float = 10.0
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    max_source_length: int = 64
    max_target_length: int = 64
    block_size: int = 128
    vocab_size: int = 1000
    dataloader_num_workers: int = 0
    # --- optimisation
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-3
    weight_decay: float = 0.05
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    num_train_epochs: float = 3.0
    max_train_steps: int | None = None
    lr_scheduler: str = "auto"
    warmup_steps: int | None = None
    warmup_ratio: float = 0.1
    label_smoothing: float = 0.0
    mixed_precision: str | None = None
    activation_checkpointing: bool = False
    use_cpu: bool = False
    seed: int = 42
    # --- logging, evaluation, checkpoints
    logging_steps: int = 10
    eval_steps: int | None = None
    checkpointing_steps: str = "epoch"
    checkpoints_total_limit: int | None = 2
    resume_from_checkpoint: str | None = None
    stop_after_steps: int | None = None
    report_to: str = "tensorboard"
    project_name: str | None = None
    # --- outputs
    push_to_hub: bool = False
    hub_model_id: str | None = None
    hub_revision: str | None = None
    hub_private: bool = False
    write_card: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise a `UsageError` (a `ValueError`) naming the offending option."""
        if self.family not in FAMILIES:
            raise UsageError(f"Unknown family {self.family!r}; expected one of {FAMILIES}.")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UsageError(f"--{name} must be a positive integer, got {value!r}.")
        for name in ("max_train_steps", "stop_after_steps", "eval_steps", "max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name} must be a positive integer, got {value!r}.")
        if self.logging_steps < 1:
            raise UsageError(f"--logging_steps must be a positive integer, got {self.logging_steps!r}.")
        if self.lr_scheduler not in SCHEDULERS:
            raise UsageError(f"--lr_scheduler must be one of {SCHEDULERS}, got {self.lr_scheduler!r}.")
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISION:
            raise UsageError(f"--mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}.")
        if self.num_train_epochs <= 0 and self.max_train_steps is None:
            raise UsageError(f"--num_train_epochs must be > 0, got {self.num_train_epochs!r}.")
        if self.learning_rate <= 0:
            raise UsageError(f"--learning_rate must be > 0, got {self.learning_rate!r}.")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise UsageError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}.")
        if not 0.0 < self.validation_split_percentage < 100.0:
            raise UsageError(
                f"--validation_split_percentage must be in (0, 100), got {self.validation_split_percentage!r}."
            )
        steps = self.checkpointing_steps
        if steps not in ("epoch", "none") and not (str(steps).isdigit() and int(steps) > 0):
            raise UsageError(f"--checkpointing_steps must be 'epoch', 'none' or a positive integer, got {steps!r}.")
        if self.checkpoints_total_limit is not None and self.checkpoints_total_limit < 1:
            raise UsageError(f"--checkpoints_total_limit must be >= 1, got {self.checkpoints_total_limit!r}.")
        if self.push_to_hub and not self.hub_model_id:
            raise UsageError("--push_to_hub needs --hub_model_id (e.g. 'my-user/vit-digits').")
        if self.train_dir and self.train_file:
            raise UsageError("Give either --train_dir (an image folder) or --train_file, not both.")
        if self.family == "vit" and self.train_file:
            raise UsageError("The vit family reads images: use --train_dir or --dataset_name, not --train_file.")
        if self.family != "vit" and self.train_dir:
            raise UsageError(
                f"The {self.family} family reads text: use --train_file or --dataset_name, not --train_dir."
            )
        if self.dataset_name and (self.train_dir or self.train_file):
            raise UsageError("Give either --dataset_name (Hub) or local data (--train_dir / --train_file), not both.")
        if self.validation_file and not self.train_file:
            raise UsageError("--validation_file needs --train_file.")
        if self.validation_dir and not self.train_dir:
            raise UsageError("--validation_dir needs --train_dir.")

    def check_paths(self) -> None:
        """Raise a `UsageError` naming the option whose local data or model path does not exist (run before any
        work starts; `validate` only checks values)."""
        for name, kind in (("train_dir", "dir"), ("validation_dir", "dir"), ("train_file", "file"),
                           ("validation_file", "file")):  # fmt: skip
            if getattr(self, name):
                check_exists(getattr(self, name), f"--{name}", kind)
        for name in ("model_name_or_path", "tokenizer_name"):
            if getattr(self, name):
                check_model_location(getattr(self, name), f"--{name}")

    @property
    def checkpoint_every(self) -> int | None:
        """Updates between two checkpoints; None when checkpoints are per epoch or switched off."""
        return int(self.checkpointing_steps) if str(self.checkpointing_steps).isdigit() else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Per-family defaults: the ViT values train the demo's small digits model; seq2seq follows section 5.3 of
# "Attention Is All You Need" (Adam 0.9/0.98/1e-9, the warm-up schedule with a base rate of 1.0, label smoothing 0.1).
FAMILY_DEFAULTS: dict[str, dict] = {
    "vit": dict(
        output_dir="outputs/vit",
        learning_rate=2e-3,
        weight_decay=0.05,
        num_train_epochs=30.0,
        per_device_train_batch_size=64,
        warmup_ratio=0.1,
    ),
    "seq2seq": dict(
        output_dir="outputs/seq2seq",
        learning_rate=1.0,
        weight_decay=0.0,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        num_train_epochs=10.0,
        per_device_train_batch_size=32,
        warmup_steps=200,
        label_smoothing=0.1,
        max_grad_norm=0.0,
    ),
    "sparse-lm": dict(
        output_dir="outputs/sparse-lm",
        learning_rate=1e-3,
        weight_decay=0.1,
        adam_beta2=0.95,
        num_train_epochs=1.0,
        per_device_train_batch_size=16,
        warmup_ratio=0.05,
    ),
}

_HELP = {
    "output_dir": "where the final model, card, figures, logs and checkpoints/ are written",
    "model_name_or_path": "start from a saved model (folder or Hub id) instead of a fresh one",
    "config_name": "preset or config folder of a fresh model (ViT: e.g. 'tiny-patch16-224'; default: the family's "
    "small built-in config)",
    "config_overrides": "comma-separated config fields, e.g. 'num_hidden_layers=2,hidden_size=64'",
    "tokenizer_name": "saved tokenizer folder (text families); default: a BPE tokenizer trained on the data",
    "ignore_mismatched_sizes": "allow a pretrained head of another size to be replaced (new number of labels)",
    "dataset_name": "data set on the Hub (or a local folder `load_dataset` understands)",
    "dataset_config": "configuration of --dataset_name",
    "train_dir": "image folder (class sub-folders) for training",
    "validation_dir": "image folder for evaluation (default: a split of --train_dir)",
    "train_file": "text/csv/json(l) file for training",
    "validation_file": "text/csv/json(l) file for evaluation (default: a split of --train_file)",
    "checkpointing_steps": "save the training state every N updates, every 'epoch', or 'none'",
    "resume_from_checkpoint": "checkpoint folder to resume from, or 'latest' (newest under OUTPUT_DIR/checkpoints)",
    "stop_after_steps": "stop after this many updates, saving the state to resume later (time-limited jobs)",
    "report_to": "tracker(s) for accelerate's log_with: tensorboard, wandb, ..., 'all' or 'none'",
    "lr_scheduler": "'auto' is the family's schedule: warm-up + cosine (ViT, LM), the paper's warm-up (seq2seq)",
    "mixed_precision": "default: the accelerate config / launcher setting",
    "activation_checkpointing": "recompute block activations in the backward pass to save memory",
    "use_cpu": "train on the CPU even when a GPU is present (always the case on a machine without one)",
    "hub_revision": "branch to push to (created if missing)",
    "write_card": "write README.md (model card) and figures next to the model",
}


# Flags with a fixed set of values: argparse refuses the others itself.
_CHOICES = {"mixed_precision": MIXED_PRECISION, "lr_scheduler": SCHEDULERS}


def _parse_bool(text: str) -> bool:
    lowered = str(text).lower()
    if lowered in ("1", "true", "yes", "y"):
        return True
    if lowered in ("0", "false", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def add_training_arguments(parser: argparse.ArgumentParser, family: str) -> argparse.ArgumentParser:
    """Add one flag per field of `TrainingArguments`, with the family's defaults."""
    if family not in FAMILIES:
        raise ValueError(f"Unknown family {family!r}; expected one of {FAMILIES}.")
    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else None) for f in _fields()}
    defaults.update(FAMILY_DEFAULTS[family])
    for f in _fields():
        kind = _base_type(f.type)
        kwargs = dict(default=defaults[f.name], help=_HELP.get(f.name))
        if kind is bool:
            if defaults[f.name]:
                kwargs.update(type=_parse_bool, nargs="?", const=True)
            else:
                kwargs.update(action="store_true")
        else:
            kwargs["type"] = kind
        if f.name in _CHOICES:
            kwargs["choices"] = _CHOICES[f.name]
        parser.add_argument(f"--{f.name}", **kwargs)
    parser.set_defaults(family=family)
    return parser


def args_from_namespace(namespace: argparse.Namespace) -> TrainingArguments:
    values = {f.name: getattr(namespace, f.name) for f in _fields() if hasattr(namespace, f.name)}
    return TrainingArguments(family=namespace.family, **values)


def parse_args(family: str, argv: list[str] | None = None) -> TrainingArguments:
    """Parse `argv` (default: sys.argv); a bad value exits with argparse's error (status 2)."""
    parser = argparse.ArgumentParser(description=f"Train the {family} family with Accelerate.")
    add_training_arguments(parser, family)
    namespace = parser.parse_args(argv)
    try:
        return args_from_namespace(namespace)
    except UsageError as error:
        parser.error(str(error))


def family_arguments(family: str, **overrides) -> TrainingArguments:
    """`TrainingArguments` with the family's defaults and `overrides` (the Python spelling of the CLI)."""
    values = dict(FAMILY_DEFAULTS[family])
    values.update(overrides)
    return TrainingArguments(family=family, **values)


def _fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(TrainingArguments) if f.name not in ("family", "extra")]


def _base_type(annotation) -> type:
    text = str(annotation)
    for name, kind in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if text.startswith(name):
            return kind
    return str
