"""What a run is spread over, and sharded training with FSDP2 through Accelerate, on GPUs and on CPU.

FSDP is asked for in two ways: `--fsdp` / `--fsdp_config` on the command line (transformers' spelling), or an
accelerate config with `distributed_type: FSDP`, which `accelerate launch` passes to each process as environment
variables (`ACCELERATE_USE_FSDP`, `FSDP_*`). Either way the loop builds Accelerate's `FullyShardedDataParallelPlugin`
(`fsdp_plugin`) and gives it to the `Accelerator`.

Accelerate applies FSDP only on accelerators: with `Accelerator(cpu=True)`, which the loop passes on a CPU machine
(else the processes of `accelerate launch` would each train alone), an FSDP plugin or config silently becomes DDP
(`MULTI_CPU`). torch's FSDP2 (`fully_shard`) runs on CPU over gloo, and so does Accelerate's own FSDP2 code once its
state says FSDP: `honour` switches the state of a CPU run of several processes from MULTI_CPU to FSDP with the plugin
(`_drive_fsdp_on_cpu`, a feature test: skipped where Accelerate applied FSDP itself, as on GPUs). From there
`prepare`, `backward`, `clip_grad_norm_`, `accumulate`, `save_state` / `load_state` (torch distributed checkpoint)
and `get_state_dict` are Accelerate's FSDP2 path, unchanged, on CPU as on GPUs.

DeepSpeed ZeRO-2/3 is asked for by an accelerate config of `distributed_type: DEEPSPEED` (ACCELERATE_USE_DEEPSPEED,
ACCELERATE_DEEPSPEED_*): `deepspeed_plugin` builds Accelerate's plugin with the run's batch, accumulation and
clipping in its config; on CPU the loop then builds the Accelerator without `cpu=True` (which would set up DDP) and
with a gloo process group, and DeepSpeed uses its CPU accelerator.

With fsdp_cpu_ram_efficient_loading (the answer `accelerate config` gives by default: FSDP_CPU_RAM_EFFICIENT_LOADING;
or --fsdp_config's cpu_ram_efficient_loading), only the main process reads --model_name_or_path's weights: the others
build the model on the meta device and receive their shards once it is sharded (`WeightsFromMainProcess`).

A request that cannot be honoured is refused with one line naming what was asked and why (`refuse_before_start`,
`deepspeed_plugin`, `honour`), and the first lines of every run say what is in effect (`describe_parallelism`, then
`plan.describe`).

FSDP units (`prepare_model`, before the optimiser is built): each layer of the model's `_no_split_modules` is a unit,
except a module that holds the input or output embedding or a tied weight (accelerate 1.15 carves the input embedding
out itself and fails when it sits inside an already sharded unit); the modules that share a weight (tied
embeddings: the language model's embedding and output projection, the seq2seq model's shared matrix, which four
modules use) are one unit, sharded here with the arguments Accelerate gives `fully_shard` (Accelerate groups only
`get_input_embeddings()` with `get_output_embeddings()`, and torch refuses a weight seen by two units); the rest
(positions, norms, the classifier) is the root unit.
"""

from __future__ import annotations

import copy
import os
import socket
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from ..errors import UsageError

LAUNCHER_FSDP = "the accelerate config (ACCELERATE_USE_FSDP=true)"
LAUNCHER_DEEPSPEED = "the accelerate config (ACCELERATE_USE_DEEPSPEED=true)"
SHARDED_STATE_DICT = "SHARDED_STATE_DICT"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class ParallelismRequest:
    """What the command line and the environment of `accelerate launch` ask for."""

    fsdp_from: str | None = None  # who asks for FSDP ("--fsdp", `LAUNCHER_FSDP`, or both); None: nobody
    fsdp_options: dict = field(default_factory=dict)  # --fsdp_config (`args.read_fsdp_config`: keys unprefixed)
    deepspeed_from: str | None = None
    environ: Mapping[str, str] = field(default_factory=dict)  # the FSDP_* / ACCELERATE_* variables seen

    @property
    def fsdp(self) -> bool:
        return self.fsdp_from is not None

    @property
    def fsdp_version(self) -> int:
        """--fsdp_config's version, else the launcher's FSDP_VERSION, else 2 for --fsdp and Accelerate's default
        (1) for a launcher config that does not say."""
        if "version" in self.fsdp_options:
            return int(self.fsdp_options["version"])
        if "FSDP_VERSION" in self.environ:
            return int(self.environ["FSDP_VERSION"])
        return 2 if "--fsdp" in (self.fsdp_from or "") else 1

    @property
    def ram_efficient_loading(self) -> bool:
        """Whether --fsdp_config's cpu_ram_efficient_loading or the launcher's (FSDP_CPU_RAM_EFFICIENT_LOADING, which
        `accelerate config` answers yes by default) asks that only the main process read the pretrained weights."""
        if "cpu_ram_efficient_loading" in self.fsdp_options:
            return self.fsdp and bool(self.fsdp_options["cpu_ram_efficient_loading"])
        return self.fsdp and _flag(self.environ, "FSDP_CPU_RAM_EFFICIENT_LOADING")

    @property
    def activation_checkpointing(self) -> bool:
        """Whether --fsdp_config or the launcher's FSDP config asks for activation checkpointing."""
        if "activation_checkpointing" in self.fsdp_options:
            return bool(self.fsdp_options["activation_checkpointing"])
        return self.fsdp and _flag(self.environ, "FSDP_ACTIVATION_CHECKPOINTING")


