"""The set-up of a training run, from its plan (`plan.py`): the Accelerator built from the launch
(`create_accelerator`: FSDP, DeepSpeed, the process group, the trackers), then the model and processor, the
loaders with the plan's settings, the optimiser and the schedule, all prepared (`prepare_run`): the `Run` the
epochs of `loop.py` read.

A data set read whole goes through a DataLoader that Accelerate prepares (its seedable sampler, its split between the
processes, and `skip_first_batches` on resume); a stream, batches cut by a token budget and images read from files go
through a `data.pipeline.ResumableLoader`. Every loader the run builds, training and evaluation, takes the plan's
loader settings (`DataPlan.loader_settings`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs, ProjectConfiguration
from torch.utils.data import DataLoader

from ..data.pipeline import IndexSource, ResumableLoader, StreamSource
from ..errors import UsageError
from ..models.compat import enable_activation_checkpointing
from .args import TrainingArguments
from .budget import TrainingClock, follow_the_clock
from .checkpoints import check_same_model, model_fingerprint
from .ema import ModelEma
from .plan import Launch, RunPlan
from .sharding import (
    WeightsFromMainProcess,
    deepspeed_plugin,
    fsdp_plugin,
    honour,
    is_zero3,
    keep_environment,
    prepare_model,
    refuse_before_start,
)
from .tasks import TrainingData, TrainingTask, weights_from_main_process
from .tasks.base import UnitBatches


@dataclass
class Run:
    """What the epochs need, built once by `prepare_run` (model, optimiser, scheduler and loaders prepared)."""

    accelerator: Accelerator
    plan: RunPlan  # the run's decisions (`plan.py`): all the loop reads of the run's options, group by group
    family: TrainingTask
    data: TrainingData
    model: Any
    processor: Any  # image processor or tokenizer saved with the model; None when the model needs none (image-lm)
    optimizer: Any
    scheduler: Any
    train_dataloader: Any
    eval_dataloader: Any
    fingerprint: dict  # `model_fingerprint` of the model's config, recorded in each training state
    extras: dict = field(default_factory=dict)  # what the family's loss needs besides the model (a teacher)
    ema: ModelEma | None = None  # the average of the weights (--ema_decay): evaluated and saved as the model
    clock: TrainingClock = field(default_factory=TrainingClock)  # training seconds; --max_train_minutes's budget
    weights_from_main: bool = False  # cpu_ram_efficient_loading: the main process read the weights, sent them on

    @property
    def total_steps(self) -> int:
        return self.plan.total_steps

    @property
    def num_epochs(self) -> int | None:
        return self.plan.num_epochs

    @property
    def batches_per_epoch(self) -> int | None:
        """The training batches of an epoch per process; None when not known in advance (a stream, token budgets)."""
        loader = self.train_dataloader
        if isinstance(loader, ResumableLoader):
            return loader.batches_per_epoch
        return len(loader)

    @property
    def output_dir(self) -> Path:
        return Path(self.plan.checkpointing.output_dir)


def create_accelerator(args: TrainingArguments, launch: Launch) -> Accelerator:
    """The run's Accelerator, doing what the launch says (FSDP on CPU too), or a `UsageError` naming what cannot be
    honoured (`sharding.refuse_before_start`, `sharding.honour`).

    Args:
        args: the run's options.
        launch: `plan.decide_launch(args, task)`.

    Returns:
        The Accelerator.
    """
    request, on_cpu = launch.request, launch.on_cpu
    output_dir = Path(args.output_dir)
    # Without an accelerator device, say so: then `accelerate launch --multi_gpu` / torchrun processes join one gloo
    # group on CPU instead of each training alone.
    refuse_before_start(request, on_cpu)
    plugin = fsdp_plugin(request)
    zero = deepspeed_plugin(request, args, on_cpu)
    # --ddp_timeout: how long a collective operation waits for a process that stopped answering
    group = {"timeout": timedelta(seconds=args.ddp_timeout)}
    if zero is not None and on_cpu:
        # DeepSpeed on CPU processes: not Accelerator(cpu=True), which sets up DDP instead (so does a launcher's
        # use_cpu), but DeepSpeed's CPU accelerator over gloo
        group["backend"] = "gloo"
    handlers = [InitProcessGroupKwargs(**group)]
    with keep_environment("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_CPU"):
        if zero is not None:
            os.environ.pop("ACCELERATE_USE_CPU", None)
        accelerator = Accelerator(
            cpu=on_cpu and zero is None,
            fsdp_plugin=plugin,
            deepspeed_plugin=zero,
            kwargs_handlers=handlers,
            mixed_precision=launch.mixed_precision,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            log_with=tracker_names(args.report_to),
            project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
            # Data order depends on (seed, epoch) only: the same on every process, and again after a resume.
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed),
            # The schedule counts optimiser updates, whatever the number of processes (see `training_step`).
            step_scheduler_with_optimizer=False,
        )
    honour(accelerator, request, plugin)
    return accelerator


def prepare_run(
    accelerator: Accelerator,
    plan: RunPlan,
    family: TrainingTask,
    data: TrainingData,
) -> Run:
    """Model and processor (on the main process first, so that caches are written once), then the loaders,
    optimiser and schedule of the plan, all through `accelerator.prepare`.

    Args:
        accelerator: the run's Accelerator.
        plan: the run's plan.
        family: the family's training task.
        data: the run's data (`plan_the_run` gives both).

    Returns:
        The run, ready for its first update.
    """
    resume = plan.resume
    # fsdp_cpu_ram_efficient_loading: only the main process reads the pretrained weights; the others build the model
    # on the meta device and receive their shards (`WeightsFromMainProcess`). A fresh model is built everywhere.
    from_main = accelerator.is_fsdp2 and plan.weights_from_main_process
    with accelerator.main_process_first():
        with weights_from_main_process(from_main and not accelerator.is_main_process):
            model, processor = family.build(plan, data)
        datasets = family.transform(data, processor, model, plan)
        data = dataclasses.replace(data, baselines={**family.measure_baselines(data, datasets), **data.baselines})
    lora = plan.lora
    if lora.lora_r is not None:  # the base frozen, an adapter (and a new head) trained: saved as an adapter folder
        from .lora import add_lora

        model = add_lora(model, plan.family, lora.lora_r, lora.lora_alpha, lora.lora_target_modules,
                         lora.lora_dropout)  # fmt: skip
    fingerprint = model_fingerprint(model.config)
    if resume is not None:
        check_same_model(resume.state, family.name, fingerprint, resume.path)
    if plan.launch.activation_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"{type(model).__name__} does not support --activation_checkpointing.")
        # under FSDP2 the recomputed forward runs inside the unit's gathered parameters: non-reentrant checkpoints
        enable_activation_checkpointing(model, {"use_reentrant": False} if accelerator.is_fsdp2 else None)
    weights = WeightsFromMainProcess(accelerator, model) if from_main else None
    if accelerator.is_fsdp2:
        prepare_model(accelerator, model)  # the units, and the tied weights sharded together: before the optimiser

    unit_recipe = family.unit_batches(data, processor, model, plan)
    optimizer = family.create_optimizer(model, plan)
    if unit_recipe is None:
        loaders = make_dataloaders(plan, datasets, family.collate_fn(processor))
        train_dataloader, eval_dataloader = accelerator.prepare(*loaders)
    else:  # a stream, a token budget, images from files: batches made in the workers, placed on the device here
        train_dataloader = resumable_loader(plan, data, unit_recipe, accelerator)
        eval_dataloader = accelerator.prepare(make_eval_dataloader(plan, datasets, family.collate_fn(processor)))
    # the plan counted the updates from the examples: the loader's batches give the same
    batches = len(train_dataloader) if unit_recipe is None else train_dataloader.batches_per_epoch
    per_epoch = None if batches is None else math.ceil(batches / plan.optimization.gradient_accumulation_steps)
    assert per_epoch == plan.updates_per_epoch, (batches, plan.updates_per_epoch)
    scheduler = family.create_scheduler(optimizer, plan)
    clock = TrainingClock(plan.optimization.max_train_minutes)
    if plan.optimization.max_train_minutes:
        scheduler = follow_the_clock(scheduler, plan.total_steps, clock)
    if weights is not None:  # sharded, then the main process's weights sent to the others
        model, optimizer, scheduler = weights.prepare(model, optimizer, scheduler)
    else:
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if plan.parallelism.torch_compile:
        # In place (`nn.Module.compile`: the module's call is compiled, the module stays itself), after Accelerate's
        # wrapping (its autocast is traced in): the saved model, the training states and the EMA keep the model's
        # own parameter names. (`torch.compile(model)` returns a wrapper whose names start with `_orig_mod.`, and
        # Accelerate's `unwrap_model` keeps it: a model saved that way loads as untrained weights.)
        model.compile()
    ema = None
    if plan.recipe.ema_decay:
        if accelerator.is_fsdp2 or is_zero3(accelerator):
            raise UsageError("--ema_decay averages whole weights: it cannot be combined with FSDP or ZeRO-3 sharding.")
        ema = ModelEma(accelerator.unwrap_model(model), plan.recipe.ema_decay)
        accelerator.register_for_checkpointing(ema)  # saved with each training state, restored on resume
    return Run(
        accelerator=accelerator,
        plan=plan,
        family=family,
        data=data,
        model=model,
        processor=processor,
        optimizer=optimizer,
        scheduler=scheduler,
        train_dataloader=train_dataloader,
        eval_dataloader=eval_dataloader,
        fingerprint=fingerprint,
        extras=family.extras(plan, model, accelerator),
        ema=ema,
        clock=clock,
        weights_from_main=weights is not None,
    )


def make_dataloaders(plan: RunPlan, datasets, collate) -> tuple[DataLoader, DataLoader]:
    """The training loader (shuffled with the run's seed, full batches only: `plan.build_plan` checked that there is
    one global batch) and the evaluation loader, both with the plan's loader settings."""
    optimization = plan.optimization
    train_dataloader = DataLoader(
        datasets["train"],
        batch_size=optimization.per_device_train_batch_size,
        shuffle=True,
        drop_last=True,  # every process and every update sees full batches: N processes == one with N x the batch
        collate_fn=collate,
        generator=torch.Generator().manual_seed(optimization.seed),
        **plan.data.loader_settings,
    )
    return train_dataloader, make_eval_dataloader(plan, datasets, collate)


