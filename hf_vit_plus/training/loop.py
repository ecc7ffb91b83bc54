"""The one training loop of the three families, on Accelerate.

The same code runs on one CPU, on N processes (`accelerate launch --multi_gpu --num_processes N`, gloo on CPU,
NCCL on GPUs), on several machines, and under FSDP/DeepSpeed configs, which Accelerate applies in `prepare`.

Order (as in Accelerate's examples): Accelerator -> set_seed -> data under `main_process_first` -> model ->
optimiser groups -> `prepare` -> `accumulate` -> `gather_for_metrics` -> save on the main process with
`unwrap_model(...).save_pretrained`.

Checkpoints (`OUTPUT_DIR/checkpoints/checkpoint-<update>`) hold Accelerate's state (model as safetensors,
optimiser, scheduler, RNG states, loaded with `weights_only=True`) plus `training_state.json` (position in the
data, log history and a fingerprint of the model). They are written to a temporary folder and renamed, so an
interrupted save never leaves a half-written checkpoint. Data order depends only on (seed, epoch), so a resumed
run sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
from torch.utils.data import DataLoader

from .args import TrainingArguments
from .families import Family, get_family

logger = logging.getLogger(__name__)

STATE_FILE = "training_state.json"
STATE_FORMAT = "hf_vit_plus-training-state"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_PREFIX = "checkpoint-"
PROCESSOR_DIR = "processor"
# Config fields that do not change which model a checkpoint belongs to.
_VOLATILE_CONFIG_KEYS = {
    "transformers_version",
    "_name_or_path",
    "architectures",
    "auto_map",
    "dtype",
    "torch_dtype",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "use_cache",
    "_attn_implementation",
    "_attn_implementation_autoset",
}


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
    model: Any = None  # the trained model, unwrapped (on every process)


# ------------------------------------------------------------------------------------------- checkpoint helpers
def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under `output_dir/checkpoints`, oldest first."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    found = [p for p in found if p.name[len(CHECKPOINT_PREFIX) :].isdigit() and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def resolve_checkpoint(resume_from_checkpoint: str, output_dir: str | Path) -> Path:
    """The checkpoint folder to resume from: a path, or "latest" (the newest under `output_dir/checkpoints`)."""
    if resume_from_checkpoint == "latest":
        found = checkpoint_dirs(output_dir)
        if not found:
            raise FileNotFoundError(
                f"--resume_from_checkpoint latest: no checkpoint under {str(Path(output_dir) / CHECKPOINTS_DIR)!r}."
            )
        return found[-1]
    path = Path(resume_from_checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"--resume_from_checkpoint {str(path)!r} does not exist.")
    if not (path / STATE_FILE).is_file():
        raise ValueError(
            f"--resume_from_checkpoint {str(path)!r} is not a training checkpoint of hf_vit_plus (no {STATE_FILE}); "
            "to start from saved weights use --model_name_or_path."
        )
    return path


def read_training_state(path: Path) -> dict:
    state = json.loads((path / STATE_FILE).read_text())
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"{str(path / STATE_FILE)!r} is not an hf_vit_plus training state.")
    return state


def model_fingerprint(config) -> dict:
    """The config fields that identify a model (JSON-safe)."""
    data = json.loads(config.to_json_string(use_diff=False))
    return {k: v for k, v in data.items() if k not in _VOLATILE_CONFIG_KEYS}


def check_same_model(state: dict, family: str, fingerprint: dict, path: Path) -> None:
    """Refuse a checkpoint that belongs to another family or another model configuration, naming the difference."""
    if state["family"] != family:
        raise ValueError(
            f"Checkpoint {str(path)!r} belongs to the {state['family']!r} family, not {family!r}: refusing to resume."
        )
    saved = state["model_config"]
    keys = sorted(set(saved) | set(fingerprint))
    diffs = [k for k in keys if saved.get(k) != fingerprint.get(k)]
    if diffs:
        shown = "; ".join(f"{k}: checkpoint={saved.get(k)!r}, this run={fingerprint.get(k)!r}" for k in diffs[:8])
        raise ValueError(
            f"Checkpoint {str(path)!r} belongs to another model ({saved.get('model_type')!r}); config fields "
            f"differ: {shown}. Refusing to resume."
        )


def save_checkpoint(
    accelerator: Accelerator, output_dir: Path, state: dict, total_limit: int | None, processor=None
) -> Path:
    """`accelerator.save_state` into a temporary folder, then one rename: a checkpoint is complete or absent."""
    root = output_dir / CHECKPOINTS_DIR
    final = root / f"{CHECKPOINT_PREFIX}{state['global_step']}"
    tmp = root / f".tmp-{CHECKPOINT_PREFIX}{state['global_step']}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, default=str))
        if processor is not None:
            processor.save_pretrained(tmp / PROCESSOR_DIR)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        if total_limit is not None:
            for old in checkpoint_dirs(output_dir)[:-total_limit]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


# ----------------------------------------------------------------------------------------------------- the loop
def train(args: TrainingArguments, family: Family | None = None) -> TrainResult:
    """Train `args.family` as `args` says; returns the final evaluation and where things were written."""
    family = family or get_family(args.family)
    output_dir = Path(args.output_dir)
    log_with = _trackers(args.report_to)
    accelerator = Accelerator(
        # Without an accelerator device, say so: then `accelerate launch --multi_gpu` / torchrun processes join one
        # gloo group on CPU instead of each training alone.
        cpu=args.use_cpu or not torch.accelerator.is_available(),
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=log_with,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
        # Data order depends on (seed, epoch) only: the same on every process, and again after a resume.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed),
        # The schedule counts optimiser updates, whatever the number of processes (see the update step below).
        step_scheduler_with_optimizer=False,
    )
    set_seed(args.seed)
    resume_path = resolve_checkpoint(args.resume_from_checkpoint, output_dir) if args.resume_from_checkpoint else None
    resume_state = read_training_state(resume_path) if resume_path else None
    if resume_state is not None and resume_state["family"] != family.name:
        check_same_model(resume_state, family.name, {}, resume_path)

    if (
        resume_path is not None
        and family.trains_its_processor
        and not (args.tokenizer_name or args.model_name_or_path)
        and (resume_path / PROCESSOR_DIR).is_dir()
    ):
        # a tokenizer trained on the data is saved with each checkpoint: resume with the very same one
        args = dataclasses.replace(args, tokenizer_name=str(resume_path / PROCESSOR_DIR))
    with accelerator.main_process_first():
        raw, dataset_name = family.load_raw_data(args)
        model, processor = family.build(args, raw)
        datasets = family.transform(raw, processor, model, args)
    fingerprint = model_fingerprint(model.config)
    if resume_state is not None:
        check_same_model(resume_state, family.name, fingerprint, resume_path)
    if args.activation_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"{type(model).__name__} does not support --activation_checkpointing.")
        model.activation_checkpointing_enable()

    world = accelerator.num_processes
    if len(datasets["train"]) < args.per_device_train_batch_size * world:
        raise ValueError(
            f"The training set has {len(datasets['train'])} examples, fewer than one global batch "
            f"({args.per_device_train_batch_size} x {world} processes)."
        )
    collate = family.collate_fn(processor, model)
    train_dataloader = DataLoader(
        datasets["train"],
        batch_size=args.per_device_train_batch_size,
        shuffle=True,
        drop_last=True,  # every process and every update sees full batches: N processes == one with N x the batch
        collate_fn=collate,
        num_workers=args.dataloader_num_workers,
        generator=torch.Generator().manual_seed(args.seed),
    )
    eval_dataloader = DataLoader(
        datasets["validation"],
        batch_size=args.per_device_eval_batch_size,
        collate_fn=collate,
        num_workers=args.dataloader_num_workers,
    )
    optimizer = family.create_optimizer(model, args)
    train_dataloader, eval_dataloader = accelerator.prepare(train_dataloader, eval_dataloader)

    updates_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    total_steps = args.max_train_steps or math.ceil(args.num_train_epochs * updates_per_epoch)
    num_epochs = math.ceil(total_steps / updates_per_epoch)
    scheduler = family.create_scheduler(optimizer, args, total_steps, model.config)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    global_step, start_epoch, skip_batches = 0, 0, 0
    log_history: list[dict] = []
    if resume_state is not None:
        _warn_if_layout_changed(resume_state, args, world)
        # Accelerate loads optimizer/scheduler/RNG with torch.load(weights_only=True) and the model from
        # safetensors; nothing else (no custom pickled objects) is registered for checkpointing.
        accelerator.load_state(str(resume_path), load_kwargs={"weights_only": True})
        global_step = resume_state["global_step"]
        start_epoch, skip_batches = resume_state["epoch"], resume_state["batches_in_epoch"]
        log_history = list(resume_state.get("log_history", []))
        accelerator.print(
            f"Resumed from {resume_path} at update {global_step} (epoch {start_epoch}, batch {skip_batches})."
        )

    previous_handler = _install_sigterm(accelerator)
    if log_with:
        accelerator.init_trackers(args.project_name or f"hf_vit_plus-{family.name}", config=_hparams(args))
    accelerator.print(
        f"Training {family.name}: {_count(model)} parameters, {len(datasets['train'])} train / "
        f"{len(datasets['validation'])} eval examples, {world} process(es), global batch "
        f"{args.per_device_train_batch_size * world * args.gradient_accumulation_steps}, {total_steps} updates."
    )

    def state_at(epoch: int, batches_in_epoch: int) -> dict:
        if batches_in_epoch >= len(train_dataloader):
            epoch, batches_in_epoch = epoch + 1, 0
        return {
            "format": STATE_FORMAT,
            "version": 1,
            "family": family.name,
            "model_config": fingerprint,
            "global_step": global_step,
            "total_steps": total_steps,
            "epoch": epoch,
            "batches_in_epoch": batches_in_epoch,
            "num_processes": world,
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "seed": args.seed,
            "log_history": log_history,
            "args": args.to_dict(),
        }

    from tqdm.auto import tqdm

    progress = tqdm(total=total_steps, initial=global_step, disable=not accelerator.is_local_main_process)
    stop_reason = "finished" if global_step >= total_steps else ""
    last_checkpoint, last_saved_step = None, -1
    running_loss, running_count = torch.zeros((), device=accelerator.device), 0
    eval_metrics: dict[str, float] = {}
    start = time.perf_counter()
    try:
        for epoch in range(start_epoch, num_epochs):
            if stop_reason:
                break
            model.train()
            train_dataloader.set_epoch(epoch)
            skip = skip_batches if epoch == start_epoch else 0
            batches = accelerator.skip_first_batches(train_dataloader, skip) if skip else train_dataloader
            batches_in_epoch = skip
            for batch in batches:
                with accelerator.accumulate(model):
                    loss = family.training_loss(model, batch, args)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and args.max_grad_norm and args.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    optimizer.step()  # a no-op until the last micro-batch of the accumulation
                    if accelerator.sync_gradients and not accelerator.optimizer_step_was_skipped:
                        scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                batches_in_epoch += 1
                running_loss += loss.detach().float()
                running_count += 1
                if not accelerator.sync_gradients:
                    continue
                global_step += 1
                progress.update(1)
                if global_step % args.logging_steps == 0 or global_step == total_steps:
                    mean_loss = accelerator.reduce(running_loss / running_count, reduction="mean").item()
                    entry = {"step": global_step, "epoch": round(epoch + batches_in_epoch / len(train_dataloader), 4)}
                    entry.update(loss=mean_loss, learning_rate=scheduler.get_last_lr()[0])
                    _log(accelerator, log_history, entry, "train")
                    progress.set_postfix(loss=f"{mean_loss:.4f}")
                    running_loss.zero_()
                    running_count = 0
                if args.eval_steps and global_step % args.eval_steps == 0:
                    eval_metrics = evaluate(accelerator, model, eval_dataloader, family)
                    _log(accelerator, log_history, {"step": global_step, **_prefixed(eval_metrics)}, "eval")
                    model.train()
                if global_step >= total_steps:
                    stop_reason = "finished"
                elif args.stop_after_steps and global_step >= args.stop_after_steps:
                    stop_reason = "stop_after_steps"
                elif accelerator.check_trigger():
                    stop_reason = "SIGTERM"
                every = args.checkpoint_every
                if (every and global_step % every == 0) or stop_reason in ("stop_after_steps", "SIGTERM"):
                    last_checkpoint = save_checkpoint(
                        accelerator,
                        output_dir,
                        state_at(epoch, batches_in_epoch),
                        args.checkpoints_total_limit,
                        processor,
                    )
                    last_saved_step = global_step
                if stop_reason:
                    break
            else:
                if not args.eval_steps:
                    eval_metrics = evaluate(accelerator, model, eval_dataloader, family)
                    _log(
                        accelerator,
                        log_history,
                        {"step": global_step, "epoch": epoch + 1, **_prefixed(eval_metrics)},
                        "eval",
                    )
                if args.checkpointing_steps == "epoch" and global_step != last_saved_step:
                    last_checkpoint = save_checkpoint(
                        accelerator, output_dir, state_at(epoch + 1, 0), args.checkpoints_total_limit, processor
                    )
                    last_saved_step = global_step
        if not stop_reason:
            stop_reason = "finished"
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        progress.close()
    train_seconds = time.perf_counter() - start

    interrupted = stop_reason != "finished"
    if interrupted:
        accelerator.print(
            f"Stopped at update {global_step}/{total_steps} ({stop_reason}); state saved in {last_checkpoint}."
        )
        accelerator.end_training()
        return TrainResult(
            output_dir, global_step, total_steps, eval_metrics, log_history, True, stop_reason, last_checkpoint,
            train_seconds, raw_datasets=raw, model=accelerator.unwrap_model(model),
        )  # fmt: skip

    if args.checkpointing_steps != "none" and global_step != last_saved_step:
        last_checkpoint = save_checkpoint(
            accelerator, output_dir, state_at(num_epochs, 0), args.checkpoints_total_limit, processor
        )
    eval_metrics = evaluate(accelerator, model, eval_dataloader, family)
    if not log_history or log_history[-1].get("step") != global_step or "eval_loss" not in log_history[-1]:
        _log(accelerator, log_history, {"step": global_step, **_prefixed(eval_metrics)}, "eval")
    files = save_final(accelerator, model, processor, family, args, raw, dataset_name, eval_metrics, log_history)
    accelerator.end_training()
    accelerator.print(f"Final evaluation: {json.dumps(eval_metrics)}; model saved in {output_dir}.")
    return TrainResult(
        output_dir, global_step, total_steps, eval_metrics, log_history, False, "finished", last_checkpoint,
        train_seconds, files, raw, accelerator.unwrap_model(model),
    )  # fmt: skip


def evaluate(accelerator: Accelerator, model, dataloader, family: Family) -> dict[str, float]:
    """Per-example outputs of every process, gathered without the padding `even_batches` adds."""
    model.eval()
    chunks: dict[str, list[torch.Tensor]] = defaultdict(list)
    with torch.no_grad():
        for batch in dataloader:
            outputs = family.eval_outputs(model, batch)
            outputs = family.pad_for_gather(accelerator, outputs)
            for key, value in accelerator.gather_for_metrics(outputs).items():
                chunks[key].append(value.cpu())
    gathered = {key: family.concat(key, values) for key, values in chunks.items()}
    return family.metrics(gathered)


def save_final(
    accelerator, model, processor, family, args, raw, dataset_name, eval_metrics, log_history
) -> list[Path]:
    """Model + processor, evaluation results, curves, figures and the card; push when asked. Main process writes."""
    output_dir = Path(args.output_dir)
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    state_dict = accelerator.get_state_dict(model)  # collective under FSDP/DeepSpeed: every process calls it
    if args.activation_checkpointing:
        unwrapped.activation_checkpointing_disable()
    files: list[Path] = []
    if accelerator.is_main_process:
        # written next to the folder, then moved in file by file: no half-written weights under their final name
        staging = output_dir / ".tmp-final"
        shutil.rmtree(staging, ignore_errors=True)
        unwrapped.save_pretrained(staging, is_main_process=True, state_dict=state_dict, save_function=accelerator.save)
        processor.save_pretrained(staging)
        for path in sorted(staging.iterdir()):
            os.replace(path, output_dir / path.name)
        staging.rmdir()
        results = {f"eval_{k}": v for k, v in eval_metrics.items()}
        (output_dir / "eval_results.json").write_text(json.dumps(results, indent=2))
        (output_dir / "log_history.json").write_text(json.dumps(log_history, indent=1))
        files += [output_dir / "eval_results.json", output_dir / "log_history.json"]
        if args.write_card:
            files += write_card_and_figures(
                unwrapped, processor, family, args, raw, dataset_name, eval_metrics, log_history
            )
        if args.push_to_hub:
            push(output_dir, args)
    accelerator.wait_for_everyone()
    return files


def write_card_and_figures(model, processor, family, args, raw, dataset_name, eval_metrics, log_history) -> list[Path]:
    import importlib.util

    output_dir = Path(args.output_dir)
    missing = [m for m in ("hf_vit_plus.hub.card", "hf_vit_plus.hub.figures") if importlib.util.find_spec(m) is None]
    if missing:
        logger.warning("%s not available: no model card or training-curve figure written.", ", ".join(missing))
        return []
    from ..hub import plot_training_curves, write_model_card

    figures = [Path(plot_training_curves(log_history, output_dir / "training_curves.png"))]
    was_training = model.training
    model.eval()
    figures += [Path(p) for p in family.figures(model, processor, raw, output_dir)]
    model.train(was_training)
    card = write_model_card(
        output_dir,
        family=family.card_family,
        model_config=model.config,
        training_args=card_hyperparameters(args),
        eval_results={f"eval_{k}": v for k, v in eval_metrics.items() if k != "samples"},
        dataset_name=dataset_name,
        dataset_config=args.dataset_config,
        figures=figures,
        base_model=args.model_name_or_path,
        repo_id=args.hub_model_id,
    )
    return figures + [Path(card) if card else output_dir / "README.md"]


CARD_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "num_train_epochs",
    "max_train_steps",
    "lr_scheduler",
    "warmup_steps",
    "warmup_ratio",
    "label_smoothing",
    "mixed_precision",
    "seed",
)


def card_hyperparameters(args: TrainingArguments) -> dict:
    """The hyperparameters shown in the model card (those that describe the optimisation)."""
    values = {k: getattr(args, k) for k in CARD_FIELDS if getattr(args, k) is not None}
    values["scheduler"] = values.pop("lr_scheduler")
    return values


def push(output_dir: Path, args: TrainingArguments) -> None:
    from ..hub import push_checkpoint

    staging = output_dir.parent / f".push-{output_dir.name}"
    # push only the model folder, not the training checkpoints or logs
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(output_dir, staging, ignore=shutil.ignore_patterns(CHECKPOINTS_DIR, "logs", ".tmp-*"))
    try:
        push_checkpoint(staging, args.hub_model_id, revision=args.hub_revision, private=args.hub_private)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("Pushed %s to %s (revision %s).", output_dir, args.hub_model_id, args.hub_revision or "main")


# --------------------------------------------------------------------------------------------------- small bits
def _install_sigterm(accelerator: Accelerator):
    """On SIGTERM, raise Accelerate's trigger; the loop checks it (across processes) after each update, saves the
    state and returns."""

    def handler(signum, frame):
        logger.warning("SIGTERM received: saving the training state after this update.")
        accelerator.set_trigger()

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        return signal.getsignal(signal.SIGTERM)


def _trackers(report_to: str | None):
    if report_to is None or report_to.lower() == "none":
        return None
    if report_to == "all":
        return "all"
    return [name.strip() for name in report_to.split(",") if name.strip()]


def _hparams(args: TrainingArguments) -> dict:
    values = {}
    for key, value in args.to_dict().items():
        if isinstance(value, (int, float, str, bool)):
            values[key] = value
        elif value is None:
            values[key] = "None"
    return values


def _prefixed(metrics: dict) -> dict:
    """Metrics for the log history and trackers (the example count is not a curve)."""
    return {f"eval_{k}": v for k, v in metrics.items() if k != "samples"}


def _log(accelerator: Accelerator, history: list[dict], entry: dict, kind: str) -> None:
    history.append(entry)
    scalars = {f"{kind}/{k.removeprefix('eval_')}": v for k, v in entry.items() if k not in ("step", "epoch")}
    if accelerator.trackers:
        accelerator.log(scalars, step=entry["step"])
    logger.info("%s", entry)


def _count(model) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def _warn_if_layout_changed(state: dict, args: TrainingArguments, world: int) -> None:
    now = {
        "num_processes": world,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "seed": args.seed,
    }
    changed = {k: (state.get(k), v) for k, v in now.items() if state.get(k) != v}
    if changed:
        logger.warning(
            "Resuming with a different batch layout %s (checkpoint, now): the run continues but will not "
            "reproduce an uninterrupted one exactly.",
            changed,
        )
