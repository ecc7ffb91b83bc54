"""What every family's training task shares: the `TrainingTask` base class the loop (`loop.py`) calls, the raw
data it returns (`TrainingData`), the optimiser groups and the data helpers.

A task holds no state: each step takes what it needs and returns values. Before the run is planned (`plan.py`) the
loop and the plan call, with the options (`TrainingArguments`):

    load_data(options)                     -> TrainingData: "train" / "validation" with the family's columns
    model_config(options, data)            -> the run's model config (saved or fresh, the data's fields, the
                                              overrides), built once, or None where `build` builds it
    recipe_context(options, data, config, ...) -> what the recipe's values depend on (the families with a --recipe)
    recipe_config_fields(options, config, epochs) -> the model config fields the run sets, and who chose each

and then, with the plan (`RunPlan`: the resolved options in their groups, `plan.model_options`, `plan.data_options`,
`plan.optimization`, `plan.recipe`, ...), which is all they read of the run's options:

    build(plan, data)                      -> (model, processor): image processor or tokenizer
    transform(data, processor, model, plan)-> the datasets the loaders read, processed on the fly
    collate_fn(processor)                  -> batches
    unit_batches(data, processor, model, plan) -> how training batches are made in the loader's workers, unit by
                                              unit (a stream, a token budget, images read from files), or None
    on_device(batch, extras)               -> a training batch on the device, finished (e.g. uint8 images
                                              normalised and erased)
    token_counts(batch)                    -> (real, padded) tokens of a text batch, for the padding fraction
    extras(plan, model, accelerator)       -> what the loss needs besides the model (e.g. a teacher), or {}
    training_loss(model, batch, extras)    -> the loss of one micro-batch (default: the model's own)
    eval_outputs(model, batch), metrics(gathered)
    measure_baselines(data, datasets)      -> the task's trivial baselines on the evaluation split (`learning_metric`
                                              says which one the final evaluation must beat: `learning.py`)
    create_optimizer(model, plan), create_scheduler(optimizer, plan): the plan's optimizer and schedule
    preprocessing(plan, processor), figures(model, processor, raw, output_dir)   for the model card

With --streaming, `load_data` returns the training examples as a stream (`TrainingData.stream`, read by the loader's
workers: `hf_vit_plus.data.pipeline`), the evaluation split read whole (from the source's validation split or files,
else the stream's first --max_eval_samples examples, held out) and a sample of the stream's first examples as "train"
(`stream_data`): what the baselines, the label names and a tokenizer trained on the data are taken from.

`load_data` may also return reference numbers measured on the evaluation split (`TrainingData.baselines`, e.g. the
image model's floors), which the loop writes beside the model's results.

Every family builds its model on one path (`build_config`, then `load_or_create_model`): the config of
--model_name_or_path, of a --config_name folder or preset, or the family's small default, with what the data fixes
(labels, vocabulary, special tokens) and then --config_overrides set on top. The classes, the Auto class and what
--lr_scheduler_type auto means come from the family's record (`hf_vit_plus.families`). Within
`weights_from_main_process()` (FSDP2's cpu_ram_efficient_loading, on the processes other than the main one),
`load_or_create_model` builds the saved model's layout on the meta device without reading its weights, which reach
it from the main process once sharded (`sharding.WeightsFromMainProcess`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import DatasetDict
from transformers import AutoTokenizer, PretrainedConfig

from ...data.loading import DataSource, load_user_dataset, load_user_stream, pick_column, user_data_source
from ...errors import UsageError, load_config
from ...families import Family, get_family
from ..args import TrainingArguments
from ..learning import LearningMetric
from ..options import DataArguments, ModelArguments
from ..plan import RunPlan
from .overrides import check_config_overrides, config_value_errors, parse_overrides

# whether `load_or_create_model` leaves a saved model's weights to the main process (`weights_from_main_process`)
_WEIGHTS_FROM_MAIN_PROCESS: ContextVar[bool] = ContextVar("weights_from_main_process", default=False)


@contextmanager
def weights_from_main_process(active: bool = True) -> Iterator[None]:
    """Within it (when `active`), `load_or_create_model` builds --model_name_or_path's model on the meta device.

    The model is built from its config, reading no weights (a fresh model is built as usual).

    Args:
        active: whether the context applies; False leaves loading as it is.
    """
    token = _WEIGHTS_FROM_MAIN_PROCESS.set(active)
    try:
        yield
    finally:
        _WEIGHTS_FROM_MAIN_PROCESS.reset(token)


# --------------------------------------------------------------------------------------------------- optimisation
def weight_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two optimiser groups, decided by tensor rank (as in nanoGPT).

    Matrices (rank >= 2) are decayed; biases, norm weights and other rank < 2 tensors are not. Frozen parameters are
    left out.

    Args:
        model: the model whose trainable parameters are grouped.
        weight_decay: the decay of the first group.

    Returns:
        Two parameter groups for a `torch.optim` optimiser: the decayed, then the others (weight decay 0).
    """
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# the devices where torch's fused AdamW runs (CPU since torch 2.4), and the floating dtypes it updates
_FUSED_DEVICES = ("cpu", "cuda")
_FUSED_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def fused_optimizer_supported(model: torch.nn.Module) -> bool:
    """Whether torch's fused AdamW can update `model`'s trainable parameters: plain tensors (not FSDP2's sharded
    DTensors) of a floating dtype on the CPU or a CUDA GPU. It updates each tensor in one pass instead of a dozen
    elementwise kernels (on the CPU torch's default is the per-tensor loop), the same update to rounding."""
    params = [param for param in model.parameters() if param.requires_grad]
    return bool(params) and all(
        type(param) is torch.nn.Parameter and param.device.type in _FUSED_DEVICES and param.dtype in _FUSED_DTYPES
        for param in params
    )


