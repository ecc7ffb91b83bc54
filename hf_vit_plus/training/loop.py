"""The one training loop of every family, on Accelerate: train -> epochs -> steps -> evaluate.

The same code runs on one CPU, on N processes (`accelerate launch --multi_gpu --num_processes N`, gloo on CPU,
NCCL on GPUs), on several machines, and sharded with FSDP2 (`--fsdp` or an accelerate config), on GPUs and on CPU,
which Accelerate applies in `prepare` (`sharding.py`: the plugin, driving it on CPU, the units, what is refused). The
first lines of a run say what is in effect (`plan.describe`).

Order (as in Accelerate's examples): Accelerator -> set_seed -> data under `main_process_first` -> model ->
optimiser groups -> `prepare` -> `accumulate` -> `gather_for_metrics` -> save on the main process with
`unwrap_model(...).save_pretrained`. `train` reads as these steps: `decide_launch` (what the Accelerator is built
from, `plan.py`), `create_accelerator` (`setup.py`), the output folder's lock, `plan_the_run` (the checkpoint to
resume, the data, then `build_plan`: every value of the run decided once, into a frozen `RunPlan`; its options are
written to OUTPUT_DIR/run_config.yaml), `prepare_run` (`setup.py`: model, loaders, optimiser, schedule: a `Run`),
`restore_progress`,
`run_epochs` (`train_epoch` -> `training_step` and `after_update`; `end_epoch`), then `finish` (final evaluation and
`outputs.save_final`) or `stop_early`. From the plan on, the loop reads the plan only (its resolved options in their
groups: `plan.optimization`, `plan.checkpointing`, `plan.logging`, ...), never the arguments it was given. What
differs between the families is in `tasks/`; the checkpoints on disk are `checkpoints.py`'s, the model folder, card
and push at the end `outputs.py`'s.

Data order depends only on (seed, epoch), so a run resumed from a checkpoint sees the same batches as an
uninterrupted one. A data set read whole goes through a DataLoader that Accelerate prepares (its seedable sampler,
its split between the processes, and `skip_first_batches` on resume); a stream, batches cut by a token budget and
images read from files go through a `data.pipeline.ResumableLoader` (each process reads its own part; batches made
unit by unit in the loader's workers, in an order independent of their number; its position, per process, saved in
each training state and restored on resume). Where the epoch's length is not known in advance (a stream, a token
budget), it ends for every process when one of them runs out of batches (an all-reduce per micro-batch), and the run
goes from epoch to epoch until its last update.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import (
    broadcast_object_list,
    gather_object,
    send_to_device,
    set_seed,
)

from ..data.pipeline import ResumableLoader
from ..errors import UsageError, user_errors
from ..utils.logging import tqdm
from .args import TrainingArguments
from .checkpoints import (
    STATE_FORMAT,
    check_same_layout,
    save_checkpoint,
)
from .disk import UNLIMITED_CHECKPOINTS_CHECKED, checkpoint_bytes, tensor_bytes, warn_if_short_of_space
from .learning import DivergenceGuard, LearningCheck, check_learning
from .options import OptimizationArguments
from .outputs import check_push_target, prefixed_metrics, save_final
from .peers import peers_answer
from .plan import Launch, ResumePoint, RunPlan, build_plan, decide_launch, describe, resume_point
from .run_file import write_run_config
from .run_lock import output_dir_lock
from .setup import (
    Run,
    create_accelerator,
    prepare_run,
    tracker_names,
)
from .sharding import (
    CHECKPOINT_LAYOUTS,
    DEEPSPEED_STATE_REFUSAL,
    checkpoint_layout,
    is_zero3,
    local_share,
    reload_sharded_optimizer,
    trained_model,
    units,
)
from .tasks import TrainingData, TrainingTask, get_task


class _LocalMainProcessLogger(logging.LoggerAdapter):
    """Logs on each machine's main process only, as `accelerator.print` printed (accelerate's own adapter prefixes
    every line with "[RANK n]")."""

    def log(self, level, msg, *args, **kwargs) -> None:
        if PartialState().is_local_main_process:
            super().log(level, msg, *args, **kwargs)


# The run's report: INFO lines, shown by `hf-vit-plus train` (and from Python by
# `hf_vit_plus.utils.logging.set_verbosity_info()`).
logger = _LocalMainProcessLogger(logging.getLogger(__name__), {})


@dataclass
class TrainResult:
    output_dir: Path
    global_step: int
    total_steps: int
    eval_metrics: dict[str, float]
    log_history: list[dict]
    interrupted: bool = False
    stop_reason: str = "finished"
    last_checkpoint: Path | None = None
    train_seconds: float = 0.0
    files: list[Path] = field(default_factory=list)
    raw_datasets: Any = None
    # the trained model, unwrapped, on every process; under FSDP, after the last update: the gathered model on the
    # main process and None on the others (a run stopped early: the sharded model)
    model: Any = None
    # whether the final evaluation clearly beat the task's trivial baseline (`learning.check_learning`); None when
    # the run stopped early or has no baseline to compare with
    learning: LearningCheck | None = None


# ----------------------------------------------------------------------------------------------------- the loop
class RunningTokens:
    """The real and padded tokens of the training batches since the last log line, summed over processes when read:
    the padding fraction the run logs for text."""

    def __init__(self, device: torch.device):
        self.counts = torch.zeros(2, dtype=torch.float64, device=device)
        self.seen = False

    def add(self, counts: tuple[int, int] | None) -> None:
        if counts is not None:
            self.counts[0] += counts[0]
            self.counts[1] += counts[1]
            self.seen = True

    def padding_and_reset(self, accelerator: Accelerator) -> float:
        real, padded = accelerator.reduce(self.counts, reduction="sum").tolist()
        self.counts.zero_()
        return 1.0 - real / padded if padded else 0.0


class RunningLoss:
    """The mean training loss since the last log line, averaged over processes when read."""

    def __init__(self, device: torch.device):
        self.total, self.count = torch.zeros((), device=device), 0

    def add(self, loss: torch.Tensor) -> None:
        self.total += loss.detach().float()
        self.count += 1

    def mean_and_reset(self, accelerator: Accelerator) -> float:
        mean = accelerator.reduce(self.total / self.count, reduction="mean").item()
        self.total.zero_()
        self.count = 0
        return mean


@dataclass
class Progress:
    """Where the run stands: updates done, where the first epoch resumes, the log, the last training state."""

    loss: RunningLoss
    guard: DivergenceGuard  # stops a run whose loss diverged, before anything more is saved
    tokens: RunningTokens | None = None  # text batches' real and padded tokens (the padding fraction logged)
    global_step: int = 0
    start_epoch: int = 0
    skip_batches: int = 0  # batches of `start_epoch` already trained before a resume
    epoch: int = 0  # the epoch being trained
    log_history: list[dict] = field(default_factory=list)
    eval_metrics: dict[str, float] = field(default_factory=dict)
    stop_reason: str = ""  # "finished", "stop_after_steps", "SIGTERM" or "diverged" once the loop stops
    stop_message: str = ""  # the line that says why a diverged run stopped
    last_checkpoint: Path | None = None
    last_saved_step: int = -1


def train(args: TrainingArguments, family: TrainingTask | None = None) -> TrainResult:
    """Train `args.family` as `args` says; returns the final evaluation and where things were written."""
    family = family or get_task(args.family)
    with user_errors():  # before the first update, a bad value is the user's: the tracker, data, config, sizes
        check_push_target(args)  # the final push's target, before hours of training (as transformers' Trainer)
        launch = decide_launch(args, family)  # precision, sharding, activation checkpointing: the Accelerator's
        accelerator = create_accelerator(args, launch)
    # One run per output folder (run_lock): held by the main process from before the folder is read until its last
    # file is written; a second run on the folder stops at once, naming this one (on every process of it).
    with ExitStack() as stack:
        refusal = None
        try:
            stack.enter_context(output_dir_lock(args.output_dir, overwrite=args.overwrite_output_dir,
                                                is_main_process=accelerator.is_main_process))  # fmt: skip
        except UsageError as error:
            refusal = str(error)
        if accelerator.num_processes > 1:
            refusal = broadcast_object_list([refusal])[0]
        if refusal is not None:
            raise UsageError(refusal)
        with peers_answer(accelerator, args.ddp_timeout, args.output_dir):
            return _train(args, family, launch, accelerator)


def _train(args: TrainingArguments, family: TrainingTask, launch: Launch, accelerator: Accelerator) -> TrainResult:
    with user_errors():
        set_seed(args.seed)
        plan, data = plan_the_run(accelerator, args, family, launch)  # the folder is ours now: it may be read
        # from here on, the plan only
        if accelerator.is_main_process:
            write_run_config(plan)
        run = prepare_run(accelerator, plan, family, data)
        # what the run is, once the data and the model passed their checks (a user error comes alone)
        for line in describe(plan, accelerator, weights_from_main=run.weights_from_main):
            logger.info(line)
        progress = restore_progress(run, plan.resume)
    with stop_on_sigterm(accelerator):
        announce(run)
        start = time.perf_counter()
        run_epochs(run, progress)
        train_seconds = time.perf_counter() - start
    if progress.stop_reason != "finished":
        return stop_early(run, progress, train_seconds)
    return finish(run, progress, train_seconds)


def plan_the_run(
    accelerator: Accelerator, args: TrainingArguments, family: TrainingTask, launch: Launch
) -> tuple[RunPlan, TrainingData]:
    """The checkpoint to resume, the data (on the main process first, so that caches are written once), then the
    plan (`plan.build_plan`), with the Accelerator's processes; the launch the Accelerator was built from is the
    plan's (decided once a run).

    Args:
        accelerator: the run's Accelerator.
        args: the run's options.
        family: the family's training task.
        launch: `plan.decide_launch(args, family)`, which the Accelerator was built from.

    Returns:
        The plan and the data.
    """
    resume, processor_from = resume_point(args, family)
    with accelerator.main_process_first():
        data = family.load_data(args)
    plan = build_plan(args, family, launch, data, accelerator.num_processes, resume, processor_from)
    return plan, data


def set_up_run(args: TrainingArguments, family: TrainingTask | None = None) -> Run:
    """A run set up as `train` sets it up, one plan for it (the launch, the Accelerator, the plan, then the model,
    loaders, optimiser and schedule prepared), without the output folder's lock and before any update: for the tests
    and benchmarks that look at a prepared run.

    Args:
        args: the run's options.
        family: the family's training task (default: `args.family`'s).

    Returns:
        The run.
    """
    family = family or get_task(args.family)
    launch = decide_launch(args, family)
    accelerator = create_accelerator(args, launch)
    plan, data = plan_the_run(accelerator, args, family, launch)
    return prepare_run(accelerator, plan, family, data)


def restore_progress(run: Run, resume: ResumePoint | None) -> Progress:
    """A fresh start, or the position, log and optimiser/scheduler/RNG states of the training state resumed."""
    accelerator = run.accelerator
    # under fp16 loss scaling a non-finite loss is the scaler's to skip; the growth of the loss is still watched
    factor = run.plan.optimization.divergence_factor
    guard = DivergenceGuard(accelerator.device, factor, check_finite=accelerator.scaler is None)
    progress = Progress(loss=RunningLoss(accelerator.device), guard=guard, tokens=RunningTokens(accelerator.device))
    if resume is None:
        return progress
    check_same_layout(resume.state, checkpoint_layout(run.accelerator), resume.path, CHECKPOINT_LAYOUTS)
    _warn_if_layout_changed(resume.state, run.plan.optimization, run.accelerator.num_processes)
    # Accelerate loads optimizer/scheduler/RNG with torch.load(weights_only=True) and the model from safetensors;
    # the only other object registered for checkpointing is the weights' average (--ema_decay), a dict of tensors.
    run.accelerator.load_state(str(resume.path), load_kwargs={"weights_only": True})
    if checkpoint_layout(run.accelerator) == "fsdp-sharded":
        reload_sharded_optimizer(run.accelerator, run.model, run.optimizer, resume.path)  # accelerate 1.10 lost it
    progress.global_step = resume.state["global_step"]
    progress.start_epoch, progress.skip_batches = resume.state["epoch"], resume.state["batches_in_epoch"]
    positions = resume.state.get("data_positions")
    if isinstance(run.train_dataloader, ResumableLoader) and positions is None and run.batches_per_epoch is not None:
        # a state saved by a run whose loader was a plain DataLoader (images from files read whole): its batch counts
        # the same units, in another order
        logger.warning(
            f"Checkpoint {resume.path} does not say where the run stood in its data (its loader was another one): "
            f"resuming at batch {progress.skip_batches} of epoch {progress.start_epoch} in this loader's order; the "
            "run continues but does not reproduce an uninterrupted one exactly."
        )
        positions = [{"epoch": progress.start_epoch, "unit": progress.skip_batches, "batch": 0}]
        positions *= accelerator.num_processes
    if isinstance(run.train_dataloader, ResumableLoader):
        if not positions or len(positions) != accelerator.num_processes:
            raise ValueError(
                f"Checkpoint {str(resume.path)!r} does not say where each of this run's {accelerator.num_processes} "
                "process(es) stood in its data (it was saved by a run that read its data otherwise, or by "
                f"{len(positions or [])} process(es)): resume it as it was run."
            )
        # the loader starts where this process stood (the epoch and the batches before it count as saved)
        run.train_dataloader.load_state_dict(positions[accelerator.process_index])
    progress.log_history = list(resume.state.get("log_history", []))
    run.clock.elapsed = float(resume.state.get("train_seconds", 0.0))  # a time budget counts the earlier sessions too
    logger.info(
        f"Resumed from {resume.path} at update {progress.global_step} (epoch {progress.start_epoch}, batch "
        f"{progress.skip_batches})."
    )
    return progress


def announce(run: Run) -> None:
    """Start the trackers and print what is trained on what."""
    accelerator, plan = run.accelerator, run.plan
    if tracker_names(plan.logging.report_to):
        project = plan.logging.project_name or f"hf_vit_plus-{run.family.name}"
        accelerator.init_trackers(project, config=_hparams(plan.options_dict()))
    world = accelerator.num_processes
    sharded = ""
    if accelerator.is_fsdp2:
        sharded = f" (FSDP units: {units(run.model)}; this process holds {local_share(run.model):.1%} of them)"
    elif is_zero3(accelerator):
        sharded = f" (ZeRO-3: this process holds {local_share(run.model):.1%} of them)"
    examples = "a training stream" if run.data.stream is not None else f"{len(run.data.raw['train'])} train"
    batch = (
        f"up to {run.plan.data.max_tokens_per_batch} tokens per process"
        if run.plan.data.batch_by_tokens
        else f"global batch {run.plan.global_batch}"
    )
    logger.info(
        f"Training {run.family.name}: {_count(run.model)} parameters{sharded}, {examples} / "
        f"{len(run.eval_dataloader.dataset)} eval examples, {world} process(es), {batch}, {run.total_steps} updates."
    )
    if plan.parallelism.torch_compile:
        logger.info("torch.compile: the first update compiles the model (tens of seconds on a CPU).")
    if run.clock.budget is not None:
        left = (run.clock.budget - run.clock.elapsed) / 60
        logger.info(
            f"Time budget: {plan.optimization.max_train_minutes:g} min of training ({left:.1f} left): the run ends at "
            "its last update or when they are spent, the learning-rate schedule following the clock where the updates "
            "fall behind it."
        )
    if accelerator.is_main_process:
        check_space(run)


def check_space(run: Run) -> bool:
    """Warn (once, at the start) when the output disk will not hold the checkpoints kept at once and the final
    model; returns whether it warned."""
    checkpointing = run.plan.checkpointing
    model = run.accelerator.unwrap_model(run.model)
    kept = 0 if checkpointing.save_steps == "none" else checkpointing.save_total_limit or UNLIMITED_CHECKPOINTS_CHECKED
    trained = [p for p in model.parameters() if p.requires_grad]
    final = tensor_bytes(trained if run.plan.lora.lora_r is not None else model.parameters())  # an adapter: its own
    return warn_if_short_of_space(checkpointing.output_dir, checkpoint_bytes(model, run.optimizer), kept, final)


def run_epochs(run: Run, progress: Progress) -> None:
    """Train until `total_steps` updates, the time budget, --stop_after_steps or SIGTERM; sets
    `progress.stop_reason`."""
    if progress.global_step >= run.total_steps or run.clock.spent:  # resumed from the final training state
        progress.stop_reason = "finished"
    run.clock.start()
    hidden = not run.accelerator.is_local_main_process
    # an epoch of unknown length (a stream, a token budget): epochs follow one another until the last update
    epochs = range(progress.start_epoch, run.num_epochs) if run.num_epochs is not None else count(progress.start_epoch)
    with tqdm(total=run.total_steps, initial=progress.global_step, disable=hidden) as bar:
        for epoch in epochs:
            if progress.stop_reason:
                break
            skip = progress.skip_batches if epoch == progress.start_epoch else 0
            if train_epoch(run, progress, epoch, skip, bar):
                end_epoch(run, progress, epoch)
    if not progress.stop_reason:
        progress.stop_reason = "finished"


def train_epoch(run: Run, progress: Progress, epoch: int, skip: int, bar) -> bool:
    """One pass over the training batches after the first `skip` (those a resumed run has trained already; a
    `ResumableLoader` starts where its restored position says instead). Returns False when the run stopped within
    the epoch."""
    accelerator = run.accelerator
    run.model.train()
    progress.epoch = epoch
    run.train_dataloader.set_epoch(epoch)
    batches = run.train_dataloader
    if isinstance(batches, ResumableLoader):
        batches = _on_device(batches, accelerator, run.plan.data.pin_memory)
        if run.batches_per_epoch is None:  # every process stops where the first runs out
            batches = _while_every_process_has_a_batch(batches, accelerator)
    elif skip:
        batches = accelerator.skip_first_batches(run.train_dataloader, skip)
        # The skipping loader must shuffle as this epoch does: before accelerate 1.15 it started again at epoch 0.
        batches.set_epoch(epoch)
    batches_in_epoch = skip
    for batch in batches:
        loss = training_step(run, batch)
        batches_in_epoch += 1
        progress.loss.add(loss)
        progress.guard.note(loss, progress.global_step + 1)
        if progress.tokens is not None:
            progress.tokens.add(run.family.token_counts(batch))
        if not accelerator.sync_gradients:  # inside a gradient accumulation: no update yet
            continue
        progress.global_step += 1
        bar.update(1)
        after_update(run, progress, epoch, batches_in_epoch, bar)
        if progress.stop_reason:
            return False
    if batches_in_epoch == skip == 0 and run.batches_per_epoch is None:
        raise ValueError(
            f"Epoch {epoch} of the training data gave no batch: the data (this process's part of it) is too small "
            "for one batch."
        )
    return True


def _on_device(batches, accelerator: Accelerator, non_blocking: bool) -> Iterator[dict]:
    """The batches of a loader that Accelerate did not prepare, on the run's device."""
    for batch in batches:
        yield send_to_device(batch, accelerator.device, non_blocking=non_blocking)


