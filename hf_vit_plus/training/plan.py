"""The decisions of a training run, made once: `RunPlan`, which the loop, the sharding code and the outputs read.

A run's arguments leave some choices open, and the answers depend on the machine, the launcher and the output folder:

- precision: --mixed_precision, else the launcher's (`accelerate launch` sets ACCELERATE_MIXED_PRECISION from its
  config), else --recipe's (`recipes.recipe_mixed_precision`: "deit" takes bf16 autocast where the device multiplies
  bf16 natively, fp32 for a convolutional network whose feature maps shrink to 1 x 1 on the CPU), else Accelerate's
  default;
- sharding: what --fsdp / --fsdp_config and the launcher's environment ask for (`sharding.ParallelismRequest`);
- activation checkpointing: --activation_checkpointing, or asked for by the FSDP config (the model's own
  checkpointing then, never the plugin's wrapper);
- resume: the checkpoint --resume_from_checkpoint names (`latest`: the newest complete one);
- the processor: a tokenizer trained on the data is saved with each checkpoint, and a resumed run uses that very one.

`plan_run` decides the first three before the Accelerator is built (its precision and plugins come from them), and
`plan_resume` the last two once the run holds its output folder (`run_lock`): the folder is read only then. The plan
is frozen: `plan.args` are the arguments as the run uses them, with every decision written in, and `describe`
gives the lines a run starts with.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .args import TrainingArguments
from .checkpoints import PROCESSOR_DIR, check_same_model, read_training_state, resolve_checkpoint
from .recipes import recipe_mixed_precision
from .sharding import ParallelismRequest, parallelism_request


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    state: dict  # its training_state.json


@dataclass(frozen=True)
class RunPlan:
    """What a run does, decided once (`plan_run`, then `plan_resume`)."""

    args: TrainingArguments  # the arguments with the decisions written in (precision, checkpointing, processor)
    request: ParallelismRequest  # the sharding asked for, by the command line and the launcher
    on_cpu: bool  # trains on the CPU: --use_cpu, or no accelerator device here
    precision_from: str  # who chose `args.mixed_precision`: "--mixed_precision", "the launcher", "--recipe deit", ...
    checkpointing_from: str | None = None  # who asked for activation checkpointing (None: off)
    resume: ResumePoint | None = None
    processor_from: str | None = None  # where the processor comes from when the plan chose it (a checkpoint's)

    @property
    def sharded(self) -> bool:
        return _sharded(self.request)

    @property
    def weights_from_main_process(self) -> bool:
        """fsdp_cpu_ram_efficient_loading with pretrained weights: only the main process reads them (under FSDP2)."""
        return bool(self.request.fsdp and self.request.ram_efficient_loading and self.args.model_name_or_path)


def _sharded(request: ParallelismRequest) -> bool:
    """Whether FSDP or DeepSpeed shards the run (they then keep their own precision settings)."""
    return bool(request.fsdp or request.deepspeed_from)


def trains_on_cpu(args: TrainingArguments) -> bool:
    """Whether the run trains on the CPU: --use_cpu, or no accelerator device here."""
    return args.use_cpu or not torch.accelerator.is_available()


def plan_run(args: TrainingArguments) -> RunPlan:
    """The decisions made before the Accelerator is built: sharding, precision, activation checkpointing."""
    request = parallelism_request(args.fsdp, args.fsdp_options)
    on_cpu = trains_on_cpu(args)
    args, precision_from = _decide_precision(args, request, on_cpu)
    checkpointing_from = None
    if args.activation_checkpointing:
        checkpointing_from = "--activation_checkpointing"
    elif request.activation_checkpointing:
        # the model's own checkpointing (one recomputation per layer, the RNG state kept), not the plugin's wrapper
        args = dataclasses.replace(args, activation_checkpointing=True)
        checkpointing_from = (
            "--fsdp_config" if "activation_checkpointing" in request.fsdp_options else "the accelerate config"
        )
    return RunPlan(args, request, on_cpu, precision_from, checkpointing_from)


def _decide_precision(args: TrainingArguments, request: ParallelismRequest, on_cpu: bool):
    """`args` with --recipe's mixed precision when neither --mixed_precision nor the launcher chose one, nor an
    earlier run of this process: Accelerate's state is process-wide and refuses another precision once set, so a
    second `train()` in one Python process keeps the first's."""
    from accelerate.state import is_initialized

    if args.mixed_precision is not None:
        return args, "--mixed_precision"
    if os.environ.get("ACCELERATE_MIXED_PRECISION"):
        return args, "the launcher"
    if is_initialized():
        return args, "an earlier run in this process"
    device = "cpu" if on_cpu else torch.accelerator.current_accelerator().type
    sharded = _sharded(request)
    value = recipe_mixed_precision(args.recipe, device, sharded=sharded)
    chosen_by = f"--recipe {args.recipe}"
    if value == "bf16" and device == "cpu":  # unless the model's feature maps are too small for bf16's backward
        from .families import get_family

        side = get_family(args.family).smallest_feature_map(args)
        if recipe_mixed_precision(args.recipe, device, sharded=sharded, smallest_feature_map=side) == "no":
            value = "no"
            chosen_by += (
                f", not bf16: the {args.model_type}'s feature maps shrink to {side} x {side}, where torch's bf16 "
                "backward on the CPU gives non-finite gradients"
            )
    if value:
        return dataclasses.replace(args, mixed_precision=value), chosen_by
    return args, "the default"


