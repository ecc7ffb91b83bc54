"""`hf-vit-plus env`: the versions and the machine to paste into a bug report (as `transformers env` does).

Prints hf_vit_plus, Python, the platform, torch (with its CUDA build), transformers, accelerate, huggingface_hub,
datasets and the other libraries the package is built on, then the device (GPUs, or the CPU) and the CPU's
instruction sets that decide kernel speed (AVX2, AVX-512, AVX512_BF16, AMX, VNNI). `.ci/run` prints it before each
test pass, so a CI log says which releases it tested.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform

# the distributions whose versions a report lists, in this order (the first are the issue template's)
LIBRARIES = (
    "torch",
    "transformers",
    "accelerate",
    "huggingface_hub",
    "datasets",
    "evaluate",
    "tokenizers",
    "safetensors",
    "torchvision",
    "peft",
    "timm",
    "torchao",
    "onnxruntime",
    "ctranslate2",
)
# /proc/cpuinfo flags worth knowing for the kernels (matmul precision, int8 and bf16 paths)
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16", "amx_int8")


def library_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_description() -> tuple[str, list[str]]:
    """(model name, the CPU_FEATURES it has); from /proc/cpuinfo where there is one."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return name, [feature for feature in CPU_FEATURES if feature in flags]


def framework_versions(installed_only: bool = False) -> dict[str, str]:
    """hf_vit_plus, Python and the `LIBRARIES` (name -> version, "not installed" for those missing, or left out with
    `installed_only`): what `hf-vit-plus env` prints first, and a model card's "Framework versions"."""
    versions = {"hf_vit_plus": library_version("hf_vit_plus"), "Python": platform.python_version()}
    for name in LIBRARIES:
        versions[name] = library_version(name)
    if installed_only:
        versions = {name: version for name, version in versions.items() if version != "not installed"}
    return versions


def device_description() -> str:
    """The GPUs ("1 CUDA GPU(s): NVIDIA H200"), else "CPU (no CUDA device)"."""
    import torch

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return f"{len(names)} CUDA GPU(s): " + ", ".join(names)
    return "CPU (no CUDA device)"


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
    print(format_environment(collect_environment()))
    return 0