# ---------------------------------------------------------------------------------------------------- the family
# The columns of images and of their classes: the names to guess from (WebDataset shards name them by the files'
# extensions: "jpg", "cls")
IMAGE_COLUMNS = ("image", "img", "picture", "jpg", "jpeg", "png", "webp")
LABEL_COLUMNS = ("label", "labels", "fine_label", "cls")

# With --streaming: the evaluation examples held out of the stream's head when it has no validation split (unless
# --max_eval_samples says how many), and the examples after them read into memory as a sample of the training data
# (the baselines, the label names, a tokenizer trained on the data).
STREAM_HELD_OUT_EXAMPLES = 1000
STREAM_SAMPLE_EXAMPLES = 1000


@dataclass(frozen=True)
class TrainingStream:
    """The training examples of a run read as a stream (--streaming).

    Attributes:
        dataset: the raw examples (a `datasets.IterableDataset`) with the family's columns, images undecoded.
        held_out: fingerprints of the examples held out of its head for evaluation (`pipeline.example_fingerprint`).
        shards: its shards (files, or the Hub's).
    """

    dataset: Any
    held_out: frozenset[bytes] = frozenset()
    shards: int = 1


@dataclass(frozen=True)
class UnitBatches:
    """How a family's training batches are made in the loader's workers, unit by unit (`pipeline.ResumableLoader`).

    Attributes:
        make: a unit's raw examples (columns) and a numpy generator -> its batches (picklable).
        unit_size: raw examples per unit.
        whole_batches: a unit is one batch, its examples a process's share of a global batch (the epoch's batches
            are then known for data read whole); else a pool of examples that becomes any number of batches.
    """

    make: Callable[[dict[str, list], Any], list[dict]]
    unit_size: int
    whole_batches: bool