def parallelism_request(fsdp: bool, fsdp_options: Mapping | None = None, environ: Mapping | None = None):
    """The request of a run: `fsdp` / `fsdp_options` from its arguments, the rest from `environ` (os.environ)."""
    environ = os.environ if environ is None else environ
    seen = {k: v for k, v in environ.items() if k.startswith(("FSDP_", "ACCELERATE_"))}
    asked = [name for name, on in (("--fsdp", fsdp), (LAUNCHER_FSDP, _flag(environ, "ACCELERATE_USE_FSDP"))) if on]
    deepspeed = LAUNCHER_DEEPSPEED if _flag(environ, "ACCELERATE_USE_DEEPSPEED") else None
    return ParallelismRequest(" and ".join(asked) or None, dict(fsdp_options or {}), deepspeed, seen)


def _flag(environ: Mapping, name: str) -> bool:
    return str(environ.get(name, "false")).lower() in ("1", "true", "yes")


# ----------------------------------------------------------------------------------------- refusals, the plugin
def refuse_before_start(request: ParallelismRequest, on_cpu: bool) -> None:
    """Refuse (`UsageError`, one line) what no Accelerator can honour here, before one is built."""
    if request.fsdp and request.deepspeed_from:
        raise UsageError(
            f"{request.fsdp_from} asks for FSDP and {request.deepspeed_from} for DeepSpeed: choose one of them."
        )
    if request.deepspeed_from:
        from accelerate.utils import is_deepspeed_available

        if not is_deepspeed_available():
            raise UsageError(
                f"{request.deepspeed_from} asks for DeepSpeed, which is not installed (pip install deepspeed)."
            )
    if not request.fsdp:
        return
    if request.fsdp_version != 2:
        raise UsageError(
            f"{request.fsdp_from} asks for FSDP version {request.fsdp_version}: hf-vit-plus trains with FSDP2 only "
            "(torch's fully_shard; FSDP1 is deprecated in transformers and Accelerate): set fsdp_version: 2 in the "
            "fsdp_config of the accelerate config (or pass --fsdp_version 2 to accelerate launch)."
        )
    policy = str(request.fsdp_options.get("auto_wrap_policy") or request.environ.get("FSDP_AUTO_WRAP_POLICY") or "")
    if policy.upper() == "SIZE_BASED_WRAP":
        raise UsageError(
            f"{request.fsdp_from} asks for auto_wrap_policy SIZE_BASED_WRAP: hf-vit-plus wraps the model's layers "
            "(TRANSFORMER_BASED_WRAP, the default) or nothing (NO_WRAP); a size-based unit may cut a tied embedding "
            "from its twin."
        )
    offload = request.fsdp_options.get("cpu_offload", _flag(request.environ, "FSDP_OFFLOAD_PARAMS"))
    if offload and on_cpu:
        raise UsageError(
            f"{request.fsdp_from} asks to offload parameters to the CPU (cpu_offload / fsdp_offload_params), but "
            "this run is on the CPU already: set it to false."
        )


