"""The decisions of a training run, made once: `RunPlan`, a frozen record of every resolved value that the loop, the
tasks, the outputs and the card read: the options in their groups (`plan.optimization`, `plan.data_options`,
`plan.checkpointing`, ...: `PLAN_GROUPS`), and what was decided from them. Once the plan is built nothing reads the
arguments.

The arguments (`args.TrainingArguments`) hold what was given, on the command line, in a run file or from Python, and
the defaults of the family's record and of the options themselves, with who chose each (`TrainingArguments.chosen_by`).
The plan decides the rest, and says who chose each value (`RunPlan.chosen_by`, the first lines of the run):

- the launch (`decide_launch`, from the options and the machine alone, before the Accelerator, which is built from
  it): sharding (`sharding.ParallelismRequest`: --fsdp, --fsdp_config, the launcher's environment), the device,
  precision (--mixed_precision, else the launcher's, else --recipe's, `recipes.recipe_mixed_precision`: "deit" takes
  bf16 autocast where the device multiplies bf16 natively, fp32 for a convolutional network whose feature maps shrink
  to 1 x 1 on the CPU; else Accelerate's default) and activation checkpointing (--activation_checkpointing, or the
  FSDP config's);
- the checkpoint to resume and its processor (`resume_point`, once the run holds its output folder);
- the rest (`build_plan`, once the data is loaded, before any model is built): a built-in data set's epochs, the run's
  length, the recipe's values for this data and run (`recipes.run_recipe_values`), the schedule 'auto' names, the
  warm-up, the optimizer and the schedule (transformers' `get_scheduler`, its peak at --learning_rate), the model
  config (built once by the task, with the fields the recipe sets on it), and how the data is read (`DataPlan`: a
  stream or not, batches of examples or of tokens, the loader's workers and their settings).

The Accelerator needs a process group before the folder is locked and the data read (under `main_process_first`), so
the launch is decided first and the rest with it in `build_plan`; `preview_plan` plans without an Accelerator
(`--print_config`). `describe` gives the lines a run starts with.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..families import get_family
from .args import REQUIRED_VALUES, TrainingArguments, check_values, flag_fields
from .checkpoints import PROCESSOR_DIR, check_same_model, read_training_state, resolve_checkpoint
from .options import (
    OPTION_GROUPS,
    SCHEDULE_FUNCTIONS,
    THE_DEFAULT,
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
    group_fields,
    option_default,
)
from .recipes import DEIT_EPOCHS, recipe_mixed_precision, run_recipe_values, updates_per_epoch
from .sharding import ParallelismRequest, parallelism_request

# The plan's field of each option group (`options.OPTION_GROUPS`, in their order): the resolved options, by group.
PLAN_GROUPS: dict[str, type] = {
    "model_options": ModelArguments,
    "data_options": DataArguments,
    "loading": LoaderArguments,
    "optimization": OptimizationArguments,
    "recipe": RecipeArguments,
    "parallelism": ParallelismArguments,
    "checkpointing": CheckpointArguments,
    "logging": LoggingArguments,
    "lora": LoraArguments,
    "hub": HubArguments,
}
assert tuple(PLAN_GROUPS.values()) == OPTION_GROUPS
# option -> the plan's field of its group
_GROUP_OF = {flag.name: name for name, group in PLAN_GROUPS.items() for flag in group_fields(group)}


@dataclass(frozen=True)
class ResumePoint:
    """A training state to resume from.

    Attributes:
        path: its folder.
        state: its training_state.json.
    """

    path: Path
    state: dict


@dataclass(frozen=True)
class Launch:
    """What the Accelerator is built from, decided from the options and the machine before it is built.

    Attributes:
        request: the sharding asked for, by the options and the launcher.
        on_cpu: whether the run trains on the CPU (--use_cpu, or no accelerator device here).
        precision: the precision the run trains in ("no", "bf16", "fp16"): the one field that holds it (the
            Accelerator is built from it, `mixed_precision`; the resolved --mixed_precision is it).
        precision_from: who chose it: "--mixed_precision", "the launcher", "--recipe deit", "the default", ...
        activation_checkpointing: whether the model recomputes its activations in the backward pass.
        checkpointing_from: who asked for activation checkpointing (None: off).
        precision_given: whether the precision is the user's (--mixed_precision, a run file's other than the plan's
            choice).
        checkpointing_given: whether the user asked for activation checkpointing.
    """

    request: ParallelismRequest
    on_cpu: bool
    precision: str
    precision_from: str
    activation_checkpointing: bool = False
    checkpointing_from: str | None = None
    precision_given: bool = False
    checkpointing_given: bool = False

    @property
    def sharded(self) -> bool:
        """Whether FSDP or DeepSpeed shards the run (they then keep their own precision settings)."""
        return _sharded(self.request)

    @property
    def mixed_precision(self) -> str | None:
        """The precision given to the Accelerator: None where Accelerate has it already (the launcher's, an earlier
        run's in this process) or its default is the run's."""
        return None if self.precision_from in _ACCELERATE_PRECISION else self.precision


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer a run builds (`TrainingTask.create_optimizer`).

    Attributes:
        name: "adamw" (torch's AdamW), or "adam" (Adam with L2 weight decay: the encoder-decoder paper's).
        learning_rate: the peak learning rate (the schedule multiplies it by at most 1).
        betas: Adam's beta1 and beta2.
        eps: Adam's epsilon.
        weight_decay: the decay of the matrices (tensors of rank < 2 are not decayed).
    """

    name: str
    learning_rate: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float


@dataclass(frozen=True)
class ScheduleSpec:
    """The learning-rate schedule a run builds (`TrainingTask.create_scheduler`).

    Attributes:
        name: --lr_scheduler_type as the run uses it ("cosine", "noam", "linear", "constant").
        function: transformers' `SchedulerType` of it, built by `transformers.get_scheduler`.
        warmup_steps: the updates of linear warm-up; the rate peaks after them.
        total_steps: the updates of the run.
        peak: the peak learning rate (the optimizer's, --learning_rate).
    """

    name: str
    function: str
    warmup_steps: int
    total_steps: int
    peak: float


@dataclass(frozen=True)
class DataPlan:
    """How a run reads its training data (`hf_vit_plus.data.pipeline`).

    Attributes:
        streaming: whether the training examples are read as a stream (--streaming).
        shuffle_buffer_size: a stream's shuffle buffer (0: its own order).
        split: how the processes share a stream: "shards" (whole shards each) or "examples" (every N-th example);
            "" for data read whole.
        shards: a stream's shards.
        max_tokens_per_batch: the token budget of a batch (per process), or None for batches of examples.
        batch_by_tokens: whether batches hold any number of examples within the budget (pairs of any length); False
            for batches of examples (a budget of fixed-length blocks is a number of them).
        num_workers: the loader's worker processes.
        pin_memory: whether batches are copied to page-locked memory.
        persistent_workers: whether the workers live from one epoch to the next.
        prefetch_factor: batches (units) each worker prepares ahead; None without workers.
        eval_from: where the evaluation examples come from, in words ("" when the split says it).
    """

    streaming: bool = False
    shuffle_buffer_size: int = 0
    split: str = ""
    shards: int = 0
    max_tokens_per_batch: int | None = None
    batch_by_tokens: bool = False
    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    eval_from: str = ""

    @property
    def loader_settings(self) -> dict[str, Any]:
        """The keyword arguments of every loader the run builds, training and evaluation (torch refuses the worker
        settings without workers)."""
        settings: dict[str, Any] = dict(num_workers=self.num_workers, pin_memory=self.pin_memory)
        if self.num_workers:
            settings.update(persistent_workers=self.persistent_workers, prefetch_factor=self.prefetch_factor)
        return settings


def fixed_length_examples(family: str) -> bool:
    """Whether a family's training examples all have one length (the language model's blocks of --block_size): a
    token budget is then a number of them, and an epoch's batches are known in advance."""
    return "block_size" in get_family(family).flags


# torch's DataLoader prefetches this many batches per worker when not told
TORCH_PREFETCH_FACTOR = 2


def decide_data(options: TrainingArguments, data, world_size: int, on_cpu: bool) -> DataPlan:
    """How the run reads its data: the stream's split between the processes, and the loader's settings that were not
    given: pinned memory on an accelerator, persistent workers and torch's prefetch when there are workers (as
    transformers' `Trainer` reads its --dataloader_* options).

    Args:
        options: the run's options.
        data: the run's data (`TrainingTask.load_data`).
        world_size: the processes.
        on_cpu: whether the run trains on the CPU.

    Returns:
        The data plan.
    """
    stream = getattr(data, "stream", None)
    workers = options.dataloader_num_workers
    pin = options.dataloader_pin_memory
    persistent = options.dataloader_persistent_workers
    prefetch = options.dataloader_prefetch_factor
    return DataPlan(
        streaming=stream is not None,
        shuffle_buffer_size=options.shuffle_buffer_size if stream is not None else 0,
        split="" if stream is None else ("shards" if stream.shards % world_size == 0 else "examples"),
        shards=0 if stream is None else stream.shards,
        max_tokens_per_batch=options.max_tokens_per_batch,
        batch_by_tokens=options.max_tokens_per_batch is not None and not fixed_length_examples(options.family),
        num_workers=workers,
        pin_memory=(not on_cpu) if pin is None else bool(pin),
        persistent_workers=workers > 0 if persistent is None else bool(persistent),
        prefetch_factor=(prefetch or TORCH_PREFETCH_FACTOR) if workers > 0 else None,
        eval_from=getattr(data, "eval_from", ""),
    )


@dataclass(frozen=True)
class RunPlan:
    """What a run does, decided once (`build_plan`). Every option resolved (the given ones, the defaults, and what the
    plan chose for the rest) is in the field of its group (`PLAN_GROUPS`): the loop, the tasks and the outputs read
    `plan.optimization.seed`, `plan.checkpointing.output_dir`, ..., never the arguments.

    Attributes:
        family: the family the run trains.
        model_options: the model trained (`options.ModelArguments`).
        data_options: the data (`options.DataArguments`).
        loading: how the data is read and batched (`options.LoaderArguments`; `data` holds what the plan made of it).
        optimization: the optimiser, the schedule, the batches and the run's length (`options.OptimizationArguments`).
        recipe: the image recipe's settings (`options.RecipeArguments`).
        parallelism: precision, devices and sharding (`options.ParallelismArguments`; `launch` holds the decisions).
        checkpointing: the output folder, the training states and resuming (`options.CheckpointArguments`).
        logging: the training log, the evaluations and the trackers (`options.LoggingArguments`).
        lora: the LoRA adapter (`options.LoraArguments`).
        hub: the model card and the push (`options.HubArguments`).
        chosen_by: option -> who chose its value ("--max_steps", a run file's name, "the vit family", "--recipe
            none", "the default", ...).
        given: the options whose value is the user's (as the plan chose `chosen_by`): the others are listed with
            who chose them.
        launch: the decisions the Accelerator is built from.
        world_size: the processes of the run.
        train_examples: the training examples of an epoch (before the loaders drop an incomplete batch); for a stream,
            those of the sample read from its head.
        updates_per_epoch: the optimizer updates of an epoch; None when not known before the data is read (a stream,
            batches by a token budget).
        total_steps: the updates of the run.
        optimizer: the optimizer to build.
        schedule: the learning-rate schedule to build.
        model_config: the run's model config (`TrainingTask.model_config`: saved or fresh, the data's fields,
            --config_overrides, then the fields the run sets), which `TrainingTask.build` instantiates; None for a
            family that builds it with its processor (a tokenizer trained on the data).
        config_fields_from: config field the run sets (e.g. the recipe's stochastic depth) -> who chose it.
        resume: the training state to resume from, if any.
        processor_from: where the processor comes from when the plan chose it (the resumed checkpoint's).
        data: how the training data is read.
    """

    family: str
    model_options: ModelArguments
    data_options: DataArguments
    loading: LoaderArguments
    optimization: OptimizationArguments
    recipe: RecipeArguments
    parallelism: ParallelismArguments
    checkpointing: CheckpointArguments
    logging: LoggingArguments
    lora: LoraArguments
    hub: HubArguments
    chosen_by: Mapping[str, str]
    given: frozenset[str]
    launch: Launch
    world_size: int
    train_examples: int
    updates_per_epoch: int | None
    total_steps: int
    optimizer: OptimizerSpec
    schedule: ScheduleSpec
    model_config: Any = None
    config_fields_from: Mapping[str, str] = field(default_factory=dict)
    resume: ResumePoint | None = None
    processor_from: str | None = None
    data: DataPlan = field(default_factory=DataPlan)

    def option(self, name: str) -> Any:
        """The resolved value of option `name`, from its group.

        Args:
            name: an option (a field of one of `options.OPTION_GROUPS`).

        Returns:
            Its value.
        """
        return getattr(getattr(self, _GROUP_OF[name]), name)

    def options_dict(self) -> dict[str, Any]:
        """The resolved options as one plain dict, as `TrainingArguments.to_dict` gives them (the family, then every
        option group by group): a training state's `args`, a tracker's config.

        Returns:
            Option name -> value, and the family.
        """
        values: dict[str, Any] = {"family": self.family}
        for name, group in PLAN_GROUPS.items():
            values.update({flag.name: getattr(getattr(self, name), flag.name) for flag in group_fields(group)})
        return values

    @property
    def config_fields(self) -> dict[str, Any]:
        """The model config fields the run sets -> value."""
        return {name: getattr(self.model_config, name) for name in self.config_fields_from}

    @property
    def request(self) -> ParallelismRequest:
        """The sharding asked for."""
        return self.launch.request

    @property
    def on_cpu(self) -> bool:
        """Whether the run trains on the CPU."""
        return self.launch.on_cpu

    @property
    def sharded(self) -> bool:
        """Whether FSDP or DeepSpeed shards the run."""
        return self.launch.sharded

    @property
    def weights_from_main_process(self) -> bool:
        """fsdp_cpu_ram_efficient_loading with pretrained weights: only the main process reads them (under FSDP2)."""
        return bool(self.request.fsdp and self.request.ram_efficient_loading and self.model_options.model_name_or_path)

    @property
    def num_epochs(self) -> int | None:
        """The passes over the training data the loop makes (the last one may stop early); None when an epoch's
        length is not known in advance (the loop then runs epochs until its last update)."""
        return None if self.updates_per_epoch is None else math.ceil(self.total_steps / self.updates_per_epoch)

    @property
    def epochs(self) -> float | None:
        """The run's length in passes over the training data; None when an epoch's length is not known."""
        return None if self.updates_per_epoch is None else self.total_steps / self.updates_per_epoch

    @property
    def global_batch(self) -> int:
        """Examples per update, all processes and micro-batches."""
        optimization = self.optimization
        return optimization.per_device_train_batch_size * self.world_size * optimization.gradient_accumulation_steps

    @property
    def processor_location(self) -> str | None:
        """Where the processor is read from: --tokenizer_name, else the resumed checkpoint's (the plan's choice)."""
        return self.model_options.tokenizer_name or self.processor_from

    def given_by_user(self, name: str) -> bool:
        """Whether the user gave option `name`'s value (on the command line, from Python, or in a run file whose value
        is not the one the plan would choose anyway).

        Args:
            name: an option.

        Returns:
            True when the value is the user's.
        """
        return name in self.given


def _sharded(request: ParallelismRequest) -> bool:
    return bool(request.fsdp or request.deepspeed_from)


def trains_on_cpu(options: TrainingArguments) -> bool:
    """Whether the run trains on the CPU: --use_cpu, or no accelerator device here.

    Args:
        options: the run's options.

    Returns:
        True on the CPU.
    """
    return options.use_cpu or not torch.accelerator.is_available()


def _from_run_file(options: TrainingArguments, name: str) -> bool:
    return bool(options.run_file) and options.given.get(name) == Path(options.run_file).name


# ------------------------------------------------------------------------------------------------------ the launch
def decide_launch(options: TrainingArguments, task) -> Launch:
    """The decisions made before the Accelerator is built: sharding, device, precision, activation checkpointing.

    Args:
        options: the run's options.
        task: the family's `TrainingTask` (a recipe's precision asks it about the model's feature maps).

    Returns:
        The launch.
    """
    request = parallelism_request(options.fsdp, options.fsdp_options)
    on_cpu = trains_on_cpu(options)
    precision, precision_from, precision_given = _decide_precision(options, task, request, on_cpu)
    checkpointing_from, checkpointing_given = None, False
    asked_by = None
    if request.activation_checkpointing:
        # the model's own checkpointing (one recomputation per layer, the RNG state kept), not the plugin's wrapper
        asked_by = "--fsdp_config" if "activation_checkpointing" in request.fsdp_options else "the accelerate config"
    if options.activation_checkpointing and not (asked_by and _from_run_file(options, "activation_checkpointing")):
        checkpointing_from, checkpointing_given = options.chosen_by["activation_checkpointing"], True
    elif asked_by:
        checkpointing_from = asked_by
    return Launch(request, on_cpu, precision, precision_from, checkpointing_from is not None, checkpointing_from,
                  precision_given, checkpointing_given)  # fmt: skip


def _decide_precision(options: TrainingArguments, task, request: ParallelismRequest, on_cpu: bool):
    """(the precision trained in, who chose it, whether it is the user's): --mixed_precision, else the launcher's,
    else an earlier run of this process's (Accelerate's state is process-wide and refuses another precision once set),
    else --recipe's, else Accelerate's default. A run file's value that is the one the plan would choose anyway is that
    choice's."""
    given = options.mixed_precision
    if given is not None and not _from_run_file(options, "mixed_precision"):
        return given, options.chosen_by["mixed_precision"], True
    precision, source = _precision_choice(options, task, request, on_cpu)
    if given is None or given == precision:
        return precision, source, False
    return given, options.given["mixed_precision"], True


# who chose a precision that Accelerate holds without being told (`Launch.mixed_precision`)
_LAUNCHER, _EARLIER_RUN = "the launcher", "an earlier run in this process"
_ACCELERATE_PRECISION = (_LAUNCHER, _EARLIER_RUN, THE_DEFAULT)


def _precision_choice(options: TrainingArguments, task, request: ParallelismRequest, on_cpu: bool) -> tuple[str, str]:
    from accelerate.state import AcceleratorState, is_initialized

    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if launcher:
        return launcher, _LAUNCHER
    if is_initialized():
        return AcceleratorState().mixed_precision, _EARLIER_RUN
    device = "cpu" if on_cpu else torch.accelerator.current_accelerator().type
    sharded = _sharded(request)
    value = recipe_mixed_precision(options.recipe, device, sharded=sharded)
    chosen_by = f"--recipe {options.recipe}"
    if value == "bf16" and device == "cpu":  # unless the model's feature maps are too small for bf16's backward
        side = task.smallest_feature_map(options)
        if recipe_mixed_precision(options.recipe, device, sharded=sharded, smallest_feature_map=side) == "no":
            value = "no"
            chosen_by += (
                f", not bf16: the {options.model_type}'s feature maps shrink to {side} x {side}, where torch's bf16 "
                "backward on the CPU gives non-finite gradients"
            )
    if value:
        return value, chosen_by
    return "no", THE_DEFAULT


# ------------------------------------------------------------------------------------------------------ the resume
def resume_point(options: TrainingArguments, task) -> tuple[ResumePoint | None, str | None]:
    """The checkpoint to resume (--resume_from_checkpoint; refused when it belongs to another family) and, for a
    family that trains its processor, that checkpoint's processor unless one was given.

    Args:
        options: the run's options.
        task: the family's `TrainingTask`.

    Returns:
        (the resume point or None, the processor's folder or None).

    Raises:
        ValueError: a checkpoint of another family, or one saved when --learning_rate was the factor of the paper's
            schedule (its saved schedule would train at the factor).
    """
    if not options.resume_from_checkpoint:
        return None, None
    path = resolve_checkpoint(options.resume_from_checkpoint, options.output_dir)
    state = read_training_state(path)
    if state["family"] != task.name:
        check_same_model(state, task.name, {}, path)
    scheduler = state.get("args", {}).get("lr_scheduler_type")
    if "schedule" not in state and (scheduler == "noam" or (scheduler == "auto" and task.spec.lr_scheduler == "noam")):
        raise ValueError(
            f"Checkpoint {str(path)!r} was saved when the {task.name} family's --learning_rate was a factor of the "
            "paper's schedule; it is now the peak learning rate, and the saved schedule would train at the factor: "
            "resume it with the release that saved it, or start the run again."
        )
    processor_from = None
    if task.trains_its_processor and not (options.tokenizer_name or options.model_name_or_path):
        if (path / PROCESSOR_DIR).is_dir():
            processor_from = str(path / PROCESSOR_DIR)
    return ResumePoint(path, state), processor_from


# -------------------------------------------------------------------------------------------------------- the plan
def build_plan(
    options: TrainingArguments,
    task,
    launch: Launch,
    data,
    world_size: int,
    resume: ResumePoint | None = None,
    processor_from: str | None = None,
) -> RunPlan:
    """Resolve every option of a run, once, and plan its length, optimizer, schedule and model fields.

    Args:
        options: the run's options.
        task: the family's `TrainingTask`.
        launch: `decide_launch(options, task)`.
        data: the run's data (`TrainingTask.load_data`).
        world_size: the processes of the run.
        resume: the training state to resume, if any (`resume_point`).
        processor_from: the resumed checkpoint's processor, if the plan takes it (`resume_point`).

    Returns:
        The frozen plan.

    Raises:
        ValueError: a value that does not fit the run (e.g. fewer training examples than one global batch).
    """
    record = task.spec
    flags = [flag.name for flag in flag_fields(options.family)]
    values: dict[str, Any] = {name: getattr(options, name) for name in flags}
    natural = default_choices(options)  # what each option would be if it were not given
    chosen: dict[str, str] = {}
    users: dict[str, bool] = {}  # option -> whether its value is the user's

    own_defaults = {flag.name: option_default(flag) for flag in flag_fields(options.family)}

    def settle(name: str, value: Any, source: str) -> None:
        """Option `name` with the plan's choice (`value`, chosen by `source`) where it has none (None given for an
        option whose own default is a value means that value: e.g. no limit); where it has one, who chose it: the
        user (a run file's value equal to the plan's choice is the plan's), or for a value the arguments hold without
        its being given, who the arguments recorded (`TrainingArguments.chosen_by`: its default's chooser)."""
        current = values[name]
        label = options.given.get(name)
        if current is None and (label is None or own_defaults[name] is None):
            values[name], chosen[name], users[name] = value, source, False
        elif label is None:  # "--name" for a value set from Python without a label (`dataclasses.replace`)
            chosen[name] = options.chosen_by[name]
            users[name] = chosen[name] == f"--{name}"
        elif _from_run_file(options, name) and current == value:
            chosen[name], users[name] = source, False
        else:
            chosen[name], users[name] = label, True

    for name in flags:
        settle(name, *natural[name])

    # a token budget of fixed-length sequences (the language model's blocks) is a number of sequences
    budget = values.get("max_tokens_per_batch")
    if budget is not None and fixed_length_examples(options.family):
        if budget < values["block_size"]:
            raise ValueError(f"--max_tokens_per_batch {budget} holds no block of --block_size {values['block_size']} "
                             "tokens.")  # fmt: skip
        values["per_device_train_batch_size"] = budget // values["block_size"]
        chosen["per_device_train_batch_size"], users["per_device_train_batch_size"] = "--max_tokens_per_batch", False
    elif budget is not None:
        longest = max(values.get("max_source_length", 0), values.get("max_target_length", 0))
        if budget < longest:
            raise ValueError(
                f"--max_tokens_per_batch {budget} is smaller than the longest example can be (--max_source_length / "
                f"--max_target_length {longest}): every example must fit in a batch alone."
            )
    stream = getattr(data, "stream", None)

    # the run's length
    batch, accumulation = values["per_device_train_batch_size"], values["gradient_accumulation_steps"]
    examples = len(data.raw["train"])
    if stream is None and examples < batch * world_size:
        raise ValueError(
            f"The training set has {examples} examples, fewer than one global batch ({batch} x {world_size} "
            "processes)."
        )
    # an epoch of a stream, or of batches cut by a token budget, is as long as the data makes it
    known_epochs = stream is None and not (budget is not None and not fixed_length_examples(options.family))
    per_epoch = updates_per_epoch(examples, batch, world_size, accumulation) if known_epochs else None
    if values["max_steps"] is None and values["num_train_epochs"] is None:
        raise ValueError("--num_train_epochs must be a number > 0 when --max_steps is not given.")
    total_steps = values["max_steps"] or math.ceil(values["num_train_epochs"] * per_epoch)
    # the recipe scales with the run's share of DeiT's epochs: a stream's run counts as large data, DeiT's whole budget
    epochs = total_steps / per_epoch if per_epoch else DEIT_EPOCHS

    # the model's config, built once (None where the task builds it with its processor): the recipe reads it
    config = task.model_config(options, data)
    # the recipe's values for this data and run
    if "recipe" in record.flags:
        context = task.recipe_context(options, data, config, batch * world_size * accumulation, total_steps,
                                      epochs)  # fmt: skip
        for name, value in run_recipe_values(values["recipe"], context).items():
            if name in values:
                settle(name, value, f"--recipe {values['recipe']}")
    # the launch's
    values["mixed_precision"], chosen["mixed_precision"] = launch.precision, launch.precision_from
    users["mixed_precision"] = launch.precision_given
    if launch.checkpointing_from is not None:
        values["activation_checkpointing"], chosen["activation_checkpointing"] = True, launch.checkpointing_from
        users["activation_checkpointing"] = launch.checkpointing_given
    if values["lr_scheduler_type"] == "auto":  # given as 'auto': the family's
        values["lr_scheduler_type"], chosen["lr_scheduler_type"] = natural["lr_scheduler_type"]
        users["lr_scheduler_type"] = False

    resolved = dataclasses.replace(options, **values)  # checks the values
    required = {name for name in REQUIRED_VALUES if name in values}
    required -= {"warmup_ratio"} if resolved.warmup_steps is not None else set()
    check_values(resolved.to_dict(), required=required)
    warmup = (
        min(resolved.warmup_steps, total_steps)
        if resolved.warmup_steps is not None
        else math.ceil(resolved.warmup_ratio * total_steps)
    )
    optimizer = OptimizerSpec(
        task.optimizer_name,
        resolved.learning_rate,
        (resolved.adam_beta1, resolved.adam_beta2),
        resolved.adam_epsilon,
        resolved.weight_decay,
    )
    name = resolved.lr_scheduler_type
    schedule = ScheduleSpec(name, SCHEDULE_FUNCTIONS[name], warmup, total_steps, resolved.learning_rate)
    fields = task.recipe_config_fields(resolved, config, epochs) if config is not None else {}
    for key, (value, _) in fields.items():  # as `from_pretrained(location, key=value)` sets them
        setattr(config, key, value)
    return RunPlan(
        family=resolved.family,
        **{name: resolved.group(group) for name, group in PLAN_GROUPS.items()},
        chosen_by=chosen,
        given=frozenset(name for name, yours in users.items() if yours),
        launch=launch,
        world_size=world_size,
        train_examples=examples,
        updates_per_epoch=per_epoch,
        total_steps=total_steps,
        optimizer=optimizer,
        schedule=schedule,
        model_config=config,
        config_fields_from={key: source for key, (_, source) in fields.items()},
        resume=resume,
        processor_from=processor_from,
        data=decide_data(resolved, data, world_size, launch.on_cpu),
    )


def default_choices(options: TrainingArguments) -> dict[str, tuple[Any, str]]:
    """What the plan chooses for each option that is not given, before the data is read.

    The default the arguments were made with (`TrainingArguments.defaults`: the family's, else the option's own); the
    epochs of a built-in data set; the schedule --lr_scheduler_type auto names. The recipe's settings are left None
    here: `build_plan` decides them once the run's length is known.

    Args:
        options: the run's options (their family and data set).

    Returns:
        Option -> (value, who chose it).
    """
    record = get_family(options.family)
    choices = {flag.name: options.defaults[flag.name] for flag in flag_fields(options.family)}  # given when made
    if choices.get("num_train_epochs", (0,))[0] is None and record.datasets:  # the data set's own
        epochs = record.datasets[options.dataset].default_epochs
        choices["num_train_epochs"] = (epochs, f"--dataset {options.dataset}")
    choices["lr_scheduler_type"] = (record.lr_scheduler, f"the {record.id} family")
    return choices


def preview_plan(options: TrainingArguments, task, data=None) -> RunPlan:
    """The plan of a run without running it (no Accelerator, no lock on the output folder): what --print_config
    prints. The data is loaded, as the run would, and the processes counted from the launcher's WORLD_SIZE.

    Args:
        options: the run's options.
        task: the family's `TrainingTask` (`tasks.get_task(options.family)`).
        data: the run's data, if loaded already (`task.load_data(options)`).

    Returns:
        The plan the run would make.
    """
    launch = decide_launch(options, task)
    resume, processor_from = resume_point(options, task)
    data = task.load_data(options) if data is None else data
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return build_plan(options, task, launch, data, world, resume=resume, processor_from=processor_from)


# ------------------------------------------------------------------------------------------------ the first lines
def describe(plan: RunPlan, accelerator, weights_from_main: bool = False) -> list[str]:
    """The first lines of a run: what is spread over what, sharding, precision, global batch, the schedule and who
    chose what the user did not give (`sharding.describe_parallelism` gives the first ones from the Accelerator the
    plan built; `weights_from_main`: the main process read the pretrained weights and sent them on).

    Args:
        plan: the run's plan.
        accelerator: the run's Accelerator.
        weights_from_main: whether the main process read the pretrained weights and sent them on.

    Returns:
        The lines.
    """
    from .sharding import describe_parallelism

    optimization, launch = plan.optimization, plan.launch
    lines = describe_parallelism(accelerator, weights_from_main)
    world = accelerator.num_processes
    if launch.precision_from not in ("--mixed_precision", "the launcher", THE_DEFAULT) and not plan.given_by_user(
        "mixed_precision"
    ):  # the plan chose it: say why
        lines[-1] += f" (chosen by {launch.precision_from})"
    checkpointing = "off" if launch.checkpointing_from is None else "on"
    if launch.checkpointing_from is not None and not plan.given_by_user("activation_checkpointing"):
        checkpointing += f" (asked for by {launch.checkpointing_from})"
    processes = f"{world} process{'es' if world > 1 else ''}"
    accumulation = optimization.gradient_accumulation_steps
    steps = f"{accumulation} accumulation step{'s' if accumulation > 1 else ''}"
    if plan.data.batch_by_tokens:  # batches of any number of examples
        lines.append(
            f"Global batch: up to {plan.data.max_tokens_per_batch * world * accumulation} "
            f"tokens = {plan.data.max_tokens_per_batch} per process (source and target, padded: fairseq's "
            f"--max-tokens) x {processes} x {steps}; activation checkpointing: {checkpointing}"
        )
    else:
        lines.append(
            f"Global batch: {optimization.per_device_train_batch_size * world * accumulation} = "
            f"{optimization.per_device_train_batch_size} per process x {processes} x {steps}; activation "
            f"checkpointing: {checkpointing}"
        )
    schedule = plan.schedule
    length = (
        f"{plan.epochs:.3g} epochs of {plan.updates_per_epoch}"
        if plan.updates_per_epoch is not None
        else "epochs as long as the data makes them"
    )
    lines.append(
        f"Schedule: {schedule.name} (transformers' {schedule.function}), peak learning rate {schedule.peak:g} after "
        f"{schedule.warmup_steps} warm-up update{'s' if schedule.warmup_steps != 1 else ''}, {plan.total_steps} "
        f"updates ({length})"
    )
    lines += data_lines(plan)
    lines += chosen_lines(plan)
    if plan.processor_from:
        lines.append(f"Processor: the one saved with the checkpoint resumed ({plan.processor_from})")
    if accelerator.device.type == "cpu":
        lines.append(cpu_kernels_line())
    return lines


def cpu_kernels_line() -> str:
    """The run's line on the CPU kernels: the instruction set in use and its source (`cpu_isa.describe_isa`).

    Raises:
        UsageError: `HF_VIT_PLUS_CPU_ISA` names no level, or one the CPU cannot meet.
    """
    from ..errors import UsageError
    from ..models.cpu_isa import describe_isa

    try:
        return f"CPU kernels: instruction set {describe_isa()}"
    except ValueError as error:
        raise UsageError(str(error)) from None


def data_lines(plan: RunPlan) -> list[str]:
    """The lines of a run that say how it reads its data: a stream (its split between the processes, its shuffle
    buffer), where the evaluation examples come from, and the loader's workers when there are some.

    Args:
        plan: the run's plan.

    Returns:
        The lines (none for data read whole by the main process, evaluated on its own split).
    """
    data, world = plan.data, plan.world_size
    lines = []
    if data.streaming:
        by = "whole shards" if data.split == "shards" else f"every {world}-th example"
        split = "one process" if world == 1 else f"split between {world} processes by {by}"
        shuffle = (
            f"shuffled in a buffer of {data.shuffle_buffer_size} examples (seed {plan.optimization.seed}, again each "
            "epoch)"
            if data.shuffle_buffer_size
            else "in its own order"
        )
        lines.append(f"Data: a stream of {data.shards} shard{'s' if data.shards != 1 else ''}, {split}, {shuffle}")
    if data.eval_from:
        lines.append(f"Evaluation: {data.eval_from}")
    if data.num_workers:
        lines.append(
            f"Loader: {data.num_workers} worker process{'es' if data.num_workers > 1 else ''} (prefetch "
            f"{data.prefetch_factor}, persistent: {'yes' if data.persistent_workers else 'no'}), pinned memory: "
            f"{'yes' if data.pin_memory else 'no'}"
        )
    return lines


def chosen_lines(plan: RunPlan) -> list[str]:
    """One line per chooser of values the user did not give, besides the options' own defaults and the precision
    and checkpointing the lines before state: "Chosen by --recipe none: learning_rate ..., warmup_ratio ...".

    Args:
        plan: the run's plan.

    Returns:
        The lines, choosers in the order of their first option.
    """
    shown_elsewhere = {"mixed_precision", "activation_checkpointing"}
    by_chooser: dict[str, list[str]] = {}
    for name, chooser in plan.chosen_by.items():
        if chooser == THE_DEFAULT or name in shown_elsewhere or plan.given_by_user(name):
            continue
        by_chooser.setdefault(chooser, []).append(f"{name} {_shown(plan.option(name))}")
    for name, chooser in plan.config_fields_from.items():
        by_chooser.setdefault(chooser, []).append(f"config {name} {_shown(plan.config_fields[name])}")
    return [f"Chosen by {chooser}: {', '.join(items)}" for chooser, items in by_chooser.items()]


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


__all__ = [
    "DataPlan",
    "Launch",
    "OptimizerSpec",
    "PLAN_GROUPS",
    "ResumePoint",
    "RunPlan",
    "ScheduleSpec",
    "build_plan",
    "chosen_lines",
    "data_lines",
    "decide_data",
    "decide_launch",
    "default_choices",
    "describe",
    "preview_plan",
    "resume_point",
    "trains_on_cpu",
]
