"""What a finished run leaves: the model folder (weights, config, processor), its evaluation results and log, the
training curves and the family's figures, the model card, and the push to the Hub. The main process writes; every
process calls `save_final` (gathering a sharded model's weights is collective). Under FSDP the folder holds one
consolidated model.safetensors, written from an ordinary copy of the model that the card and figures use too."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from accelerate import Accelerator

from ..errors import StepFailedError, UsageError
from ..families.vit import RECIPE_FLAGS
from ..models.compat import disable_activation_checkpointing
from .checkpoints import checkpoint_dirs
from .disk import SAVE_ERRORS, OutOfSpaceError, is_out_of_space, out_of_space_message, tensor_bytes
from .options import HubArguments
from .plan import RunPlan
from .sharding import trained_model
from .tasks import TrainingData, TrainingTask

logger = logging.getLogger(__name__)

# The hyperparameters a model card shows (those that describe the optimisation).
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
    "max_steps",
    "max_train_minutes",
    "lr_scheduler_type",
    "warmup_steps",
    "warmup_ratio",
    "label_smoothing_factor",
    "mixed_precision",
    "seed",
)


def save_final(
    accelerator: Accelerator,
    model,
    processor,
    plan: RunPlan,
    family: TrainingTask,
    data: TrainingData,
    eval_metrics: dict[str, float],
    log_history: list[dict],
    trained: tuple | None = None,
    learning=None,
    train_seconds: float | None = None,
) -> list[Path]:
    """Model + processor, evaluation results, curves, figures and the card into --output_dir (the plan's); push
    when asked. `model` is the one `accelerator.prepare` returned; `trained` what `sharding.trained_model` gave for
    it, if it was called already; `train_seconds` the training time the card reports. Returns the files written
    besides the model's own."""
    output_dir, hub = Path(plan.checkpointing.output_dir), plan.hub
    accelerator.wait_for_everyone()
    # an ordinary module with the trained weights: collective under FSDP/DeepSpeed, every process calls it
    unwrapped, state_dict = trained if trained is not None else trained_model(accelerator, model)
    if plan.parallelism.activation_checkpointing and unwrapped is not None:
        disable_activation_checkpointing(unwrapped)
    files: list[Path] = []
    failure = None  # raised once the other processes are released from the barrier below
    if accelerator.is_main_process:
        failure = _write_model_folder(accelerator, unwrapped, state_dict, processor, output_dir)
    if accelerator.is_main_process and failure is None:
        results = {f"eval_{k}": v for k, v in eval_metrics.items()} | baseline_results(data)
        (output_dir / "eval_results.json").write_text(json.dumps(results, indent=2))
        (output_dir / "log_history.json").write_text(json.dumps(log_history, indent=1))
        files += [output_dir / "eval_results.json", output_dir / "log_history.json"]
        if hub.write_card:
            record = run_record(accelerator, plan, family, data, processor, train_seconds)
            files += write_card_and_figures(
                plan, family, data, unwrapped, processor, eval_metrics, log_history, learning=learning, record=record
            )
        if hub.push_to_hub:
            for tracker in accelerator.trackers:  # the TensorBoard events so far go up with the model (under runs/)
                getattr(getattr(tracker, "writer", None), "flush", lambda: None)()
            message = push(output_dir, hub)
            failure = StepFailedError(message) if message is not None else None  # the model is saved: run done
    accelerator.wait_for_everyone()
    if failure is not None:
        raise failure
    return files


def _write_model_folder(accelerator, unwrapped, state_dict, processor, output_dir: Path) -> OutOfSpaceError | None:
    """The model and processor into `output_dir`, written next to it then moved in file by file: no half-written
    weights under their final name. On a full disk nothing is moved (the previous model, if any, still loads) and
    the `OutOfSpaceError` to raise is returned."""
    staging = output_dir / ".tmp-final"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        unwrapped.save_pretrained(staging, is_main_process=True, state_dict=state_dict, save_function=accelerator.save)
        if processor is not None:
            processor.save_pretrained(staging)
    except SAVE_ERRORS as error:
        shutil.rmtree(staging, ignore_errors=True)
        if not is_out_of_space(error, output_dir):
            raise
        complete = checkpoint_dirs(output_dir)
        needed = tensor_bytes(unwrapped.state_dict().values())
        message = out_of_space_message("the final model", output_dir, needed, complete[-1] if complete else None)
        failure = OutOfSpaceError(message)
        failure.__cause__ = error
        return failure
    for path in sorted(staging.iterdir()):
        os.replace(path, output_dir / path.name)
    staging.rmdir()
    return None


def write_card_and_figures(
    plan: RunPlan,
    family: TrainingTask,
    data: TrainingData,
    model,
    processor,
    eval_metrics: dict[str, float],
    log_history: list[dict],
    learning=None,
    record=None,
) -> list[Path]:
    """The training curves, the family's figures of the trained (unwrapped) `model` and the model card that shows
    them (`record`: the card's `hub.card.RunRecord`, the data and compute sections)."""
    from ..hub import plot_training_curves, write_model_card

    output_dir, hub, base_model = Path(plan.checkpointing.output_dir), plan.hub, plan.model_options.model_name_or_path
    figures = [Path(plot_training_curves(log_history, output_dir / "training_curves.png"))]
    if plan.lora.lora_r is not None:  # an adapter folder: its card names the base model and how to load the adapter
        from ..hub.adapter import write_adapter_card

        card = write_adapter_card(
            output_dir, family=family.name, base_model=base_model, repo_id=hub.hub_model_id,
            eval_results=prefixed_metrics(eval_metrics), dataset_name=data.hub_id, figures=figures,
            license=hub.license, learning_warning=learning.card_text if learning is not None else None,
        )  # fmt: skip
        return figures + [card]
    was_training = model.training
    model.eval()
    figures += [Path(p) for p in family.figures(model, processor, data.raw, output_dir)]
    model.train(was_training)
    card = write_model_card(
        output_dir,
        family=family.name,
        model_config=model.config,
        training_args=card_hyperparameters(plan, log_history),
        eval_results=prefixed_metrics(eval_metrics) | baseline_results(data),
        dataset_name=data.name,
        dataset_config=plan.data_options.dataset_config_name,
        figures=figures,
        base_model=base_model,
        repo_id=hub.hub_model_id,
        license=hub.license,
        eval_split=data.eval_split,
        learning_warning=learning.card_text if learning is not None else None,
        dataset_id=data.hub_id,
        run_record=record,
        language=list(data.languages) or None,
    )
    return figures + [Path(card)]


def run_record(
    accelerator: Accelerator,
    plan: RunPlan,
    family: TrainingTask,
    data: TrainingData,
    processor,
    train_seconds: float | None,
):
    """The card's account of the run (`hub.card.RunRecord`): the data's description and split sizes, the family's
    preprocessing, the hardware (processes, GPUs or CPU, by `env_cli`), the training time and the precision."""
    from ..hub.card import RunRecord
    from ..utils.environment import cpu_description

    splits = (("train", "train"), ("validation", f"{data.eval_split} (evaluation)"))
    sizes = tuple((label, len(data.raw[split])) for split, label in splits if split in data.raw)
    processes = accelerator.num_processes
    where = f"{processes} process{'es' if processes > 1 else ''}"
    if accelerator.device.type == "cuda":
        import torch

        where += f", one GPU each ({torch.cuda.get_device_name(accelerator.device)})"
    else:
        where += f" on CPU ({cpu_description()[0]}, {os.cpu_count()} logical cores)"
    return RunRecord(
        data_description=data.description,
        split_sizes=sizes,
        preprocessing=family.preprocessing(plan, processor),
        hardware=where,
        train_seconds=train_seconds,
        precision=accelerator.mixed_precision,
    )


def card_hyperparameters(plan: RunPlan, log_history: list[dict] | None = None) -> dict:
    """The hyperparameters shown in the model card: `CARD_FIELDS` as the plan resolved them (the scheduler the run
    used, e.g. "cosine", "noam"; the warm-up's updates), and the image recipe's flags (`RECIPE_FLAGS`) where the run
    has a recipe. The epochs are left out when --max_steps decided the length. Under --max_train_minutes the updates
    and epochs the run made (`log_history`'s last) stand beside those foreseen: the budget may end it first.

    Args:
        plan: the run's plan.
        log_history: the run's log.

    Returns:
        Name -> value.
    """
    values = {k: plan.option(k) for k in CARD_FIELDS if plan.option(k) is not None}
    values["scheduler"] = values.pop("lr_scheduler_type")
    values["warmup_updates"] = plan.schedule.warmup_steps
    if values.get("max_steps"):
        values.pop("num_train_epochs", None)
    if values.get("max_train_minutes") and log_history:
        steps = [entry["step"] for entry in log_history if "step" in entry]
        epochs = [entry["epoch"] for entry in log_history if "epoch" in entry]
        if steps:
            values["updates_made"] = max(steps)
        if epochs:
            values["epochs_made"] = round(max(epochs), 2)
    if plan.recipe.auto_augment is not None:  # the run resolved its recipe (image families)
        values.update({k: plan.option(k) for k in RECIPE_FLAGS if plan.option(k) is not None})
    return values


def check_push_target(args: HubArguments) -> None:
    """With --push_to_hub, before any training: the endpoint answers, the token may write, --hub_model_id exists or
    is created now, --hub_revision exists or is created now (`hub.push.check_push_target`); else a `UsageError` in
    one line."""
    from ..hub.push import HubPushError
    from ..hub.push import check_push_target as check_target

    if not args.push_to_hub:
        return
    try:
        check_target(args.hub_model_id, revision=args.hub_revision, private=args.hub_private_repo)
    except HubPushError as err:
        raise UsageError(f"--push_to_hub: {err} Nothing was trained.") from err


def push(output_dir: Path, args: HubArguments) -> str | None:
    """Push the model folder (not the training checkpoints: `hub.push.RUN_IGNORE_PATTERNS`; the TensorBoard logs
    under runs/) to --hub_model_id. Returns None, or, when the push fails, one line saying where the model is saved
    and the `hf-vit-plus push` command that retries it."""
    import shlex

    from ..hub import push_checkpoint
    from ..hub.push import HubPushError

    try:
        push_checkpoint(output_dir, args.hub_model_id, revision=args.hub_revision, private=args.hub_private_repo)
    except HubPushError as err:
        retry = ["hf-vit-plus", "push", str(output_dir), args.hub_model_id]
        retry += ["--revision", args.hub_revision] if args.hub_revision else []
        retry += ["--private"] if args.hub_private_repo else []
        cause = err.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(err)
        detail = " ".join(detail.split())[:400]
        return (
            f"the model is saved in {output_dir}, but pushing it to {args.hub_model_id!r} failed at step "
            f"'{err.step}' ({detail}). Retry with: {shlex.join(retry)}"
        )
    logger.info("Pushed %s to %s (revision %s).", output_dir, args.hub_model_id, args.hub_revision or "main")
    return None


def baseline_results(data: TrainingData) -> dict:
    """The data's reference numbers on the evaluation split, e.g. `eval_baseline_uniform_bits_per_dim`: the model card
    shows them beside the model's results, outside its model-index."""
    return {f"eval_baseline_{k}": v for k, v in data.baselines.items()}


def prefixed_metrics(metrics: dict) -> dict:
    """Metrics for the log history, the trackers and the card (the example count is not a curve)."""
    return {f"eval_{k}": v for k, v in metrics.items() if k != "samples"}
