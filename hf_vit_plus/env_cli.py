"""`hf-vit-plus env`: the versions and the machine to paste into a bug report (as `transformers env` does).

Prints hf_vit_plus, Python, the platform, torch (with its CUDA build), transformers, accelerate, huggingface_hub,
datasets and the other libraries the package is built on, then the device (GPUs, or the CPU) and the CPU's
instruction sets that decide kernel speed (AVX2, AVX-512, AVX512_BF16, AMX, VNNI). `.ci/run` prints it before each
test pass, so a CI log says which releases it tested.
"""

from __future__ import annotations

import argparse
import os
import platform

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
    return info


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
    """
    print(format_environment(collect_environment()))
    return 0