def fsdp_plugin(request: ParallelismRequest) -> FullyShardedDataParallelPlugin | None:
    """Accelerate's FSDP2 plugin for the request (None without one). What --fsdp_config does not set comes from the
    launcher's FSDP_* variables (the plugin reads them), then from hf-vit-plus's defaults: the model's layers as units
    (TRANSFORMER_BASED_WRAP) and sharded checkpoints (SHARDED_STATE_DICT). Activation checkpointing is the model's
    own (see `prepare_model`), never the plugin's."""
    if not request.fsdp:
        return None
    options, environ = request.fsdp_options, request.environ
    policy = options.get("auto_wrap_policy") or environ.get("FSDP_AUTO_WRAP_POLICY") or "TRANSFORMER_BASED_WRAP"
    kwargs: dict = {"fsdp_version": 2, "activation_checkpointing": False, "auto_wrap_policy": policy.lower()}
    if "reshard_after_forward" in options:
        kwargs["reshard_after_forward"] = bool(options["reshard_after_forward"])
    if "cpu_offload" in options:
        kwargs["cpu_offload"] = bool(options["cpu_offload"])
    if "state_dict_type" in options or "FSDP_STATE_DICT_TYPE" not in environ:
        kwargs["state_dict_type"] = options.get("state_dict_type", SHARDED_STATE_DICT)
    if options.get("transformer_layer_cls_to_wrap"):
        kwargs["transformer_cls_names_to_wrap"] = list(options["transformer_layer_cls_to_wrap"])
    if "mixed_precision_policy" in options:
        kwargs["mixed_precision_policy"] = _mixed_precision_policy(options["mixed_precision_policy"])
    plugin = FullyShardedDataParallelPlugin(**kwargs)
    # cpu_ram_efficient_loading is the loop's (`WeightsFromMainProcess`), not Accelerate's: Accelerate's takes the
    # model's state dict after `prepare_model` sharded the tied weights, and would broadcast their shards as whole
    # weights. (Set after the plugin is built: passing it would write FSDP_CPU_RAM_EFFICIENT_LOADING into os.environ.)
    plugin.cpu_ram_efficient_loading = False
    return plugin


def _mixed_precision_policy(value):
    """--fsdp_config's mixed_precision_policy ('bf16', or {'param_dtype': 'bf16', 'reduce_dtype': 'fp32', ...})."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if isinstance(value, str):
        value = {"param_dtype": value, "reduce_dtype": value, "output_dtype": value}
    return MixedPrecisionPolicy(**{key: DTYPES[name] for key, name in value.items()})


# ------------------------------------------------------------------------------------------------- DeepSpeed
# the ZeRO stages hf-vit-plus trains with (tested on CPU: tests/training/test_training_deepspeed.py)
DEEPSPEED_STAGES = (2, 3)
DEEPSPEED_STATE_REFUSAL = (
    "DeepSpeed writes its training states as pickles and reads them back with torch.load(weights_only=False), and "
    "hf-vit-plus never unpickles files"
)


def deepspeed_plugin(request: ParallelismRequest, args, on_cpu: bool):
    """Accelerate's DeepSpeed plugin for the request (None without one), read from the launcher's variables
    (ACCELERATE_DEEPSPEED_*, or the DeepSpeed config file they name), with what the run decides written into its
    config as Accelerate needs it (the loop prepares the loaders apart from the model, so nothing is left 'auto'):
    the micro-batch per process, the accumulation steps, the gradient clipping, and for ZeRO-3 the gathering of the
    whole model for the final model.safetensors. Refuses (`UsageError`, one line) what it cannot honour."""
    if not request.deepspeed_from:
        return None
    from accelerate import DeepSpeedPlugin

    asked = request.deepspeed_from
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        raise UsageError(
            f"{asked} asks for DeepSpeed ZeRO, but this run has one process and ZeRO shards over processes: start it "
            "with `accelerate launch --num_processes N` or `torchrun --nproc_per_node N`."
        )
    if args.save_steps != "none" or args.resume_from_checkpoint or args.stop_after_steps:
        what = (
            "--resume_from_checkpoint" if args.resume_from_checkpoint
            else "--stop_after_steps" if args.stop_after_steps else f"--save_steps {args.save_steps} (the default)"
            if args.save_steps == "epoch" else f"--save_steps {args.save_steps}"
        )  # fmt: skip
        raise UsageError(
            f"{asked} asks for DeepSpeed, which cannot save or resume a training state here ({what}): "
            f"{DEEPSPEED_STATE_REFUSAL}; pass --save_steps none (the final model is still saved as model.safetensors)."
        )
    plugin = DeepSpeedPlugin()
    config = plugin.deepspeed_config
    if plugin.zero_stage not in DEEPSPEED_STAGES:
        raise UsageError(
            f"{asked} asks for DeepSpeed ZeRO stage {plugin.zero_stage}: hf-vit-plus trains with ZeRO stage 2 "
            "(optimizer state and gradients sharded) or 3 (parameters too), the stages it tests; use FSDP (--fsdp) "
            "or DDP otherwise."
        )
    zero = config.get("zero_optimization", {})
    for key in ("offload_optimizer", "offload_param"):
        device = str((zero.get(key) or {}).get("device", "none")).lower()
        if device not in ("none", "auto") and on_cpu:
            raise UsageError(
                f"{asked} asks to offload {key.removeprefix('offload_').replace('param', 'parameters')} to {device}, "
                "but this run is on the CPU already (and DeepSpeed's offloading needs its compiled CPU Adam op): set "
                "the offload device to none."
            )
    for dtype in ("fp16", "bf16"):
        enabled = str((config.get(dtype) or {}).get("enabled")).lower() == "true"
        if on_cpu and (args.mixed_precision == dtype or enabled):
            raise UsageError(
                f"{asked} asks for {dtype} under DeepSpeed on the CPU, which hf-vit-plus does not honour (untested "
                "there; DeepSpeed's CPU runs here train in fp32): use --mixed_precision no, or FSDP for bf16."
            )
    wanted = {
        "train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "gradient_clipping": float(args.max_grad_norm or 0.0),
    }
    for key, value in wanted.items():
        current = config.get(key, "auto")
        if current == "auto" or (key == "gradient_accumulation_steps" and "ACCELERATE_DEEPSPEED_CONFIG_FILE" not in
                                 request.environ and str(current) == "1"):  # fmt: skip
            config[key] = value
        elif float(current) != float(value):
            option = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
                      "gradient_accumulation_steps": "--gradient_accumulation_steps",
                      "gradient_clipping": "--max_grad_norm"}[key]  # fmt: skip
            raise UsageError(
                f"{asked} sets {key} to {current} and the run asks for {option} {value}: make them equal, or set it "
                "to 'auto' in the DeepSpeed config."
            )
    plugin.gradient_accumulation_steps = args.gradient_accumulation_steps
    plugin.gradient_clipping = float(args.max_grad_norm or 0.0)
    if plugin.zero_stage == 3:  # the final model is gathered from the shards (Accelerator.get_state_dict)
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        plugin.zero3_save_16bit_model = True
    return plugin


def is_zero3(accelerator: Accelerator) -> bool:
    deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
    return deepspeed and accelerator.state.deepspeed_plugin.zero_stage == 3


@contextmanager
def keep_environment(*names: str) -> Iterator[None]:
    """Give `names` back their values on exit: an Accelerator built with a plugin sets ACCELERATE_USE_FSDP for the
    whole process, and the next run in the process would read it as a launcher's request."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def honour(accelerator: Accelerator, request: ParallelismRequest, plugin) -> None:
    """Make the freshly built `accelerator` do what `request` asks, or refuse (`UsageError`, one line)."""
    if request.fsdp:
        if accelerator.distributed_type == DistributedType.MULTI_CPU and accelerator.num_processes > 1:
            _drive_fsdp_on_cpu(accelerator, plugin)
        if not accelerator.is_fsdp2:
            if accelerator.num_processes == 1:
                why = (
                    "this run has one process and FSDP shards over processes: start it with `accelerate launch "
                    "--num_processes N` (with --multi_gpu or a config of distributed_type FSDP) or `torchrun "
                    "--nproc_per_node N`"
                )
            else:
                why = f"Accelerate set up {accelerator.distributed_type.value} instead"
            raise UsageError(f"{request.fsdp_from} asks to shard the model with FSDP, but {why}.")
    if request.deepspeed_from and accelerator.distributed_type != DistributedType.DEEPSPEED:
        raise UsageError(
            f"{request.deepspeed_from} asks for DeepSpeed, but Accelerate set up "
            f"{accelerator.distributed_type.value} instead."
        )
    if accelerator.mixed_precision == "fp16" and accelerator.device.type == "cpu":
        raise UsageError(
            "--mixed_precision fp16 needs a GPU: on the CPU Accelerate does not apply fp16 (the run would train in "
            "fp32); use bf16 or no."
        )