def _while_every_process_has_a_batch(batches, accelerator: Accelerator) -> Iterator[dict]:
    """The batches while every process has one: an epoch of unknown length ends for all at once (one all-reduce of a
    flag per micro-batch), as DDP needs every process in every update."""
    iterator = iter(batches)
    while True:
        batch = next(iterator, None)
        if accelerator.num_processes > 1:
            have = torch.tensor([0 if batch is None else 1], device=accelerator.device)
            if accelerator.reduce(have, reduction="sum").item() < accelerator.num_processes:
                return
        elif batch is None:
            return
        yield batch


def training_step(run: Run, batch: dict) -> torch.Tensor:
    """Forward and backward of one micro-batch; on the last one of an accumulation, clipping, the optimiser step
    and the schedule step. Returns the loss."""
    accelerator, max_grad_norm = run.accelerator, run.plan.optimization.max_grad_norm
    batch = run.family.on_device(batch, run.extras)
    with accelerator.accumulate(run.model):
        loss = run.family.training_loss(run.model, batch, run.extras)
        accelerator.backward(loss)
        if accelerator.sync_gradients and max_grad_norm and max_grad_norm > 0:
            accelerator.clip_grad_norm_(run.model.parameters(), max_grad_norm)
        run.optimizer.step()  # a no-op until the last micro-batch of the accumulation
        if accelerator.sync_gradients and not accelerator.optimizer_step_was_skipped:
            run.scheduler.step()
            if run.ema is not None:
                run.ema.update(accelerator.unwrap_model(run.model))
        run.optimizer.zero_grad(set_to_none=True)
    return loss