@dataclass(frozen=True)
class TrainingData:
    """The raw splits of a run, as `TrainingTask.load_data` returns them.

    Attributes:
        raw: "train" and "validation", with the family's column names.
        name: the data set's name in the model card.
        label_column: ViT: the user's label column, named when the model has another class count.
        baselines: reference numbers on the evaluation split that are not the model's (e.g. an image model's floors
            in bits/dim).
        eval_split: the data set's split that "validation" holds, as the model card names it.
        hub_id: the data set's Hub id, where it has one (the card's `datasets` and model-index).
        description: what the model card says of the data's source and splits (markdown).
        languages: the texts' language codes (a translation card's source then target).
        stream: with --streaming, the training examples as a stream ("train" of `raw` is then a sample of its
            head); None for data read whole.
        eval_from: where the evaluation examples come from, in words, for the run's first lines ("" when the data
            says nothing more than its split).
    """

    raw: DatasetDict
    name: str
    label_column: str | None = None
    baselines: dict[str, float] = dataclasses.field(default_factory=dict)
    eval_split: str = "validation"
    hub_id: str | None = None
    description: str = ""
    languages: tuple[str, ...] = ()
    stream: TrainingStream | None = None
    eval_from: str = ""


class TrainingTask:
    """The per-family pieces of the loop.

    Subclasses set `name` (the id of their `hf_vit_plus.families` record) and implement the data and evaluation
    methods.
    """

    name: str = ""
    trains_its_processor: bool = False  # a tokenizer trained on the data (saved with each checkpoint)
    # the evaluation metric and the trivial baseline it must clearly beat for the run to have learned (`learning.py`)
    learning_metric: LearningMetric | None = None
    # the optimizer of the plan (`plan.OptimizerSpec.name`): "adamw", or "adam" (the encoder-decoder paper's)
    optimizer_name: str = "adamw"

    @property
    def spec(self) -> Family:
        """The family's record."""
        return get_family(self.name)

    def smallest_feature_map(self, args: TrainingArguments) -> int | None:
        """The side of the smallest feature map of the run's model on its inputs, where the model is a convolutional
        network (the precision plan reads it before any data is loaded: `recipes.recipe_mixed_precision`).

        Args:
            args: the run's arguments.

        Returns:
            The side in pixels, or None (the default): not a convolutional network, or not known before the data.
        """
        return None

    @property
    def config_class(self) -> type:
        """The config of a fresh model."""
        return self.spec.config_class

    @property
    def model_class(self) -> type:
        """The model trained."""
        return self.spec.head_class

    @property
    def auto_model_class(self) -> type:
        """The Auto class that loads --model_name_or_path."""
        return self.spec.auto_head_class

    @property
    def default_scheduler(self) -> str:
        """What --lr_scheduler_type auto means."""
        return self.spec.lr_scheduler

    # --- model
    def is_preset(self, config_name: str) -> bool:
        """Whether --config_name names a preset of the family (else a config folder or Hub id).

        Args:
            config_name: the value of --config_name.

        Returns:
            True for a preset name of the family's config class.
        """
        return hasattr(self.config_class, "from_preset") and not Path(config_name).is_dir()

    def saved_config(self, options: ModelArguments) -> PretrainedConfig | None:
        """The config saved at --model_name_or_path, or at a --config_name folder or Hub id, read; None for a fresh
        model (the family's config, or a --config_name preset). A run reads it once, when the plan builds the run's
        config (`model_config`).

        Args:
            options: the run's model options (the plan's `model_options`, or the arguments before the plan).

        Returns:
            The saved config, or None.

        Raises:
            UsageError: the location holds no model config.
        """
        if options.model_name_or_path:
            return load_config(options.model_name_or_path, "--model_name_or_path")
        if options.config_name and not self.is_preset(options.config_name):
            return load_config(options.config_name, "--config_name")
        return None

    def config_class_for(self, options: ModelArguments, saved: PretrainedConfig | None = None) -> type:
        """The class of the config `build_config` makes.

        That of the saved config (`saved`, else read from --model_name_or_path or a --config_name folder), else the
        family's own (after checking that a --config_name preset exists).

        Args:
            options: the run's model options (the plan's `model_options`, or the arguments before the plan).
            saved: the saved config, if read already (`saved_config`).

        Returns:
            The config class.

        Raises:
            UsageError: --config_name names no preset of the family.
        """
        if saved is None:
            saved = self.saved_config(options)
        if saved is not None:
            return type(saved)
        if options.config_name:
            try:
                self.config_class.from_preset(options.config_name)
            except ValueError as error:  # an unknown preset; the message lists the known ones
                raise UsageError(f"--config_name: {error}") from error
        return self.config_class

    def config_overrides(self, options: ModelArguments, saved: PretrainedConfig | None = None) -> dict[str, Any]:
        """--config_overrides parsed and checked against the fields of the config `build_config` makes.

        Args:
            options: the run's model options (the plan's `model_options`, or the arguments before the plan).
            saved: the saved config the run's config starts from, if any (`saved_config`).

        Returns:
            Field name -> value.

        Raises:
            UsageError: a key that is not a field of the config.
        """
        overrides = parse_overrides(options.config_overrides)
        if overrides:
            check_config_overrides(self.config_class_for(options, saved), overrides)
        return overrides

    def build_config(
        self, options: ModelArguments, defaults: dict, fields: dict, saved: PretrainedConfig | None = None
    ) -> PretrainedConfig:
        """The model's config.

        That of --model_name_or_path, of a --config_name folder, Hub id or preset, or the family's `defaults`; then
        `fields` (what the data and the run fix) and --config_overrides on top (on a saved config as
        `from_pretrained(location, **values)` sets them).

        Args:
            options: the run's model options (the plan's `model_options`, or the arguments before the plan).
            defaults: the family's config values for a fresh model.
            fields: the values the data and the run fix (e.g. the number of labels).
            saved: the saved config, if read already (`saved_config`); read here when not given.

        Returns:
            The config.

        Raises:
            UsageError: the config refuses its values.
        """
        if saved is None:
            saved = self.saved_config(options)
        values = {**fields, **self.config_overrides(options, saved)}
        with config_value_errors(options):
            if saved is not None:
                return with_values(saved, values)
            if options.config_name:
                return self.config_class.from_preset(options.config_name, **values)
            return self.config_class(**{**defaults, **values})

    def model_config(self, options: TrainingArguments, data: TrainingData) -> PretrainedConfig | None:
        """The run's model config, built once by the plan (`plan.build_plan`, before the recipe's fields are set on
        it: `recipe_config_fields`); `build` instantiates the model from it. None (the default) for a family whose
        config is sized by the processor `build` makes with the model (a tokenizer trained on the data): its `build`
        builds the config.

        Args:
            options: the run's options.
            data: the run's data (e.g. its labels).

        Returns:
            The config, or None.
        """
        return None

    def load_or_create_model(self, options: ModelArguments, config: PretrainedConfig) -> torch.nn.Module:
        """The saved model of --model_name_or_path with `config`, or a fresh one.

        Within `weights_from_main_process` the saved model is only its layout on the meta device (the class
        from_pretrained would choose).

        Args:
            options: the run's model options (the plan's `model_options`, or the arguments before the plan).
            config: the model's config (from `build_config`).

        Returns:
            The model.
        """
        if options.model_name_or_path and _WEIGHTS_FROM_MAIN_PROCESS.get():
            with torch.device("meta"):
                return self.auto_model_class.from_config(config).eval()  # in eval mode, as from_pretrained gives it
        if options.model_name_or_path:
            return self.auto_model_class.from_pretrained(
                options.model_name_or_path, config=config, ignore_mismatched_sizes=options.ignore_mismatched_sizes
            )
        return self.model_class(config)

    def build(self, plan: RunPlan, data: TrainingData) -> tuple[torch.nn.Module, Any]:
        """The model and its processor; each family implements it.

        Args:
            plan: the run's plan.
            data: the run's data (a tokenizer may be trained on it).

        Returns:
            The model and its processor (image processor or tokenizer).
        """
        raise NotImplementedError

    # --- data
    def load_data(self, options: TrainingArguments) -> TrainingData:
        """The run's raw splits; each family implements it.

        Args:
            options: the run's options (the data options name the data).

        Returns:
            The raw splits with their card record.
        """
        raise NotImplementedError

    def recipe_context(self, options: TrainingArguments, data: TrainingData, config: PretrainedConfig | None,
                       global_batch: int, total_steps: int, epochs: float):  # fmt: skip
        """What the values of the family's --recipe depend on (`recipes.RecipeContext`); the families with a recipe
        implement it.

        Args:
            options: the run's options.
            data: the run's data.
            config: the run's model config (`model_config`).
            global_batch: examples per update.
            total_steps: the updates of the run.
            epochs: the run's length in passes over the training data.

        Returns:
            The recipe's context.
        """
        raise NotImplementedError

    def recipe_config_fields(self, options: TrainingArguments, config: PretrainedConfig, epochs: float) -> dict:
        """Model config fields the run sets on its config beyond what the data fixes (e.g. a recipe's stochastic
        depth); none by default.

        Args:
            options: the run's options, resolved.
            config: the run's model config (`model_config`), which the plan sets them on.
            epochs: the run's length in passes over the training data.

        Returns:
            Config field -> (value, who chose it).
        """
        return {}

    def transform(self, data: TrainingData, processor, model, plan: RunPlan) -> DatasetDict:
        """The splits as model inputs; each family implements it.

        Args:
            data: the run's raw splits.
            processor: the image processor or tokenizer.
            model: the model (its config fixes sizes such as the image resolution).
            plan: the run's plan.

        Returns:
            The transformed splits.
        """
        raise NotImplementedError

    def collate_fn(self, processor) -> Callable[[list[dict]], dict]:
        """The function that turns a list of examples into a batch; each family implements it.

        Args:
            processor: the image processor or tokenizer (its padding).

        Returns:
            The collate function of the data loaders.
        """
        raise NotImplementedError

    def unit_batches(self, data: TrainingData, processor, model, plan: RunPlan) -> UnitBatches | None:
        """How the training batches are made in the loader's workers, unit by unit (`pipeline.ResumableLoader`):
        for a stream, a token budget, or images read from files; None (the default): the training split of
        `transform` through a plain DataLoader with `collate_fn`.

        Args:
            data: the run's data.
            processor: the image processor or tokenizer.
            model: the model.
            plan: the run's plan.

        Returns:
            The recipe of the units, or None.
        """
        return None

    def on_device(self, batch: dict, extras: dict[str, Any]) -> dict:
        """A training batch on the device, before the loss: finished where that is cheaper per batch (e.g. uint8
        images normalised and erased); as it is by default.

        Args:
            batch: the micro-batch, on the device.
            extras: what `extras` returned.

        Returns:
            The batch the loss reads.
        """
        return batch

    def token_counts(self, batch: dict) -> tuple[int, int] | None:
        """(real tokens, tokens after padding) of a text batch, for the padding fraction the run logs; None for a
        family that reads no text.

        Args:
            batch: a training micro-batch.

        Returns:
            The two counts, or None.
        """
        return None

    # --- training
    def extras(self, plan: RunPlan, model, accelerator) -> dict[str, Any]:
        """What `training_loss` needs besides the model and the batch (e.g. a teacher model on the device).

        Args:
            plan: the run's plan.
            model: the model, as `accelerator.prepare` returned it.
            accelerator: the run's `Accelerator`.

        Returns:
            Name -> object, passed to every `training_loss` call; empty by default.
        """
        return {}

    def training_loss(self, model, batch: dict, extras: dict[str, Any]) -> torch.Tensor:
        """The loss of one training micro-batch: the model's own by default.

        Args:
            model: the model.
            batch: the micro-batch.
            extras: what `extras` returned.

        Returns:
            The scalar loss.
        """
        return model(**batch).loss

    # --- evaluation
    def eval_outputs(self, model, batch: dict) -> dict[str, torch.Tensor]:
        """Per-example tensors (first dimension = batch) for `gather_for_metrics`; each family implements it.

        Args:
            model: the model, in eval mode.
            batch: an evaluation batch.

        Returns:
            Name -> tensor.
        """
        raise NotImplementedError

    def metrics(self, gathered: dict[str, torch.Tensor]) -> dict[str, float]:
        """The evaluation metrics of the gathered per-example tensors; each family implements it.

        Args:
            gathered: `eval_outputs` of the whole evaluation split, gathered from every process.

        Returns:
            Metric name -> value.
        """
        raise NotImplementedError

    # --- optimisation
    def create_optimizer(self, model, plan: RunPlan) -> torch.optim.Optimizer:
        """The plan's optimizer over `weight_decay_groups`: AdamW, fused where torch supports it for the model, or
        the paper's Adam (`plan.optimizer.name`).

        Args:
            model: the model.
            plan: the run's plan (its `optimizer`).

        Returns:
            The optimiser.
        """
        spec = plan.optimizer
        groups = weight_decay_groups(model, spec.weight_decay)
        if spec.name == "adam":
            return torch.optim.Adam(groups, lr=spec.learning_rate, betas=spec.betas, eps=spec.eps)
        return torch.optim.AdamW(
            groups,
            lr=spec.learning_rate,
            betas=spec.betas,
            eps=spec.eps,
            fused=fused_optimizer_supported(model) or None,
        )

    def create_scheduler(self, optimizer, plan: RunPlan):
        """The plan's learning-rate schedule, by transformers' `get_scheduler`: it multiplies the optimizer's rate
        (the peak, --learning_rate) by at most 1.

        Args:
            optimizer: the optimiser.
            plan: the run's plan (its `schedule`).

        Returns:
            The scheduler (a `LambdaLR`).
        """
        from transformers import get_scheduler

        spec = plan.schedule
        return get_scheduler(
            spec.function, optimizer, num_warmup_steps=spec.warmup_steps, num_training_steps=spec.total_steps
        )

    def measure_baselines(self, data: TrainingData, datasets) -> dict[str, float]:
        """Trivial baselines on the evaluation split (e.g. the majority class's accuracy), measured on the run's data.

        They are written beside the results and the card's.

        Args:
            data: the raw splits.
            datasets: the splits as the loaders read them.

        Returns:
            Baseline name -> value; empty by default.
        """
        return {}

    # --- card extras
    def preprocessing(self, plan: RunPlan, processor) -> str:
        """What the model card says of how examples became model inputs.

        Args:
            plan: the run's plan.
            processor: the image processor or tokenizer.

        Returns:
            Markdown; "" when the family says nothing.
        """
        return ""

    def figures(self, model, processor, raw: DatasetDict, output_dir: Path) -> list[Path]:
        """The sparse attention pattern the model uses (the Sparse Transformer paper's Fig. 3), when it has one.

        Args:
            model: the trained model.
            processor: the image processor or tokenizer.
            raw: the raw splits.
            output_dir: the folder to write the figures to.

        Returns:
            The written figures; empty for dense attention.
        """
        from ...models.sparse_layouts import pattern_from_config as sparse_pattern

        if sparse_pattern(model.config) is None:  # dense attention
            return []
        from ...interpret import pattern_from_config, plot_sparse_patterns

        return [plot_sparse_patterns([pattern_from_config(model.config)], output_dir / "sparse_attention_pattern.png")]


