"""`hf-vit-plus env`: the versions and the machine to paste into a bug report (as `transformers env` does).

Prints hf_vit_plus, Python, the platform, torch (with its CUDA build), transformers, accelerate, huggingface_hub,
datasets and the other libraries the package is built on, then the device (GPUs, or the CPU) and the CPU's
instruction sets that decide kernel speed (AVX2, AVX-512, AVX512_BF16, AMX, VNNI), the instruction-set level the
package's CPU kernels run at and where it comes from (the CPU's widest, or the cap `HF_VIT_PLUS_CPU_ISA` sets), the
path each C++ kernel of the fast decoding engine takes at that level, and what "int8-dynamic" quantization uses
there. A cap the CPU cannot meet is one error line after the rest. `.ci/run` prints it before each test pass, so a
CI log says which releases it tested.
"""

from __future__ import annotations

import argparse
import os
import platform

from .errors import UsageError
from .utils.environment import (  # noqa: F401 - names of this module before they moved to utils.environment
    CPU_FEATURES,
    LIBRARIES,
    cpu_description,
    device_description,
    framework_versions,
    library_version,
)


def collect_environment() -> dict[str, str]:
    """Everything `hf-vit-plus env` prints, as label -> value."""
    import torch

    from hf_vit_plus import __version__

    versions = framework_versions()
    info = {"hf_vit_plus": __version__, "Python": versions.pop("Python"), "Platform": platform.platform()}
    info |= {name: version for name, version in versions.items() if name != "hf_vit_plus"}
    info["torch"] += f" (CUDA build: {torch.version.cuda or 'none'})"
    info["Device"] = device_description()
    cpu, features = cpu_description()
    info["CPU"] = f"{cpu}, {os.cpu_count()} logical cores"
    info["CPU features"] = ", ".join(features) or "none of " + ", ".join(CPU_FEATURES)
    info["torch CPU capability"] = torch.backends.cpu.get_cpu_capability()
    info["torch threads"] = str(torch.get_num_threads())
    info |= instruction_set_lines()
    return info


def instruction_set_lines() -> dict[str, str]:
    """The instruction-set level in use and its source, the kernels' paths where the engine reports them, and the
    backend of "int8-dynamic" (label -> value); with a bad `HF_VIT_PLUS_CPU_ISA`, the instruction set's line says
    so (`run` then exits with that error)."""
    from .models.cpu_isa import describe_isa

    try:
        lines = {"Instruction set": describe_isa()}
    except ValueError as error:
        return {"Instruction set": f"invalid: {error}"}
    lines["Kernel paths"] = kernel_paths_text()
    from .quantization import dynamic_int8_backend

    lines["int8-dynamic quantization"] = INT8_BACKENDS[dynamic_int8_backend()]
    return lines


INT8_BACKENDS = {
    "torchao": "torchao (torch._int_mm: the CPU's int8 dot products)",
    "fbgemm": "FBGEMM's dynamic int8 linear (no int8 dot products at this level)",
}


def kernel_paths_text() -> str:
    """The fast decoding engine's kernels and the path each runs ("name: path, ..."), where the engine reports them
    (`fast_kernels.kernel_paths`), else "not reported"."""
    from .models import fast_kernels

    kernel_paths = getattr(fast_kernels, "kernel_paths", None)
    if kernel_paths is None:
        return "not reported by this version of the engine"
    return ", ".join(f"{name}: {path}" for name, path in kernel_paths().items()) or "none"


def format_environment(info: dict[str, str]) -> str:
    return "\n".join(f"- {label}: {value}" for label, value in info.items())


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "env",
        help="print the versions and the machine, for bug reports",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the environment a bug report needs (`hf-vit-plus env`).

    Args:
        args: the parsed command line.

    Returns:
        The exit status, 0.

    Raises:
        UsageError: `HF_VIT_PLUS_CPU_ISA` asks for a level the CPU cannot meet, or names none (after the rest is
            printed).
    """
    print(format_environment(collect_environment()))
    from .models.cpu_isa import cpu_isa

    try:
        cpu_isa()
    except ValueError as error:
        raise UsageError(str(error)) from None
    return 0
