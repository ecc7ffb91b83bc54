"""Which instruction set the package's CPU kernels use: one choice per process, from the CPU's flags, capped by
`HF_VIT_PLUS_CPU_ISA` (as CTranslate2's `CT2_FORCE_CPU_ISA` and oneDNN's `ONEDNN_MAX_CPU_ISA` cap theirs).

The levels, narrowest first:
- `generic`: plain C++ (what the compiler vectorizes on its own), the path of ARM64 and of x86 CPUs without AVX2;
- `avx2`: AVX2 and FMA (AMD before Zen 4, Intel client CPUs);
- `avx512`: AVX-512 F, BW, VL, DQ (Intel Xeon since Skylake, AMD Zen 4), with VNNI where the CPU has it.

`HF_VIT_PLUS_CPU_ISA=avx2` runs the AVX2 paths on a wider CPU; asking for more than the CPU has is a `ValueError`.
`isa_label()` is what a result row records as `isa`: the widest set in use (`amx_tile`, `avx512_bf16`, `avx512_vnni`,
`avx512`, `avx2`, `generic`, or `neon` for the generic path on ARM64). `capped_environment` gives the variables that
cap torch's own kernels, MKL, oneDNN, FBGEMM and CTranslate2 at the same level, for a process started with them (they
are read when each library loads, so a running process cannot change them). FBGEMM (torch's quantized int8 linear) has
no path below AVX2: at `generic` it is capped at AVX2, the narrowest it can run. `describe_isa()` is the line
`hf-vit-plus env` and a run's first lines print: the level, the label and where it comes from (the CPU's widest, or the
cap); `isa_capped()` says whether a cap holds the level below the CPU's widest (a capped run on a wider CPU executes a
narrower CPU's instructions, not with that CPU's caches and clocks).
"""

from __future__ import annotations

import functools
import os
import platform

ISA_ENV = "HF_VIT_PLUS_CPU_ISA"
ISA_LEVELS = ("generic", "avx2", "avx512")
# /proc/cpuinfo flags each level needs
LEVEL_FLAGS = {
    "avx2": ("avx2", "fma"),
    "avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"),
}
# what caps each library at a level: torch's ATen, MKL (float32 GEMM), oneDNN (`_int_mm`, bf16), FBGEMM (torch's
# quantized int8 linear; its narrowest kernels are AVX2), CTranslate2
LIBRARY_CAPS = {
    "generic": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
        "CT2_FORCE_CPU_ISA": "GENERIC",
    },
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
        "CT2_FORCE_CPU_ISA": "AVX2",
    },
    "avx512": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1",
        "CT2_FORCE_CPU_ISA": "AVX512",
    },
}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of /proc/cpuinfo; empty where there is no such file (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def supported_isa() -> str:
    """The widest level of `ISA_LEVELS` the running CPU has."""
    if not is_x86():
        return "generic"
    flags = cpu_flags()
    for level in reversed(ISA_LEVELS[1:]):
        if all(flag in flags for flag in LEVEL_FLAGS[level]):
            return level
    return "generic"


def check_isa(value: str) -> str:
    """A level name as `HF_VIT_PLUS_CPU_ISA` accepts it (any case), or a ValueError naming the value."""
    level = value.strip().lower()
    if level not in ISA_LEVELS:
        expected = ", ".join(ISA_LEVELS)
        raise ValueError(f"{ISA_ENV}={value!r} is not an instruction set level: expected one of {expected}")
    widest = supported_isa()
    if ISA_LEVELS.index(level) > ISA_LEVELS.index(widest):
        raise ValueError(f"{ISA_ENV}={value!r} asks for more than this CPU has: its widest level is {widest!r}")
    return level


def cpu_isa() -> str:
    """The level the package's kernels run at: the CPU's widest, or the cap `HF_VIT_PLUS_CPU_ISA` sets."""
    value = os.environ.get(ISA_ENV, "").strip()
    return check_isa(value) if value else supported_isa()


def isa_label(level: str | None = None) -> str:
    """The widest instruction set in use at `level` (default: `cpu_isa()`), as result rows record it."""
    level = cpu_isa() if level is None else check_isa(level)
    if level == "avx512":
        # AMX tiles and AVX512-BF16 are run by oneDNN and torch's own kernels at this level (ours stop at VNNI)
        flags = cpu_flags()
        for label in ("amx_tile", "avx512_bf16", "avx512_vnni"):
            if label in flags:
                return label
        return "avx512"
    if level == "generic" and platform.machine().lower() in ("aarch64", "arm64"):
        return "neon"
    return level


def isa_capped(level: str | None = None) -> bool:
    """Whether `level` (default: `cpu_isa()`) is below the CPU's widest: a run capped on a wider CPU."""
    level = cpu_isa() if level is None else check_isa(level)
    return ISA_LEVELS.index(level) < ISA_LEVELS.index(supported_isa())


def describe_isa() -> str:
    """The level in use, its label and where it comes from, in one line: "avx512 (avx512_vnni), the CPU's widest",
    or "avx2 (avx2), capped by HF_VIT_PLUS_CPU_ISA=avx2; the CPU's widest is avx512 (avx512_vnni)". A bad cap
    raises the ValueError of `cpu_isa()`."""
    level, widest = cpu_isa(), supported_isa()
    described = f"{level} ({isa_label(level)})"
    if not os.environ.get(ISA_ENV, "").strip():
        return f"{described}, the CPU's widest"
    cap = os.environ[ISA_ENV].strip()
    return f"{described}, capped by {ISA_ENV}={cap}; the CPU's widest is {widest} ({isa_label(widest)})"


def capped_environment(level: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) with every library capped at `level`, ours included: for a process
    started with it."""
    level = check_isa(level)
    env = dict(os.environ if environ is None else environ)
    env[ISA_ENV] = level
    if is_x86():
        env.update(LIBRARY_CAPS[level])
    return env


__all__ = [
    "ISA_ENV",
    "ISA_LEVELS",
    "LIBRARY_CAPS",
    "capped_environment",
    "check_isa",
    "cpu_flags",
    "cpu_isa",
    "describe_isa",
    "isa_capped",
    "isa_label",
    "supported_isa",
]