# ------------------------------------------------------------------------------------------------- data helpers
def with_values(saved: PretrainedConfig, values: dict[str, Any]) -> PretrainedConfig:
    """A copy of a saved config with `values` set as `from_pretrained(location, **values)` sets them (each field the
    config has, in order), without reading the saved config again.

    Args:
        saved: the config read from its location.
        values: field -> value.

    Returns:
        The new config (`saved` is left as it is).
    """
    config = copy.deepcopy(saved)
    for key, value in values.items():
        if hasattr(config, key):
            setattr(config, key, value)
    return config


def builtin_data(options: DataArguments) -> bool:
    """Whether the run uses the family's built-in data (no data option given)."""
    return not (options.dataset_name or options.train_dir or options.train_file)


def builtin_card_record(dataset) -> tuple[str, dict]:
    """`TrainingData`'s name and fields (evaluation split, Hub id, description) for a built-in image data set
    (`hf_vit_plus.data.images.ImageDataset`), whose test split is the evaluation split."""
    return dataset.card_name, dict(eval_split="test", hub_id=dataset.hub_id, description=dataset.card_description)


def user_data_record(options: TrainingArguments, files: str | None) -> dict:
    """`TrainingData`'s name, Hub id and description of the user's data: --dataset_name when it is a Hub id (not a
    local folder), else the local files' name (`files`: --train_dir or --train_file)."""
    from ...hub.card import hub_dataset_id

    if options.dataset_name:
        hub_id = hub_dataset_id(options.dataset_name)
        config = f" (configuration `{options.dataset_config_name}`)" if options.dataset_config_name else ""
        where = f"the Hub data set `{hub_id}`" if hub_id else f"the data set in `{Path(options.dataset_name).name}`"
        return dict(name=options.dataset_name if hub_id else Path(options.dataset_name).name, hub_id=hub_id,
                    description=f"{where}{config}, loaded with `datasets.load_dataset`.")  # fmt: skip
    name = Path(files).stem if files else "local files"
    return dict(name=name, hub_id=None, description=f"local files (`{name}`), not on the Hub.")