def plan_resume(plan: RunPlan, family) -> RunPlan:
    """The plan with the checkpoint to resume (--resume_from_checkpoint; refused when it belongs to another family)
    and, for a family that trains its processor, that checkpoint's processor unless one was given."""
    args = plan.args
    if not args.resume_from_checkpoint:
        return plan
    path = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir)
    state = read_training_state(path)
    if state["family"] != family.name:
        check_same_model(state, family.name, {}, path)
    resume, processor_from = ResumePoint(path, state), None
    if (
        family.trains_its_processor
        and not (args.tokenizer_name or args.model_name_or_path)
        and (path / PROCESSOR_DIR).is_dir()
    ):
        processor_from = str(path / PROCESSOR_DIR)
        args = dataclasses.replace(args, tokenizer_name=processor_from)
    return dataclasses.replace(plan, args=args, resume=resume, processor_from=processor_from)


def describe(plan: RunPlan, accelerator, weights_from_main: bool = False) -> list[str]:
    """The first lines of a run: what is spread over what, sharding, precision, global batch and what the plan
    chose (`sharding.describe_parallelism` gives the first ones from the Accelerator the plan built;
    `weights_from_main`: the main process read the pretrained weights and sent them on)."""
    from .sharding import describe_parallelism

    args = plan.args
    lines = describe_parallelism(accelerator, weights_from_main)
    world = accelerator.num_processes
    if plan.precision_from not in ("--mixed_precision", "the launcher", "the default"):  # the plan chose it: say why
        lines[-1] += f" (chosen by {plan.precision_from})"
    checkpointing = "off" if plan.checkpointing_from is None else "on"
    if plan.checkpointing_from not in (None, "--activation_checkpointing"):
        checkpointing += f" (asked for by {plan.checkpointing_from})"
    lines.append(
        f"Global batch: {args.per_device_train_batch_size * world * args.gradient_accumulation_steps} = "
        f"{args.per_device_train_batch_size} per process x {world} process{'es' if world > 1 else ''} x "
        f"{args.gradient_accumulation_steps} accumulation step{'s' if args.gradient_accumulation_steps > 1 else ''}; "
        f"activation checkpointing: {checkpointing}"
    )
    if plan.processor_from:
        lines.append(f"Processor: the one saved with the checkpoint resumed ({plan.processor_from})")
    return lines


__all__ = ["ResumePoint", "RunPlan", "describe", "plan_resume", "plan_run", "trains_on_cpu"]