def after_update(run: Run, progress: Progress, epoch: int, batches_in_epoch: int, bar) -> None:
    """What follows an optimiser update, as the arguments ask: log the loss, evaluate, decide whether to stop, save
    the training state."""
    accelerator, step = run.accelerator, progress.global_step
    logging_, checkpointing = run.plan.logging, run.plan.checkpointing
    run.clock.tick(accelerator)
    last = step >= run.total_steps or run.clock.spent
    logs = step % logging_.logging_steps == 0 or last
    evaluates = bool(logging_.eval_steps) and step % logging_.eval_steps == 0
    saves = bool(checkpointing.save_every) and step % checkpointing.save_every == 0
    mean_loss = None
    per_epoch = run.batches_per_epoch
    if logs:
        mean_loss = progress.loss.mean_and_reset(accelerator)
        position = epoch if per_epoch is None else round(epoch + batches_in_epoch / per_epoch, 4)
        entry = {"step": step, "epoch": position}
        entry.update(loss=mean_loss, learning_rate=run.scheduler.get_last_lr()[0])
        if progress.tokens is not None and progress.tokens.seen:  # text: the share of the batches that is padding
            entry["padding_fraction"] = round(progress.tokens.padding_and_reset(accelerator), 6)
        _log(accelerator, progress.log_history, entry, "train")
        bar.set_postfix(loss=f"{mean_loss:.4f}", refresh=False)  # shown with the next update (not before the delay)
    # a diverged loss stops the run before it evaluates or saves anything (the updates where the loss is read anyway,
    # and the ends of epochs)
    if logs or evaluates or saves or (per_epoch is not None and batches_in_epoch >= per_epoch):
        stop = progress.guard.diverged(accelerator, step, mean_loss)
        if stop:
            progress.stop_reason, progress.stop_message = "diverged", stop
            return
    if evaluates:
        progress.eval_metrics = evaluate_run(run)
        _log(accelerator, progress.log_history, {"step": step, **prefixed_metrics(progress.eval_metrics)}, "eval")
        run.model.train()
    if last:
        progress.stop_reason = "finished"
    elif checkpointing.stop_after_steps and step >= checkpointing.stop_after_steps:
        progress.stop_reason = "stop_after_steps"
    elif accelerator.check_trigger():  # SIGTERM on any process; a collective, so every process calls it
        progress.stop_reason = "SIGTERM"
    if saves or progress.stop_reason in ("stop_after_steps", "SIGTERM"):
        save_training_state(run, progress, epoch, batches_in_epoch)