def _drive_fsdp_on_cpu(accelerator: Accelerator, plugin: FullyShardedDataParallelPlugin) -> None:
    """Accelerate's FSDP2 path runs on CPU (gloo), but `AcceleratorState` chooses FSDP only on accelerators and
    turns a CPU run into MULTI_CPU DDP. Set what it sets for FSDP (`AcceleratorState.__init__`): the plugin, the
    distributed type (kept in PartialState too) and the plugin's mixed precision."""
    state = accelerator.state
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState().distributed_type = DistributedType.FSDP
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)


# ---------------------------------------------------------------------------------------------- units and ties
def tied_module_groups(model: torch.nn.Module) -> list[list[str]]:
    """The names of the modules that share a parameter (tied embeddings), one list per shared parameter, the input
    embedding first."""
    owners: dict[int, list[str]] = defaultdict(list)
    # every name a module goes by: the seq2seq model's shared embedding is also its encoder's and decoder's
    for module_name, module in model.named_modules(remove_duplicate=False):
        for _, param in module.named_parameters(recurse=False):
            owners[id(param)].append(module_name)
    groups = [names for names in owners.values() if len(names) > 1]
    first = _module_name(model, getattr(model, "get_input_embeddings", lambda: None)())
    return [sorted(names, key=lambda name: name != first) for names in groups]