# The run's options that say where the user's data is, as `data.loading.user_data_source` takes them.
USER_DATA_OPTIONS = (
    "dataset_name", "dataset_config_name", "train_dir", "validation_dir", "train_file", "validation_file"
)  # fmt: skip


def user_data(options: TrainingArguments) -> DataSource:
    """The user's data that --dataset_name, --dataset_config_name, --train_dir, --validation_dir, --train_file and
    --validation_file name (`data.loading.user_data_source`: checked, not read)."""
    return user_data_source(**{name: getattr(options, name) for name in USER_DATA_OPTIONS})


def load_user_data(options: TrainingArguments) -> DatasetDict:
    """The user's data (--dataset_name, --train_dir or --train_file) with "train" and "validation" splits."""
    return load_user_dataset(user_data(options), options.validation_split_percentage, options.seed)


def stream_data(options: TrainingArguments, **roles: tuple[str | None, tuple[str, ...], str]):
    """The user's data with --streaming (`data.loading.load_user_stream`): one column per role (as `select_columns`),
    images left undecoded in the stream; the evaluation split from the source's validation split or files (its first
    --max_eval_samples examples, if given), else the stream's first --max_eval_samples examples
    (`STREAM_HELD_OUT_EXAMPLES` when not given), held out of training by their fingerprints; and the
    `STREAM_SAMPLE_EXAMPLES` examples that follow, read into memory as a sample of the training data.

    Args:
        options: the run's options.
        **roles: as `select_columns`.

    Returns:
        (raw splits: the sample as "train" and the evaluation split as "validation"; the stream; where the evaluation
        examples come from, in words; the chosen column of each role).

    Raises:
        ValueError: data that cannot be read, a missing column, a stream too short to hold its evaluation examples out.
    """
    from datasets import Dataset, Image

    from ...data.image_files import image_feature_columns, undecoded
    from ...data.pipeline import example_fingerprint

    user = load_user_stream(user_data(options))
    stream = user.train
    names = list(stream.column_names or next(iter(stream.take(1)), {}))
    chosen = {role: pick_column(names, requested, candidates, flag) for role, (requested, candidates, flag)
              in roles.items()}  # fmt: skip
    renames = {column: role for role, column in chosen.items() if column != role}
    stream = undecoded(stream.select_columns(list(chosen.values())))
    if renames:
        stream = stream.rename_columns(renames)
    held = 0 if user.validation is not None else (options.max_eval_samples or STREAM_HELD_OUT_EXAMPLES)
    head = list(stream.take(held + STREAM_SAMPLE_EXAMPLES))
    if len(head) <= held:
        raise ValueError(
            f"The stream has {len(head)} examples: too few to hold {held} out for evaluation and train on the rest "
            "(give --validation_file / --validation_dir, or a smaller --max_eval_samples)."
        )
    features = stream.features

    def as_dataset(rows: list[dict]) -> Dataset:
        dataset = Dataset.from_list(rows, features=features)
        for column in image_feature_columns(features):  # decoded again, as the evaluation reads them
            dataset = dataset.cast_column(column, Image())
        return dataset

    if user.validation is not None:
        for role, column in chosen.items():
            pick_column(user.validation.column_names, column, (), roles[role][2])
        validation = user.validation.select_columns(list(chosen.values()))
        if renames:
            validation = validation.rename_columns(renames)
        if options.max_eval_samples is not None:
            validation = validation.select(range(min(options.max_eval_samples, len(validation))))
        eval_from = user.validation_from + (f", its first {len(validation)} examples"
                                            if options.max_eval_samples is not None else "")  # fmt: skip
        held_out: frozenset[bytes] = frozenset()
    else:
        validation = as_dataset(head[:held])
        first = f"the first {held} examples" if held > 1 else "the first example"
        eval_from = f"{first} of the stream, held out of training"
        held_out = frozenset(example_fingerprint(row) for row in head[:held])
    raw = DatasetDict(train=as_dataset(head[held:]), validation=validation)
    return raw, TrainingStream(stream, held_out, stream.num_shards), eval_from, chosen