def make_eval_dataloader(plan: RunPlan, datasets, collate) -> DataLoader:
    """The evaluation loader: the validation split in order, every example once, with the plan's loader settings
    (as transformers' `Trainer` gives its evaluation loaders its --dataloader_* options). With workers, their seed
    comes from a generator of its own (persistent workers draw it once; `evaluate` draws from the global random state
    what a loader without one draws each pass)."""
    settings = plan.data.loader_settings
    if settings["num_workers"]:
        settings["generator"] = torch.Generator().manual_seed(plan.optimization.seed)
    return DataLoader(
        datasets["validation"], batch_size=plan.optimization.per_device_eval_batch_size, collate_fn=collate, **settings
    )


def resumable_loader(
    plan: RunPlan, data: TrainingData, recipe: UnitBatches, accelerator: Accelerator
) -> ResumableLoader:
    """The training loader of a stream, a token budget or images from files (`data.pipeline.ResumableLoader`): this
    process's part of the data (`StreamSource` of the stream, or `IndexSource` of the training split with its images
    undecoded) made into batches unit by unit, with the plan's loader settings.

    Args:
        plan: the run's plan.
        data: the run's data.
        recipe: how the family makes the batches (`TrainingTask.unit_batches`).
        accelerator: the run's Accelerator (this process's rank, the processes).

    Returns:
        The loader.
    """
    from ..data.image_files import undecoded

    seed, settings = plan.optimization.seed, plan.data
    rank, world = accelerator.process_index, accelerator.num_processes
    if data.stream is not None:
        source = StreamSource(data.stream.dataset, seed=seed, buffer_size=settings.shuffle_buffer_size,
                              rank=rank, world_size=world, unit_size=recipe.unit_size, drop_last=recipe.whole_batches,
                              held_out=data.stream.held_out)  # fmt: skip
        batches = None
    else:
        source = IndexSource(undecoded(data.raw["train"]), seed=seed, rank=rank, world_size=world,
                             unit_size=recipe.unit_size, whole_batches=recipe.whole_batches)  # fmt: skip
        batches = source.units_per_epoch if recipe.whole_batches else None
    return ResumableLoader(source, recipe.make, seed=seed, batches_per_epoch=batches,
                           **settings.loader_settings)  # fmt: skip


def tracker_names(report_to: str | None):
    if report_to is None or report_to.lower() == "none":
        return None
    if report_to == "all":
        return "all"
    return [name.strip() for name in report_to.split(",") if name.strip()]


__all__ = [
    "Run",
    "create_accelerator",
    "make_dataloaders",
    "make_eval_dataloader",
    "prepare_run",
    "resumable_loader",
    "tracker_names",
]