def end_epoch(run: Run, progress: Progress, epoch: int) -> None:
    """At the end of an epoch: evaluate (unless --eval_steps sets its own rhythm) and save with --save_steps epoch."""
    if not run.plan.logging.eval_steps:
        progress.eval_metrics = evaluate_run(run)
        entry = {"step": progress.global_step, "epoch": epoch + 1, **prefixed_metrics(progress.eval_metrics)}
        _log(run.accelerator, progress.log_history, entry, "eval")
    if run.plan.checkpointing.save_steps == "epoch" and progress.global_step != progress.last_saved_step:
        save_training_state(run, progress, epoch + 1, 0)


def save_training_state(run: Run, progress: Progress, epoch: int, batches_in_epoch: int) -> None:
    """A checkpoint of the run at this position: the next batch to train is `batches_in_epoch` of `epoch`."""
    if checkpoint_layout(run.accelerator) == "deepspeed":  # only SIGTERM gets here (see sharding.deepspeed_plugin)
        logger.info(f"No training state saved: {DEEPSPEED_STATE_REFUSAL}.")
        return
    if run.batches_per_epoch is not None and batches_in_epoch >= run.batches_per_epoch:
        epoch, batches_in_epoch = epoch + 1, 0
    positions = None
    if isinstance(run.train_dataloader, ResumableLoader):  # where each process stands in its own part of the data
        position = run.train_dataloader.state_dict()
        if batches_in_epoch == 0 or position["epoch"] < epoch:  # the epoch is over (for this process too)
            position = {"epoch": epoch, "unit": 0, "batch": 0}
        positions = [position]
        if run.accelerator.num_processes > 1:
            positions = gather_object(positions)
    state = {
        "format": STATE_FORMAT,
        "version": 1,
        "family": run.family.name,
        "model_config": run.fingerprint,
        "global_step": progress.global_step,
        "total_steps": run.total_steps,
        "epoch": epoch,
        "batches_in_epoch": batches_in_epoch,
        "num_processes": run.accelerator.num_processes,
        "checkpoint_layout": checkpoint_layout(run.accelerator),
        "per_device_train_batch_size": run.plan.optimization.per_device_train_batch_size,
        "gradient_accumulation_steps": run.plan.optimization.gradient_accumulation_steps,
        "seed": run.plan.optimization.seed,
        "log_history": progress.log_history,
        "train_seconds": run.clock.elapsed,
        "args": run.plan.options_dict(),
        "schedule": dataclasses.asdict(run.plan.schedule),
    }
    if positions is not None:
        state["data_positions"] = positions
    progress.last_checkpoint = save_checkpoint(
        run.accelerator, run.output_dir, state, run.plan.checkpointing.save_total_limit, run.processor
    )
    progress.last_saved_step = progress.global_step


