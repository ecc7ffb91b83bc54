"""Compiled decoding steps kept on disk, so that a process loads what an earlier one compiled for the same weights,
shapes, torch and instruction set.

`FastDecoding` compiles each step with AOTInductor into a package (`.pt2`, a zip archive holding a shared library
and no weights); compiling takes seconds to minutes, loading a fraction of a second. A package is kept under
`step_cache_dir()` (beside the C++ kernels, `fast_kernels.kernel_cache_dir()`), named by a digest of everything its
code depends on (`step_key`): the model's weights and config, the step and its shape class, the precision and dtypes,
torch's threads, torch's and Python's versions, the instruction set in use (`cpu_isa.isa_label()`) and the source of
the modules that the step traces.

A package is written under a temporary name in the same folder and renamed when complete (`os.replace`), so that a
process killed while compiling leaves no half file that another would load. A package that is damaged all the same
(its archive's checksums fail, or it does not load) is compiled again, with one warning line (`load_or_build`).

This module ships with the checkpoints (remote code): it imports only torch and its siblings.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from .cpu_isa import isa_label
from .fast_kernels import kernel_cache_dir

logger = logging.getLogger(__name__)

T = TypeVar("T")
# The modules whose code a compiled step runs (a change to any of them is a new key).
TRACED_SOURCES = (
    "fast_decoding.py",
    "fast_layers.py",
    "fast_steps.py",
    "fast_kernels.py",
    "fast_kernels.cpp",
    "decoding_rules.py",
    "compiled_decoding.py",
    "layers.py",
    "attention.py",
)
STEP_CACHE_ENV = "HF_VIT_PLUS_STEP_CACHE"
# Config entries that say where a model comes from, not what it computes (saving and loading set them).
CONFIG_METADATA = frozenset(
    {"_name_or_path", "_commit_hash", "architectures", "transformers_version", "dtype", "torch_dtype", "auto_map"}
    | {"custom_pipelines", "_attn_implementation_autoset"}
)
# What a kept package's name starts with (a package being written: ".tmp.pt2" at its end, see `load_or_build`).
PACKAGE_PREFIX = "step-"


def step_cache_dir(environ=None) -> Path:
    """Where compiled steps are kept: `HF_VIT_PLUS_STEP_CACHE`, else `steps/` in the C++ kernels' folder
    (`fast_kernels.kernel_cache_dir`, which follows HF_VIT_PLUS_KERNEL_CACHE, TORCH_EXTENSIONS_DIR and HF_HOME)."""
    environ = os.environ if environ is None else environ
    if environ.get(STEP_CACHE_ENV):
        return Path(environ[STEP_CACHE_ENV]).expanduser()
    return kernel_cache_dir(environ) / "steps"


def _source_digest() -> str:
    digest = hashlib.sha256()
    folder = Path(__file__).parent
    for name in TRACED_SOURCES:
        path = folder / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.is_file() else b"-")
    return digest.hexdigest()


_SOURCE_DIGEST: str | None = None


def source_digest() -> str:
    """A digest of `TRACED_SOURCES` (read once per process)."""
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is None:
        _SOURCE_DIGEST = _source_digest()
    return _SOURCE_DIGEST


def weights_digest(model: torch.nn.Module) -> str:
    """A digest of `model`'s parameters and buffers (names, shapes, dtypes and bytes) and of its config."""
    digest = hashlib.sha256()
    config = getattr(model, "config", None)
    if config is not None:
        settings = {key: value for key, value in config.to_dict().items() if key not in CONFIG_METADATA}
        digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in tensors:
        if tensor is None:
            continue
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(memoryview(data.view(torch.uint8).numpy()))
    return digest.hexdigest()


def step_key(**parts) -> str:
    """The name of a kept package: a digest of `parts` (the step, its shapes, the model's `weights_digest`, ...) with
    torch's and Python's versions, the instruction set, torch's threads and `source_digest()`."""
    described = {
        **parts,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "isa": isa_label(),
        "threads": torch.get_num_threads(),
        "sources": source_digest(),
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return PACKAGE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32] + ".pt2"


def _intact(path: Path) -> bool:
    """Whether the archive at `path` reads back whole (every member's checksum)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def load_or_build(path: Path, build: Callable[[str], None], load: Callable[[str], T]) -> tuple[T, bool]:
    """`load(path)` of the package kept at `path`, else `build(temporary)` writing it under a temporary name in the
    same folder, renamed to `path` once complete, then loaded. A package at `path` that is damaged (its checksums, or
    `load` raises) is built again, with one warning. Returns what `load` returns and whether it was built."""
    path = Path(path)
    if path.is_file():
        error = None if _intact(path) else "its archive is damaged"
        if error is None:
            try:
                return load(str(path)), False
            except Exception as exc:  # a package this torch cannot load: build it again
                error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        logger.warning("The compiled step %s could not be loaded (%s): compiling it again.", path, error)
        with contextlib.suppress(OSError):
            path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(handle)
    try:
        build(temporary)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp's file is the owner's alone; a kept package is not
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return load(str(path)), True


__all__ = ["STEP_CACHE_ENV", "load_or_build", "source_digest", "step_cache_dir", "step_key", "weights_digest"]