def select_columns(raw: DatasetDict, **roles: tuple[str | None, tuple[str, ...], str]):
    """Keep one column per role, renamed to the role: `roles` maps it to (the column the user asked for or None,
    the names to guess from, the flag that sets it). Returns the data and the chosen column of each role; a column
    missing from any split is named with the columns that exist."""
    chosen = {}
    for role, (requested, candidates, flag) in roles.items():
        chosen[role] = pick_column(raw["train"].column_names, requested, candidates, flag)
        for split in raw.values():
            pick_column(split.column_names, chosen[role], (), flag)
    raw = raw.select_columns(list(chosen.values()))
    return raw.rename_columns({column: role for role, column in chosen.items() if column != role}), chosen


def limit_samples(raw: DatasetDict, options: TrainingArguments) -> DatasetDict:
    """The first --max_train_samples / --max_eval_samples examples."""
    if options.max_train_samples is not None:
        raw["train"] = raw["train"].select(range(min(options.max_train_samples, len(raw["train"]))))
    if options.max_eval_samples is not None:
        raw["validation"] = raw["validation"].select(range(min(options.max_eval_samples, len(raw["validation"]))))
    return raw


def saved_tokenizer(location: str | None):
    """The tokenizer saved in `location` (a folder or Hub id: --tokenizer_name, the checkpoint's, or
    --model_name_or_path); None without one."""
    return AutoTokenizer.from_pretrained(location) if location else None


def pad_sequences(sequences: list, value: int) -> torch.Tensor:
    """Token id lists as one (batch, longest) tensor, right-padded with `value`."""
    width = max(len(s) for s in sequences)
    out = torch.full((len(sequences), width), value, dtype=torch.long)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out
