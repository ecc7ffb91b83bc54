"""The compiled steps of the fused decoding step (`fast_decoding.py`): how a `FastDecoder` step method becomes a
compiled graph, which compiled step serves which call, and how a step is kept on disk and loaded.

- `_Steps`: the compiled steps of one decoder, one per method and shape class (`_shape_key`), built at first use by
  AOTInductor (the default), torch.compile or not at all ("eager"); with a step cache, an AOTInductor step is kept
  on disk (`step_cache.py`, its key including `_options_identity`) and the next process loads it;
- `_batch_range` and `_dynamic_shapes`: the classes of batch sizes one step serves and the dimensions that vary in
  its compiled code (the cache and source lengths, the batch within its class);
- `aoti_package`, `aoti_load`, `aoti_compile`: AOTInductor's package of a module without its weights, loaded with
  the module's own tensors as user-managed constants; `compile_options`: the inductor options of the step;
- `step_counts`: the steps this process compiled and loaded.

This module ships with the checkpoints (remote code): it imports only torch and its siblings.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import itertools
import logging
import os
import time
from pathlib import Path

import torch
from torch import nn

from .compat import aoti_flat_call, export_program
from .compiled_decoding import row_matmul_pass
from .fast_kernels import SMALL_ROWS, cpp_kernels
from .fast_layers import FastDecoder

# The engine's logger (`fast_decoding`): the INFO lines that say which step is compiled or loaded from where are the
# engine's, so that a logging setting for the engine covers them.
logger = logging.getLogger(__name__.rpartition(".")[0] + ".fast_decoding")


def compile_options(device: str | torch.device = "cpu") -> dict:
    """inductor options of the fused step: on CPU the products of at most `SMALL_ROWS` rows become loops that read
    each weight once at memory speed (`row_matmul_pass`, as in compiled_decoding.py)."""
    if torch.device(device).type == "cpu":
        return {"post_grad_custom_post_pass": row_matmul_pass(SMALL_ROWS)}
    return {}


class _Step(nn.Module):
    """One step method of a `FastDecoder` as a module (what torch.export takes), its Python-number arguments fixed."""

    def __init__(self, decoder: FastDecoder, method: str, **constants):
        super().__init__()
        self.decoder = decoder
        self.method = method
        self.constants = constants

    def forward(self, *args):
        return getattr(self.decoder, self.method)(*args, **self.constants)


class _EncoderGraph(nn.Module):
    """`FastEncoder.hidden_states` as a module (what torch.export takes), its attention kernel fixed."""

    def __init__(self, encoder: nn.Module, kernel: str):
        super().__init__()
        self.encoder = encoder
        self.kernel = kernel

    def forward(self, input_ids, mask):
        return self.encoder.hidden_states(input_ids, mask, self.kernel)


def _source_range(length: int, max_positions: int) -> tuple[int, int]:
    """The source lengths one compiled encoder serves: at most `SHORT_CPU_SEQUENCE` tokens, or more (up to the
    model's positions): the attention kernel the model chooses may differ between them, and a compiled graph's is
    fixed."""
    from .attention import SHORT_CPU_SEQUENCE

    short = min(SHORT_CPU_SEQUENCE, max_positions)
    return (2, short) if length <= short else (short + 1, max_positions)


def _batch_range(batch: int, group: int, static_small_rows: bool = False) -> tuple[int, int | None]:
    """The batch sizes (sources) that one compiled step serves, for `group` rows per source (beams): those whose rows
    (batch x group) take the same products (`FastLinear.kernel`) and the same greedy choice (the output screen):
    one row; at most `SMALL_ROWS` rows; more (no upper bound: None). A batch of one is a class of its own (torch.export
    specializes a size of 1); so is each batch of at most `SMALL_ROWS` rows where those products are loops over a
    fixed number of rows (`static_small_rows`: `row_matmul_pass`)."""
    rows = batch * group
    if batch == 1:
        return 1, 1
    if rows <= SMALL_ROWS:
        return (batch, batch) if static_small_rows else (2, SMALL_ROWS // group)
    return max(2, SMALL_ROWS // group + 1), None


def _step_sizes(method: str, args) -> tuple[int, int, int]:
    """(batch, rows per source, decoder layers) of a step's arguments."""
    if method == "greedy_step":  # tokens, position, cache, cross, source_bias, unfinished, pad, controls
        return args[0].shape[0], 1, len(args[2])
    running = args[4][0]  # position, cache, cross, source_bias, state (running, ...), denominators, controls
    return running.shape[0], running.shape[1], len(args[1])


def _shape_key(method: str, args, constants: dict, dynamic: bool, static_small_rows: bool = False, batch=None):
    """What selects a compiled step: the method, its fixed Python numbers and the shapes of its tensors, and torch's
    threads (inductor writes its loops for the threads of the process that compiles them). Dynamic (AOTInductor):
    the class of batch sizes (`_batch_range`) and the rows per source instead of the shapes (the cache and source
    lengths and the batch vary in the compiled code); `batch` asks for another batch size than that of `args`."""
    leaves = _leaves(args)
    if dynamic:
        size, group, layers = _step_sizes(method, args)
        shapes = (_batch_range(size if batch is None else batch, group, static_small_rows), group, layers)
    elif batch is None:
        shapes = tuple(tuple(t.shape) for t in leaves)
    else:
        return None  # a batch that is not the arguments': a shape compiled only when it comes
    dtypes = tuple(t.dtype for t in leaves)
    return method, tuple(sorted(constants.items())), shapes, dtypes, torch.get_num_threads()


def _leaves(tree) -> list:
    """pytree's leaves of `tree` (`tree_leaves`), walked directly where it is tuples and lists of tensors (a step's
    arguments: the walk runs at every call, and pytree's costs tens of microseconds)."""
    out = []
    stack = [iter(tree)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, torch.Tensor):
                out.append(item)
            elif type(item) in (tuple, list):
                stack.append(iter(item))
                break
            else:
                return torch.utils._pytree.tree_leaves(tree)
        else:
            stack.pop()
    return out


def _axes(**axes) -> dict | None:
    """A `dynamic_shapes` entry: {axis: Dim} of the axes that vary (None: a static tensor)."""
    entry = {int(axis[1:]): dim for axis, dim in axes.items() if dim is not None}
    return entry or None


def _dynamic_shapes(method: str, args, batch_range: tuple[int, int | None] = (1, 1)) -> tuple:
    """torch.export's `dynamic_shapes` of a step's arguments: the self-attention cache's length L and the source
    length S vary (both at least 2: the caller pads), and the batch B over `batch_range` (rows: B x beams), so that
    one compiled step serves every length and every batch of its class."""
    from torch.export import Dim

    length, source = Dim("cache_length", min=2), Dim("source_length", min=2)
    low, high = batch_range
    batch = None
    if low != high:
        batch = Dim("batch", min=low) if high is None else Dim("batch", min=low, max=high)
    if method == "greedy_step":  # tokens, position, cache, cross, source_bias, unfinished, pad, controls
        rows = _axes(a0=batch)
        cache = [_axes(a0=batch, a1=length)] * len(args[2])
        cross, bias = _axes(a2=batch, a3=source), _axes(a0=batch, a1=source)
        return ((rows, None, cache, cross, bias, rows, None, (None,) * len(args[7])),)
    # position, cache, cross, source_bias, state, denominators, controls
    beams = args[4][0].shape[1]
    rows = None if batch is None else beams * batch
    cache = [_axes(a0=rows, a1=length)] * len(args[1])
    cross, bias = _axes(a2=batch, a3=source), _axes(a0=batch, a1=source)
    sequences, indices, per_source = _axes(a0=batch, a2=length + 1), _axes(a0=batch, a2=length), _axes(a0=batch)
    history = _axes(a0=rows, a1=length)
    state = (sequences, per_source, indices, sequences, per_source, indices, per_source, per_source, history)
    return ((None, cache, cross, bias, state, {1: length + 2}, (None,) * len(args[6])),)


# Steps this process compiled and loaded from disk ("compiled", "loaded"), over every FastDecoding
step_counts: collections.Counter = collections.Counter()


class _Steps:
    """The compiled steps of one `FastDecoder`, one per method and shape class (`_shape_key`):

    - "aoti" (the default): the step is exported (`torch.export`) and compiled by AOTInductor into a shared library,
      called from C++: no Dynamo and no guard between tokens. The library holds no weights: they are the decoder's
      own tensors, passed as user-managed constants (float32: the model's parameters themselves). The cache and
      source lengths and the batch size (within its class, `_batch_range`) are dynamic. With `cache_dir`, the
      compiled package is kept there (`step_cache.py`) and loaded by the next process instead of compiled.
    - "compile": `torch.compile(fullgraph=True, dynamic=False)`; `skip_guards=True` runs the calls after the first of
      each `generate` under `torch.compiler.set_stance(skip_guard_eval_unsafe=True)`.
    - "eager": the same step without compilation (for checks)."""

    def __init__(
        self, decoder: FastDecoder, backend: str, options: dict, skip_guards: bool, cache_dir=None, identity=None
    ):
        self.decoder = decoder
        self.backend = backend
        self.options = options
        self.skip_guards = skip_guards
        self.cache_dir = cache_dir
        self.identity = identity  # () -> the model's weights digest (`step_cache.weights_digest`), asked once
        self._weights = None
        self._tensors = None  # (name, shape, dtype) of the decoder's parameters and buffers, for the package's key
        self._paths: dict = {}  # shape key -> its package's path (asked at many steps: is a smaller batch's kept?)
        self.runners: dict = {}

    def _key(self, method: str, args: tuple, constants: dict, batch=None):
        static = self.decoder.static_small_rows
        return _shape_key(method, args, constants, self.backend == "aoti", static, batch)

    def available(self, method: str, args: tuple, batch: int, **constants) -> bool:
        """Whether the step of `method` for `batch` sources (otherwise like `args`) runs without compiling: built
        already, kept on disk, or uncompiled (backend "eager")."""
        if self.backend == "eager":
            return True
        key = self._key(method, args, constants, batch)
        if key is None:
            return False
        if key in self.runners:
            return True
        return self.backend == "aoti" and self.cache_dir is not None and self._package_path(key).is_file()

    def get(self, method: str, args: tuple, **constants):
        """The runner of `method` for arguments shaped like `args`, built (compiled or loaded) at its first use."""
        key = self._key(method, args, constants)
        runner = self.runners.get(key)
        if runner is None:
            module = _Step(self.decoder, method, **constants)
            if self.backend == "aoti":
                runner = self._aoti_runner(key, module, args)
                runner = aoti_flat_call(runner) or runner
            elif self.backend == "compile":
                runner = _compiled_runner(module, args, self.options, len(self.runners))
            else:
                runner = module
            self.runners[key] = runner
        return runner

    def encoder_runner(self, encoder: nn.Module, kernel: str, length: int):
        """The compiled `encoder.hidden_states` (a `FastEncoder`) for sources of `length` tokens with the attention
        `kernel`, called as `runner(input_ids, mask)`: one per class of batch sizes (one source; more) and of lengths
        (`_source_range`), the batch and length dynamic within it, built (compiled, or loaded from the step cache) at
        its first use; None with a backend other than "aoti" (the encoder's own layers run). `FastEncoder.forward`
        asks for it."""
        if self.backend != "aoti":
            return None
        return lambda input_ids, mask: self._encoder_call(encoder, kernel, length, input_ids, mask)

    def _encoder_call(self, encoder, kernel, length, input_ids, mask):
        batch = (1, 1) if input_ids.shape[0] == 1 else (2, None)
        sources = _source_range(length, encoder.stack.max_positions)
        key = ("encoder", (("kernel", kernel),), (batch, sources), (input_ids.dtype,), torch.get_num_threads())
        runner = self.runners.get(key)
        if runner is None:
            from torch.export import Dim

            module = _EncoderGraph(encoder, kernel)
            length_dim = Dim("source_length", min=sources[0], max=sources[1])
            batch_dim = None if batch == (1, 1) else Dim("batch", min=2)
            ids = {1: length_dim} if batch_dim is None else {0: batch_dim, 1: length_dim}
            dynamic_shapes = (ids, {3: length_dim} if batch_dim is None else {0: batch_dim, 3: length_dim})
            sizes = "1" if batch == (1, 1) else "2+"
            what = f"the encoder ({self.decoder.precision}, batch {sizes}, sources of {sources[0]}-{sources[1]})"
            runner = self._aoti_module(key, module, (input_ids, mask), dynamic_shapes, what)
            runner = aoti_flat_call(runner) or runner
            self.runners[key] = runner
        return runner(input_ids, mask)

    def _package_path(self, key, module: nn.Module | None = None):
        path = self._paths.get(key)
        if path is None:
            path = self._paths[key] = self._new_package_path(key, module)
        return path

    def _new_package_path(self, key, module: nn.Module | None = None):
        from .step_cache import step_key

        if self._weights is None:
            self._weights = self.identity() if self.identity is not None else ""
        method, constants, shapes, dtypes, _ = key
        parts = dict(method=method, constants=constants, shapes=shapes, dtypes=dtypes, weights=self._weights)
        parts.update(precision=self.decoder.precision, options=_options_identity(self.options))
        # the tensors the package takes as its constants (e.g. the output screen's, which screened_greedy=False leaves
        # out): a package is loaded only by a decoder (or encoder) that holds each of them
        if module is not None:
            named = itertools.chain(module.named_parameters(), module.named_buffers())
            parts.update(tensors=sorted((name, tuple(t.shape), str(t.dtype)) for name, t in named))
        else:
            if self._tensors is None:
                named = itertools.chain(self.decoder.named_parameters(), self.decoder.named_buffers())
                self._tensors = sorted((name, tuple(t.shape), str(t.dtype)) for name, t in named)
            parts.update(tensors=self._tensors)
        # the ops the step calls: the C++ kernels' (`hf_vit_plus_cpp::...`) where they are built, else the Python ones
        # (asked of the module, as the decoder's products ask it when they choose their op)
        kernels = importlib.import_module(cpp_kernels.__module__)
        parts.update(cpp_kernels=(kernels.cpp_fbgemm_ops(), tuple(kernels.cpp_kernels())))
        return Path(self.cache_dir) / step_key(**parts)

    def _aoti_runner(self, key, module: nn.Module, args: tuple):
        (low, high), group = key[2][0], key[2][1]
        sizes = f"{low}" if low == high else f"{low}-{high}" if high is not None else f"{low}+"
        what = f"the {key[0].replace('_step', '')} step ({self.decoder.precision}, batch {sizes}"
        what += f" x {group} beams)" if group > 1 else ")"
        return self._aoti_module(key, module, args, _dynamic_shapes(key[0], args, key[2][0]), what)

    def _aoti_module(self, key, module: nn.Module, args: tuple, dynamic_shapes, what: str):
        """`module` compiled by AOTInductor for `args` (`dynamic_shapes`), or loaded from the step cache; logged as
        `what`."""
        if self.cache_dir is None:
            started = time.perf_counter()
            logger.info("FastDecoding: compiling %s (not kept: no step cache)", what)
            runner = aoti_compile(module, args, dynamic_shapes, self.options)
            step_counts["compiled"] += 1
            logger.info("FastDecoding: compiled %s in %.1f s", what, time.perf_counter() - started)
            return runner
        from .step_cache import load_or_build

        path = self._package_path(key, None if isinstance(module, _Step) else module)
        started = time.perf_counter()

        def build(target: str) -> None:
            logger.info("FastDecoding: compiling %s, once per machine, into %s", what, path)
            aoti_package(module, args, dynamic_shapes, self.options, target)
            step_counts["compiled"] += 1

        runner, built = load_or_build(path, build, functools.partial(aoti_load, module))
        if built:
            logger.info("FastDecoding: compiled %s in %.1f s", what, time.perf_counter() - started)
        else:
            step_counts["loaded"] += 1
            logger.info("FastDecoding: loaded %s from %s in %.2f s", what, path, time.perf_counter() - started)
        return runner

    def loop_context(self):
        """The context of the calls after the first of a `generate` call."""
        if self.backend == "compile" and self.skip_guards:
            return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
        return contextlib.nullcontext()


def _options_identity(options: dict) -> dict:
    """inductor options as text for a step's key (a custom pass by its own `uuid`)."""
    out = {}
    for name, value in sorted(options.items()):
        uuid = getattr(value, "uuid", None)
        out[name] = uuid().hex() if callable(uuid) else repr(value)
    return out


def aoti_package(module: nn.Module, args: tuple, dynamic_shapes, options: dict | None, path: str) -> str:
    """`module` exported with `args` (`torch.export`, `dynamic_shapes` as it takes them) and compiled by AOTInductor
    with the inductor `options` (default `compile_options()`) into the package `path`, without its parameters and
    buffers (`aoti_load` passes the module's own tensors)."""
    import torch._inductor

    options = compile_options() if options is None else options
    exported = export_program(module, args, dynamic_shapes=dynamic_shapes, strict=False)
    configs = {**options, "aot_inductor.package_constants_in_so": False}
    return torch._inductor.aoti_compile_and_package(exported, package_path=path, inductor_configs=configs)


def aoti_load(module: nn.Module, path: str):
    """The AOTInductor package at `path` (`aoti_package`) loaded, its constants the tensors of `module` (user-managed:
    not copied)."""
    import torch._inductor

    runner = torch._inductor.aoti_load_package(path)
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    constants = {name: tensors[name] for name in runner.get_constant_fqns()}
    runner.load_constants(constants, check_full_update=True, user_managed=True)
    return runner


def aoti_compile(module: nn.Module, args: tuple, dynamic_shapes=None, options: dict | None = None):
    """`module` exported with `args` (`torch.export`, `dynamic_shapes` as it takes them), compiled by AOTInductor
    with the inductor `options` (default `compile_options()`) and loaded; its parameters and buffers are not copied
    into the library but passed as user-managed constants (the module's own tensors). Returns the callable."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hf_vit_plus_fast_decoding_") as folder:
        path = aoti_package(module, args, dynamic_shapes, options, os.path.join(folder, "step.pt2"))
        return aoti_load(module, path)


def _compiled_runner(module: nn.Module, args: tuple, options: dict, compiled_so_far: int):
    """`module` under torch.compile, compiled now on `args` (each shape is one more entry of the same code object:
    torch's recompile limit is raised to hold them all)."""
    import torch._dynamo

    compiled = torch.compile(module, fullgraph=True, dynamic=False, options=options)
    limit = max(torch._dynamo.config.recompile_limit, compiled_so_far + 2)
    with torch._dynamo.config.patch(recompile_limit=limit):
        compiled(*copy_args(args))
    return compiled


def copy_args(args):
    """A copy of the tensors of `args` (a trial call must not write into the caller's cache)."""
    return torch.utils._pytree.tree_map(lambda t: t.clone() if torch.is_tensor(t) else t, args)


__all__ = ["aoti_compile", "aoti_load", "aoti_package", "compile_options", "copy_args", "step_counts"]