def stop_early(run: Run, progress: Progress, train_seconds: float) -> TrainResult:
    """The run stopped before its last update (--stop_after_steps, SIGTERM: its state is saved; a diverged loss:
    nothing saved after it), no final model."""
    if progress.stop_reason == "diverged":
        last = progress.last_checkpoint
        kept = f" The last checkpoint, {last}, is kept as it was." if last else ""
        logger.error(progress.stop_message + kept)
        run.accelerator.end_training()
        return _result(run, progress, train_seconds, files=[], model=run.accelerator.unwrap_model(run.model))
    saved = f"state saved in {progress.last_checkpoint}" if progress.last_checkpoint else "no training state saved"
    stop = f"Stopped at update {progress.global_step}/{run.total_steps} ({progress.stop_reason})"
    logger.info(f"{stop}; {saved}.")
    run.accelerator.end_training()
    return _result(run, progress, train_seconds, files=[], model=run.accelerator.unwrap_model(run.model))


def finish(run: Run, progress: Progress, train_seconds: float) -> TrainResult:
    """The last training state, the final evaluation, then the model folder (and the Hub push)."""
    if run.plan.checkpointing.save_steps != "none" and progress.global_step != progress.last_saved_step:
        save_training_state(run, progress, run.num_epochs if run.num_epochs is not None else progress.epoch + 1, 0)
    progress.eval_metrics = evaluate_run(run)
    history = progress.log_history
    if not history or history[-1].get("step") != progress.global_step or "eval_loss" not in history[-1]:
        _log(
            run.accelerator, history, {"step": progress.global_step, **prefixed_metrics(progress.eval_metrics)}, "eval"
        )
    learning = check_learning(run.family.learning_metric, progress.eval_metrics, run.data.baselines)
    if run.ema is not None:  # the average is the model the run evaluated and saves
        run.ema.copy_to(run.accelerator.unwrap_model(run.model))
    trained = trained_model(run.accelerator, run.model)  # gathered under FSDP (collective)
    files = save_final(
        run.accelerator, run.model, run.processor, run.plan, run.family, run.data, progress.eval_metrics, history,
        trained=trained, learning=learning, train_seconds=run.clock.elapsed,
    )  # fmt: skip
    run.accelerator.end_training()
    if run.clock.spent and progress.global_step < run.total_steps:  # the time budget ended it
        logger.info(
            f"The time budget ({run.plan.optimization.max_train_minutes:g} min) ended the run after update "
            f"{progress.global_step} of the {run.total_steps} foreseen."
        )
    logger.info(f"Final evaluation: {json.dumps(progress.eval_metrics)}; model saved in {run.output_dir}.")
    if run.data.baselines:
        logger.info(f"Baselines on the same split: {json.dumps(run.data.baselines)}.")
    if learning is not None and not learning.learned:  # the last line of the run: the exit status stays 0
        logger.warning(learning.message)
    return _result(run, progress, train_seconds, files, model=trained[0], learning=learning)