def _module_name(model: torch.nn.Module, module) -> str | None:
    for name, candidate in model.named_modules():
        if candidate is module:
            return name
    return None


def layer_classes(model: torch.nn.Module) -> list[str]:
    """The classes of the model's `_no_split_modules` that can be FSDP units on their own: those whose modules hold
    neither the input or output embedding nor a tied parameter."""
    return [name for name in getattr(model, "_no_split_modules", None) or [] if not _unit_conflicts(model, name)]


def _unit_conflicts(model: torch.nn.Module, class_name: str) -> list[str]:
    """What keeps the modules of `class_name` from being FSDP units: the embeddings and tied modules they hold."""
    special = {name for group in tied_module_groups(model) for name in group}
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, getter, lambda: None)()
        if module is not None:
            special.add(_module_name(model, module))
    conflicts = []
    for name, module in model.named_modules():
        if type(module).__name__ == class_name:
            conflicts += [s for s in special if s is not None and (s == name or s.startswith(f"{name}."))]
    return sorted(set(conflicts))


def prepare_model(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """Before the optimiser is built and `accelerator.prepare` shards the rest: choose the units (the model's
    layers, or check --fsdp_config's transformer_layer_cls_to_wrap) and shard each group of tied modules as one
    unit, with the arguments Accelerate gives `fully_shard`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    plugin = accelerator.state.fsdp_plugin
    if plugin.auto_wrap_policy is transformer_auto_wrap_policy:
        # none named: the model's layers (`accelerate config` answers the question of the classes with nothing by
        # default, which reaches the plugin as [""])
        names = [name.strip() for name in plugin.transformer_cls_names_to_wrap or [] if name.strip()]
        plugin.transformer_cls_names_to_wrap = names or layer_classes(model)
        present = {type(m).__name__ for m in model.modules()}
        for name in plugin.transformer_cls_names_to_wrap:
            if name not in present:
                raise UsageError(
                    f"transformer_layer_cls_to_wrap names {name!r}, which {type(model).__name__} does not have; its "
                    f"layers: {', '.join(getattr(model, '_no_split_modules', None) or []) or 'none'}."
                )
            if conflicts := _unit_conflicts(model, name):
                raise UsageError(
                    f"transformer_layer_cls_to_wrap names {name!r}, whose modules hold {', '.join(conflicts)} (an "
                    f"embedding or a tied weight, which must stay in a unit of their own): wrap "
                    f"{', '.join(layer_classes(model)) or 'nothing'} instead."
                )
    mesh = accelerator.torch_device_mesh
    kwargs = {
        "reshard_after_forward": False,  # used at the start and the end of the forward, then first in the backward
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
        "mesh": mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)] if mesh is not None else None,
    }
    for names in tied_module_groups(model):
        modules = {id(module): module for module in map(model.get_submodule, names)}  # one module may have aliases
        fully_shard(list(modules.values()), **kwargs)


# ---------------------------------------------------------------------------------- weights from the main process
class WeightsFromMainProcess:
    """FSDP2's cpu_ram_efficient_loading: the main process reads --model_name_or_path's weights, the others build the
    same model on the meta device (`families.base.weights_from_main_process`) and receive their shards once it is
    sharded, so that no process but the main one ever holds the whole model.

    Made (collective) once the model is built, before `prepare_model`: the processes check that they built the same
    layout (names and shapes; the meta model takes the dtypes the main process loaded), and the main process keeps
    its whole state dict. `prepare` replaces `accelerator.prepare(model, optimizer, scheduler)` (collective): it
    shards the model (a meta model stays on meta), gives the other processes empty storage for their shards
    (`to_empty`: FSDP2's sharded parameters keep their identity, so tied weights stay one parameter), copies the main
    process's weights in one tensor at a time (`set_model_state_dict` with full_state_dict and broadcast_from_rank0:
    each process keeps its shard), broadcasts the non-persistent buffers (position ids, masks: in no state dict),
    points the optimizer at the parameters by name (Accelerate maps them by storage address, which all meta tensors
    share), and gives every process the main process's RNG state, as each would have had after loading the model
    itself."""

    def __init__(self, accelerator: Accelerator, model: torch.nn.Module):
        from accelerate.utils import broadcast_object_list

        self.accelerator = accelerator
        layout = {name: (tuple(t.shape), t.dtype) for name, t in _named_tensors(model)}
        main = broadcast_object_list([layout if accelerator.is_main_process else None])[0]
        if not accelerator.is_main_process:
            _take_layout(model, layout, main)
        # the main process's weights, whole, until `prepare` has sent them (the model's tensors: no copy); a tied
        # weight under its first name only (torch sends each parameter once, and copies no other name into it)
        self.state = {}
        if accelerator.is_main_process:
            aliases = _tied_names(model)
            self.state = {name: value for name, value in model.state_dict().items() if name not in aliases}

    def prepare(self, model: torch.nn.Module, optimizer, scheduler):
        """`accelerator.prepare(model, optimizer, scheduler)`, then the weights sent; returns the three prepared."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        accelerator = self.accelerator
        names = {id(param): name for name, param in model.named_parameters()}
        groups = [[names[id(param)] for param in group["params"]] for group in optimizer.param_groups]
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        module = accelerator.unwrap_model(model)
        if not accelerator.is_main_process:
            module.to_empty(device=accelerator.device)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
        missing, unexpected = set_model_state_dict(module, self.state, options=options)
        self.state = {}
        if set(missing) - _tied_names(module) or unexpected:  # only a tied weight's other names may be left out
            raise RuntimeError(
                f"The main process's weights did not fit the sharded model: missing {sorted(set(missing))[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}."
            )
        for _, buffer in _non_persistent_buffers(module):
            _broadcast_from_main(buffer)
        params = dict(module.named_parameters())
        for group, group_names in zip(optimizer.param_groups, groups):
            group["params"] = [params[name] for name in group_names]
        rng = torch.get_rng_state().to(accelerator.device)
        _broadcast_from_main(rng)
        torch.set_rng_state(rng.cpu())
        return model, optimizer, scheduler


def _named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's parameters and buffers by name (a tied weight once)."""
    return [*model.named_parameters(), *model.named_buffers()]


def _take_layout(model: torch.nn.Module, layout: dict, main: dict) -> None:
    """Give the meta model (`layout`) the dtypes of the main process's (`main`); refuse another layout."""
    if layout.keys() != main.keys():
        differ = sorted(layout.keys() ^ main.keys())
        raise RuntimeError(
            f"The model built without its weights has other tensors than the main process's: {', '.join(differ[:5])}."
        )
    for name, tensor in _named_tensors(model):
        shape, dtype = main[name]
        if tuple(tensor.shape) != shape:
            raise RuntimeError(
                f"The model built without its weights has {name} of shape {tuple(tensor.shape)}, the main process's "
                f"{shape}."
            )
        if tensor.dtype != dtype:
            tensor.data = tensor.data.to(dtype)  # on the meta device: nothing is allocated


def _non_persistent_buffers(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The buffers a state dict leaves out, by name, in the same order on every process."""
    found = []
    for prefix, sub in module.named_modules():
        for name in sorted(sub._non_persistent_buffers_set):
            if sub._buffers.get(name) is not None:
                found.append((f"{prefix}.{name}" if prefix else name, sub._buffers[name]))
    return found


def _broadcast_from_main(tensor: torch.Tensor) -> None:
    """The main process's values into `tensor` on every process (in place)."""
    if tensor.dtype == torch.bool:  # gloo broadcasts no bool tensors
        tensor = tensor.view(torch.uint8)
    torch.distributed.broadcast(tensor, src=0)


# ------------------------------------------------------------------------------------------- what is in effect
def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def describe_parallelism(accelerator: Accelerator, from_main: bool = False) -> list[str]:
    """The first lines of a run (`plan.describe` adds the rest): distributed type, processes and machines, sharding
    (`from_main`: the pretrained weights came from the main process, `WeightsFromMainProcess`), precision."""
    world = accelerator.num_processes
    machines = count_machines(world)
    kind = accelerator.distributed_type
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
    where = accelerator.device.type.upper() if accelerator.device.type == "cpu" else accelerator.device.type
    names = {
        DistributedType.NO: "one process, no data parallelism",
        DistributedType.FSDP: "FSDP2 (torch's fully_shard through Accelerate's FSDP plugin)",
        DistributedType.DEEPSPEED: "DeepSpeed",
    }
    name = names.get(kind, "DDP (data parallel: every process holds the whole model)")
    lines = [
        f"Distributed: {name} [{kind.value}{f', {backend}' if backend else ''} on {where}], {world} process"
        f"{'es' if world > 1 else ''} on {machines} machine{'s' if machines > 1 else ''}"
    ]
    plugin = getattr(accelerator.state, "fsdp_plugin", None) if kind == DistributedType.FSDP else None
    if plugin is not None:
        state_dict_type = getattr(plugin.state_dict_type, "name", str(plugin.state_dict_type))
        wrap = "the model's layers (_no_split_modules)" if plugin.auto_wrap_policy is not None else "no layer units"
        lines.append(
            f"Sharding: parameters, gradients and optimizer state split over {world} processes; units: {wrap}, "
            f"tied weights together, the rest in the root; reshard after forward: "
            f"{'yes' if plugin.reshard_after_forward else 'no'}; checkpoints: "
            f"{'sharded (torch distributed checkpoint)' if state_dict_type == SHARDED_STATE_DICT else 'gathered'}"
            f"{'; pretrained weights: read by the main process only, sent to the others' if from_main else ''}"
        )
    elif kind == DistributedType.DEEPSPEED:
        stage = accelerator.state.deepspeed_plugin.zero_stage
        what = {2: "optimizer state and gradients", 3: "parameters, gradients and optimizer state"}.get(stage, "?")
        lines.append(
            f"Sharding: DeepSpeed ZeRO stage {stage}: {what} split over {world} processes"
            f"{'; parameters whole on every process' if stage == 2 else ''}; checkpoints: none (DeepSpeed's are "
            "pickles), the final model gathered into model.safetensors"
        )
    else:
        lines.append("Sharding: none")
    lines.append(f"Precision: {precision(accelerator, plugin)}")
    return lines


def count_machines(world: int) -> int:
    """Machines of the run: distinct (host, node rank) pairs over the processes (collective). The node rank
    (torchrun's GROUP_RANK) tells apart the launchers of one host, as in a test of a multi-machine recipe."""
    if world == 1 or not torch.distributed.is_initialized():
        return 1
    keys: list = [None] * world
    torch.distributed.all_gather_object(keys, (socket.gethostname(), os.environ.get("GROUP_RANK", "0")))
    return len(set(keys))


def precision(accelerator: Accelerator, plugin=None) -> str:
    policy = getattr(plugin, "mixed_precision_policy", None)
    if policy is not None:
        names = {dtype: name for name, dtype in DTYPES.items()}
        parts = [
            f"{label} {names.get(getattr(policy, key), 'fp32')}"
            for key, label in (("param_dtype", "compute"), ("reduce_dtype", "gradient reduction"))
        ]
        return f"FSDP2 mixed precision: {', '.join(parts)}; weights and optimizer state fp32 (sharded)"
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        config = accelerator.state.deepspeed_plugin.deepspeed_config
        enabled = [d for d in ("bf16", "fp16") if str((config.get(d) or {}).get("enabled")).lower() == "true"]
        return f"DeepSpeed {enabled[0]} (fp32 master weights)" if enabled else "fp32"
    if accelerator.mixed_precision in ("bf16", "fp16") and accelerator.native_amp:
        return f"{accelerator.mixed_precision} autocast; weights, gradients and optimizer state fp32"
    return "fp32"


def units(model: torch.nn.Module) -> str:
    """The FSDP units of a sharded model, e.g. '4 SparseTransformerLayer, 2 tied (Embedding, Linear), root'."""
    from torch.distributed.fsdp import FSDPModule

    counts = Counter(
        _original_class(m).__name__ for name, m in model.named_modules() if name and isinstance(m, FSDPModule)
    )
    return ", ".join(f"{n} {cls}" for cls, n in counts.items()) + f", root {_original_class(model).__name__}"


def _original_class(module) -> type:
    """A sharded module's own class (FSDP2 puts it under a class `FSDP<name>` of its own)."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(module)
    if not issubclass(cls, FSDPModule):
        return cls
    return next(base for base in cls.__mro__[1:] if not issubclass(base, FSDPModule))


def local_numel(tensor) -> int:
    """Elements this process holds of a (possibly sharded) tensor: FSDP2's local shard, DeepSpeed ZeRO-3's
    partition (`ds_tensor`)."""
    if hasattr(tensor, "ds_tensor"):
        return tensor.ds_tensor.numel()
    return tensor.to_local().numel() if hasattr(tensor, "to_local") else tensor.numel()


def local_bytes(model: torch.nn.Module, optimizer=None) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state that this process holds (its shards under FSDP)."""

    def size(tensor) -> int:
        return local_numel(tensor) * tensor.element_size()

    params = list(model.parameters())
    state = getattr(optimizer, "state", {}) if optimizer is not None else {}
    return {
        "parameters": sum(size(p) for p in params),
        "gradients": sum(size(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(size(t) for s in state.values() for t in s.values() if torch.is_tensor(t) and t.ndim > 0),
    }


def local_share(model: torch.nn.Module) -> float:
    """The share of the model's parameters that this process holds (1.0 without sharding)."""
    params = list(model.parameters())
    return sum(local_numel(p) for p in params) / max(1, sum(getattr(p, "ds_numel", p.numel()) for p in params))


# ------------------------------------------------------------------------------------------------ checkpoints
# How `accelerator.save_state` writes the model and the optimizer of a training state, by the layout's name in its
# training_state.json (`checkpoint_layout`); states saved before layouts were recorded are "replicated".
CHECKPOINT_LAYOUTS = {
    "replicated": "the whole model and optimizer state of a run without sharding (model.safetensors, optimizer.bin)",
    "fsdp-sharded": "FSDP2 shards in torch distributed checkpoints (pytorch_model_fsdp_0/, optimizer_0/)",
    "fsdp-full": "FSDP2 weights and optimizer state gathered into one file each (state_dict_type FULL_STATE_DICT)",
    "deepspeed": "DeepSpeed's own checkpoint",
}


def checkpoint_layout(accelerator: Accelerator) -> str:
    """The `CHECKPOINT_LAYOUTS` name of the training states this run saves and reads."""
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        return "deepspeed"
    if not accelerator.is_fsdp2:
        return "replicated"
    state_dict_type = accelerator.state.fsdp_plugin.state_dict_type
    return "fsdp-sharded" if getattr(state_dict_type, "name", state_dict_type) == SHARDED_STATE_DICT else "fsdp-full"


def reload_sharded_optimizer(accelerator: Accelerator, model, optimizer, checkpoint: Path) -> bool:
    """Read the sharded optimizer state of `checkpoint` again when `accelerator.load_state` left the optimizer
    without state, and say whether it did. Accelerate 1.10 reads an FSDP2 state into `optimizer.state_dict()`, which
    holds no moments before the first step: Adam's moments and step count were silently dropped and the resumed run
    diverged. Later releases read it into `get_optimizer_state_dict`, as here (a feature test: nothing to do when
    the optimizer has its state back)."""
    if optimizer.state:
        return False
    import torch.distributed.checkpoint as dist_cp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    plugin = accelerator.state.fsdp_plugin
    options = StateDictOptions(cpu_offload=getattr(plugin.state_dict_config, "offload_to_cpu", False))
    inner = getattr(optimizer, "optimizer", optimizer)  # under Accelerate's wrapper
    state = {"optimizer": get_optimizer_state_dict(model, inner, options=options)}  # the moments, zero until read
    dist_cp.load(state_dict=state, storage_reader=dist_cp.FileSystemReader(str(checkpoint / "optimizer_0")))
    set_optimizer_state_dict(model, inner, state["optimizer"], options=options)
    return True


# ------------------------------------------------------------------------------------------- the final model
def trained_model(accelerator: Accelerator, model) -> tuple[torch.nn.Module | None, dict]:
    """The trained model as one ordinary module, and its state dict (collective: every process calls it). Without
    sharding (and under DeepSpeed ZeRO-2), the unwrapped model on every process. Under FSDP and DeepSpeed ZeRO-3, a
    copy of the model's own class that holds the gathered weights, on the main process (None on the others, whose
    state dict is empty)."""
    state_dict = accelerator.get_state_dict(model)
    unwrapped = accelerator.unwrap_model(model)
    if is_zero3(accelerator):  # the weights gathered on the main process; the module holds its partitions only
        if not accelerator.is_main_process:
            return None, state_dict
        plain = type(unwrapped)(copy.deepcopy(unwrapped.config))
        plain.load_state_dict(state_dict, strict=False)  # a tied weight may come once (DeepSpeed gathers it once)
        plain.tie_weights()
        missing = set(plain.state_dict()) - set(state_dict) - _tied_names(plain)
        if missing:
            raise RuntimeError(f"DeepSpeed ZeRO-3 gathered no value for {sorted(missing)}.")
        plain.train(unwrapped.training)
        return plain, plain.state_dict()
    if accelerator.distributed_type == DistributedType.DEEPSPEED:  # ZeRO-2: whole parameters on every process
        return unwrapped, unwrapped.state_dict()  # (Accelerate's copy of each tensor would untie the tied ones)
    if not is_sharded(unwrapped):
        return unwrapped, state_dict
    if not accelerator.is_main_process:
        return None, state_dict
    plain = _unsharded_copy(unwrapped)
    plain.load_state_dict(state_dict, strict=True)
    plain.train(unwrapped.training)
    return plain, plain.state_dict()


def _unsharded_copy(model) -> torch.nn.Module:
    """A fresh model of `model`'s own classes and config, not sharded: the model's class from its config, and for a
    PEFT model (LoRA) that base wrapped again with the same adapter config, so that the gathered state dict (the
    adapter's weights included) loads into it by name."""
    from .lora import is_peft_model, with_same_adapter

    if not is_peft_model(model):
        return _original_class(model)(copy.deepcopy(model.config))
    base = model.get_base_model()
    return with_same_adapter(model, _original_class(base)(copy.deepcopy(base.config)))


def _tied_names(model: torch.nn.Module) -> set[str]:
    """The state-dict names of the weights that share their tensor with an earlier name."""
    seen, tied = set(), set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.add(id(param))
    return tied
