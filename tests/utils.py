"""Helpers shared by the tests: processes with and without the package, forked training processes, folder
snapshots, tiny models."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

from PIL import Image

REPO_ROOT = Path(__file__).resolve().parent.parent


# Python code that makes `hf_vit_plus` unimportable in the process that runs it first (the package is installed
# editable into the venv): an import raises ModuleNotFoundError, as on a machine without it. It hides the package and
# nothing else: by module name (a meta path finder ahead of every other, the editable install's included), and by
# the package's own folders exactly (the package folder, and the checkout that holds it when that is not a site
# directory), never by a path's text, since a checkout named `hf_vit_plus` holds the venv's site-packages too.
BLOCK_PACKAGE = textwrap.dedent(
    """
    import importlib.util as _util, os as _os, site as _site, sys
    def _package_folders():
        try:
            spec = _util.find_spec("hf_vit_plus")  # a top-level spec: nothing of the package runs
        except (ImportError, ValueError):
            spec = None
        sites = {_os.path.realpath(p) for p in [*_site.getsitepackages(), _site.getusersitepackages()]}
        folders = set()
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            folders.add(_os.path.realpath(location))
            if _os.path.realpath(_os.path.dirname(location)) not in sites:
                folders.add(_os.path.realpath(_os.path.dirname(location)))
        return folders
    _folders = _package_folders()
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name == "hf_vit_plus" or name.startswith("hf_vit_plus."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None
    sys.meta_path.insert(0, _Block())
    sys.path = [p for p in sys.path if _os.path.realpath(p or _os.curdir) not in _folders]
    del _package_folders, _folders
    """
)


def load_script(relative_path: str):
    """A script of the repository (e.g. "scripts/benchmarks/bench_vit.py") loaded as a module, without running its
    `main`: registered in sys.modules under its file name, since dataclasses look their module up while it runs."""
    path = REPO_ROOT / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_without_package(
    code: str, cwd: Path, env: dict | None = None, timeout: int = 300, python: str | None = None
) -> dict:
    """Run `code` in a fresh Python process where `hf_vit_plus` is NOT importable (a user without the package),
    offline, with a fresh modules cache. The code must print one JSON line last; it is returned parsed.
    `python`: another interpreter (another environment's releases) instead of this one.

    The package is installed editable into the venv, so the process blocks it explicitly: an import of
    `hf_vit_plus` raises ModuleNotFoundError, as on a machine without it.
    """
    prelude = BLOCK_PACKAGE
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    full_env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "HF_MODULES_CACHE": str(Path(cwd) / "modules_cache"),
            "HF_HOME": str(Path(cwd) / "hf_home"),
            "PYTHONPATH": "",
            "OMP_NUM_THREADS": "1",
        }
    )
    full_env.update(env or {})
    proc = subprocess.run(
        [python or sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    last = [line for line in proc.stdout.splitlines() if line.strip()][-1]
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        raise AssertionError(f"the subprocess's last line is not JSON:\n{proc.stdout[-3000:]}") from None


def run_with_package(code: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> dict:
    """Run `code` in a fresh Python process with the package installed (a client of the loopback Hub: pass
    `hub_server.env()` as `env`), with its own HF_HOME under `cwd` and one thread. The code must print one JSON line
    last; it is returned parsed."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    full_env.update({"HF_HOME": str(Path(cwd) / "hf_home"), "OMP_NUM_THREADS": "1", **(env or {})})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full_env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"client failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads([line for line in proc.stdout.splitlines() if line.strip()][-1])


@contextlib.contextmanager
def run_report():
    """The lines a training run reports (the package's INFO logs, `hf_vit_plus.training.loop`) while the block runs:
    a `StringIO` with each record's message on a line."""
    from hf_vit_plus.utils import logging as package_logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(package_logging.ROOT_LOGGER)
    logger.addHandler(handler)
    previous = logger.level
    package_logging.set_verbosity_info()
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def folder_snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder` with its sha256 and mtime: equal snapshots = an untouched folder."""
    return {
        p.relative_to(folder).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ------------------------------------------------------------------------------------------------- tiny models
# --config_overrides of a tiny ViT for the command line and the training loop (the data sets the image size)
# What the installed `hf-vit-plus` script runs, for `python -c`: the command, with the script's name as the program
# (which `import hf_vit_plus` reads to leave the Auto registration to the command: hf_vit_plus/__init__.py).
COMMAND_CODE = "import sys; sys.argv[0] = 'hf-vit-plus'; from hf_vit_plus.cli import main; sys.exit(main())"

TINY_VIT_OVERRIDES = "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64"
# the width and depth of the tiny image models (`tiny_image_model`)
TINY_IMAGE_MODEL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def tiny_image_model(
    attention_type: str = "strided", height: int = 6, width: int = 5, channels: int = 1, seed: int = 0, **overrides
):
    """A Sparse Transformer image model (`SparseTransformerConfig.for_images`) of `TINY_IMAGE_MODEL`'s size, seeded,
    in eval mode."""
    import torch

    from hf_vit_plus import SparseTransformerConfig, SparseTransformerForImageGeneration

    torch.manual_seed(seed)
    config = SparseTransformerConfig.for_images(
        height, width, channels, attention_type=attention_type, **{**TINY_IMAGE_MODEL, **overrides}
    )
    return SparseTransformerForImageGeneration(config).eval()


def random_pixels(batch: int, channels: int, height: int, width: int, seed: int = 1):
    """Integer images (batch, channels, height, width), uint8 values 0..255, from a seeded generator."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, channels, height, width), generator=g, dtype=torch.uint8)


def open_png(path) -> Image.Image:
    """The PNG file `path`, loaded; a nearly blank figure (grey levels with a standard deviation <= 10) fails."""
    import numpy as np

    with Image.open(path) as image:
        assert image.format == "PNG", f"{path} is a {image.format}, not a PNG"
        image.load()
        pixels = np.asarray(image.convert("L"), dtype=np.float64)
        assert pixels.std() > 10, f"{path} is nearly blank"
        return image


def launch_processes(function, args: tuple, workdir: Path, num_processes: int = 2) -> None:
    """`accelerate.debug_launcher(function, args, num_processes)` (forked processes, file rendezvous), run a second
    time, in `workdir` as it was before, when a process was killed by a signal, with a warning naming it.

    One CI run (torch 2.15.0, a fresh environment, the tenth forked test of the session) lost a process of the FSDP
    precision test to a SIGSEGV in a native thread (gloo's or OpenMP's: faulthandler showed only the main thread, in
    pure Python); it passed alone and in two full reruns of the distributed tests. A crash that repeats still fails;
    a process that fails an assertion or raises (exit code 1) fails at once, without a second run.
    """
    from accelerate import debug_launcher
    from torch.multiprocessing.spawn import ProcessExitedException

    workdir = Path(workdir)
    existed = workdir.exists()
    try:
        debug_launcher(function, args=args, num_processes=num_processes)
    except ProcessExitedException as error:
        if not error.signal_name:
            raise
        warnings.warn(
            f"{getattr(function, '__name__', function)}: process {error.error_index} was killed by "
            f"{error.signal_name}; running the processes once more in an emptied {workdir}",
            RuntimeWarning,
            stacklevel=2,
        )
        shutil.rmtree(workdir, ignore_errors=True)
        if existed:
            workdir.mkdir(parents=True)
        debug_launcher(function, args=args, num_processes=num_processes)