def _result(
    run: Run, progress: Progress, train_seconds: float, files: list[Path], model, learning: LearningCheck | None = None
) -> TrainResult:
    return TrainResult(
        learning=learning,
        output_dir=run.output_dir,
        global_step=progress.global_step,
        total_steps=run.total_steps,
        eval_metrics=progress.eval_metrics,
        log_history=progress.log_history,
        interrupted=progress.stop_reason != "finished",
        stop_reason=progress.stop_reason,
        last_checkpoint=progress.last_checkpoint,
        train_seconds=train_seconds,
        files=files,
        raw_datasets=run.data.raw,
        model=model,
    )


def evaluate_run(run: Run) -> dict[str, float]:
    """The run's evaluation: of the model, or with --ema_decay of the average of its weights (the model saved), with
    the current weights' metrics beside it as `online_*`."""
    metrics = evaluate(run.accelerator, run.model, run.eval_dataloader, run.family)
    if run.ema is None:
        return metrics
    averaged = evaluate(run.accelerator, run.ema.module, run.eval_dataloader, run.family)
    online = {f"online_{key}": value for key, value in metrics.items() if key != "samples" and "baseline_" not in key}
    return averaged | online


def evaluate(accelerator: Accelerator, model, dataloader, family: TrainingTask) -> dict[str, float]:
    """Per-example outputs of every process, gathered without the padding `even_batches` adds."""
    model.eval()
    if getattr(dataloader, "generator", None) is not None:
        # the seed a loader without a generator of its own draws from the global random state each pass: the random
        # state dropout reads next is that of a run with any number of workers, resumed or not (`make_eval_dataloader`)
        torch.empty((), dtype=torch.int64).random_()
    chunks: dict[str, list[torch.Tensor]] = defaultdict(list)
    bar = tqdm(dataloader, desc="evaluating", leave=False, disable=not accelerator.is_local_main_process)
    with torch.no_grad():
        for batch in bar:
            for key, value in accelerator.gather_for_metrics(family.eval_outputs(model, batch)).items():
                chunks[key].append(value.cpu())
    return family.metrics({key: torch.cat(values) for key, values in chunks.items()})


