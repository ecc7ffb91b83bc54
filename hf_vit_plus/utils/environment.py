"""The environment a package user runs in: library versions, the device and the CPU. `hf-vit-plus env`
(`hf_vit_plus.env_cli`) prints them for bug reports; model cards list the framework versions and the hardware of the
run that trained the model (`hf_vit_plus.hub.card`, `hf_vit_plus.training.outputs`)."""

from __future__ import annotations

import importlib.metadata
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