# --------------------------------------------------------------------------------------------------- small bits
@contextmanager
def stop_on_sigterm(accelerator: Accelerator) -> Iterator[None]:
    """On SIGTERM, raise Accelerate's trigger: the loop checks it (across processes) after each update, saves the
    state and returns. The previous handler is back on exit; outside the main thread signals are left alone."""

    def handler(signum, frame):
        logger.warning("SIGTERM received: saving the training state after this update.")
        accelerator.set_trigger()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _hparams(options: dict) -> dict:
    values = {}
    for key, value in options.items():
        if isinstance(value, (int, float, str, bool)):
            values[key] = value
        elif value is None:
            values[key] = "None"
    return values


def _log(accelerator: Accelerator, history: list[dict], entry: dict, kind: str) -> None:
    history.append(entry)
    scalars = {f"{kind}/{k.removeprefix('eval_')}": v for k, v in entry.items() if k not in ("step", "epoch")}
    if accelerator.trackers:
        accelerator.log(scalars, step=entry["step"])
    logger.log(logging.INFO if kind == "eval" else logging.DEBUG, "%s", entry)


def _count(model) -> str:
    n = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # ZeRO-3: the whole size
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def _warn_if_layout_changed(state: dict, optimization: OptimizationArguments, world: int) -> None:
    now = {
        "num_processes": world,
        "per_device_train_batch_size": optimization.per_device_train_batch_size,
        "gradient_accumulation_steps": optimization.gradient_accumulation_steps,
        "seed": optimization.seed,
    }
    changed = {k: (state.get(k), v) for k, v in now.items() if state.get(k) != v}
    if changed:
        logger.warning(
            "Resuming with a different batch layout %s (checkpoint, now): the run continues but will not "
            "reproduce an uninterrupted one exactly.",
            changed,
        )
