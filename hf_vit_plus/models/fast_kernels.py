"""The kernels of the fused decoding step (`fast_decoding.py`): the linear layers in each precision, FBGEMM's
products as custom torch operators, their C++ kernels, and the float16 screen of greedy decoding's output projection.

- `FastLinear`: `x @ W^T + b` with W in one of `PRECISIONS` (the decoder's linear layers, its cross-attention keys'
  and values' projections and the output projection, and the encoder's under `FastDecoding.generate`; embeddings,
  layer norms and attention stay in float32):
  - "float32": the model's own weights (no copy);
  - "bfloat16": weights in bfloat16; a product of at most `SMALL_ROWS` rows reads them and accumulates in float32,
    larger products run in bfloat16 where the device multiplies it natively (AVX512_BF16, AMX), else in float32;
  - "int8-weight-only": int8 weights with one float32 scale per output row (symmetric), converted inside the product:
    a quarter of the bytes, for the memory-bound case (batch 1);
  - "int8-dynamic": int8 weights and int8 activations quantized per row at run time, integer products
    (`torch._int_mm`, VNNI on CPU), for the compute-bound case (many rows);
  - "int8-fbgemm": int8 weights and activations quantized at run time to 7 bits, each row over its own range, by
    FBGEMM's dynamic int8 linear (x86 builds of torch), for CPUs without VNNI;
  - "int8": weight-only up to `INT8_WEIGHT_ONLY_MAX_ROWS` rows and dynamic above on CPUs with native int8 products,
    "int8-fbgemm" on the others (weight-only where torch has no FBGEMM).
- FBGEMM's products (`fbgemm_int8_linear_op`, `fbgemm_fp16_linear_op`) are custom operators that the compiled step
  calls: FBGEMM packs a copy of the weights at the first call and keeps it with the tensor it came from. Their C++
  kernels (`fast_kernels.cpp`, package data) are built once per torch install by `torch.utils.cpp_extension` where a
  C++ compiler and ninja (the `fast` extra) are at hand; elsewhere, and in a copy of this module loaded as remote code
  without the package, the Python kernels run: the same products, more overhead per call.
- `OutputScreen`: greedy decoding's float32 choice of token from a float16 pass over the output projection, proven by
  an error bound on every logit.

The choices of kernel are measured by `scripts/benchmarks/bench_seq2seq.py` (results in `results/`). This module
ships with the checkpoints (remote code): it imports only torch and its siblings.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
import weakref
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .compat import cpu_has_fast_int8_products, cpu_has_native_bf16_products
from .cpu_isa import ISA_ENV, ISA_LEVELS, check_isa, cpu_isa
from .decoding_rules import process_scores

logger = logging.getLogger(__name__)

PRECISIONS = ("float32", "bfloat16", "int8", "int8-weight-only", "int8-dynamic", "int8-fbgemm")
# Products of at most this many rows (batch x beams) run as vector-matrix loops that read each weight once
# (`compiled_decoding.row_matmul_pass`); larger ones as GEMMs.
SMALL_ROWS = 4
# float32 products of at least this many rows run on packed weights where the CPU has AVX-512
# (`cpp_kernels`): from 2 rows on faster than inductor's vector-matrix loop (`row_matmul_pass`), timed
# product by product, each compiled by AOTInductor; one row keeps the loop.
PACKED_FLOAT32_MIN_ROWS = 2
# The row counts (first, last; None: no bound) of float32 products on packed weights (`fp32_packed_linear`) per
# level of the C++ kernels, where they beat MKL's F.linear at that level (timed product by product at the small and
# opus-mt shapes, 1 to 64 rows, torch capped at the same level); the portable path never does (F.linear: MKL,
# OpenBLAS or Arm's libraries on ARM64).
PACKED_FLOAT32_ROWS = {"avx512": (PACKED_FLOAT32_MIN_ROWS, None), "avx2": (PACKED_FLOAT32_MIN_ROWS, None)}
# The row counts of dynamic int8 by our kernel without VNNI (`int8_vnni_linear`'s vpmaddubsw path), where it beats
# FBGEMM's int8 at that level; with VNNI it runs at every row count. At the generic level the Python definition runs.
CPP_INT8_ROWS = {"avx512": (1, None), "avx2": (1, None)}
# The multiple of dimensions per head that the attention kernels' vectors need, per level
ATTENTION_MULTIPLE = {"avx512": 16, "avx2": 8, "generic": 1}
CPP_KERNEL_NAMES = ("fp32_packed_linear", "int8_vnni_linear", "cache_attention", "source_attention", "topk_rows")
# "int8" runs weight-only int8 up to this many rows per step and dynamic int8 above, on CPUs with native int8
# products; elsewhere FBGEMM's int8 (or weight-only) at every row count (`cpu_has_fast_int8_products`).
INT8_WEIGHT_ONLY_MAX_ROWS = 0


@functools.cache
def fbgemm_int8_available() -> bool:
    """Whether this torch has FBGEMM's dynamic int8 linear (x86 builds): int8 products that pay on CPUs without VNNI
    (AVX2 `vpmaddubsw`), where `torch._int_mm` is a slow loop."""
    quantized = getattr(torch.ops, "quantized", None)
    return (
        "fbgemm" in torch.backends.quantized.supported_engines
        and hasattr(quantized, "linear_dynamic")
        and hasattr(quantized, "linear_prepack")
        and hasattr(torch, "_make_per_channel_quantized_tensor")
    )


# The output screen's bound on a float32 sum of K products, relative to the sum of the products' magnitudes: 4 K
# units of float32 rounding (the classic bound is K units; FBGEMM and our own sums may add in another order).
def _sum_rounding(k: int) -> float:
    return 4.0 * k * 2.0**-24


def _has_fbgemm_fp16_ops() -> bool:
    quantized = getattr(torch.ops, "quantized", None)
    names = ("linear_prepack_fp16", "linear_dynamic_fp16", "linear_unpack_fp16")
    return "fbgemm" in torch.backends.quantized.supported_engines and all(hasattr(quantized, n) for n in names)


@functools.cache
def fbgemm_fp16_available() -> bool:
    """Whether this torch has FBGEMM's linear with float16 weights and float32 activations (x86 builds), and it
    computes what `OutputScreen`'s bound assumes (checked once, on a small product): weights rounded as
    `Tensor.half()` rounds them, float32 activations unrounded, float32 sums."""
    if not _has_fbgemm_fp16_ops():
        return False
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 96, generator=gen) * 0.05
    x = torch.randn(3, 96, generator=gen) * 3.0
    packed = _fbgemm_fp16_pack(weight)
    with _fbgemm_engine():
        unpacked = torch.ops.quantized.linear_unpack_fp16(packed)[0]
        out = torch.ops.quantized.linear_dynamic_fp16(x, packed)
    if not torch.equal(unpacked, weight.half().float()):
        return False
    exact = x.double() @ unpacked.double().t()
    bound = _sum_rounding(96) * (x.double().abs() @ unpacked.double().abs().t())
    return bool(((out.double() - exact).abs() <= bound).all())


# FBGEMM's packed weights of each int8 tensor seen by the op below: id(weight) -> (weakref to it, its version, packed).
# The entry goes with its tensor; a tensor changed in place is packed again.
_FBGEMM_PACKED: dict[int, tuple] = {}


@contextlib.contextmanager
def _fbgemm_engine():
    """torch's quantized ops on FBGEMM, their warnings silenced (torch's quantized tensors warn that they will move
    out of torch)."""
    previous = torch.backends.quantized.engine
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.quantized.engine = "fbgemm"
            yield
    finally:
        torch.backends.quantized.engine = previous


# How many packs the Python kernels made, per kind (`fbgemm_pack_counts`)
_PACKS_MADE = {"int8": 0, "fp16": 0}


def _cached_pack(cache: dict, owner: torch.Tensor, source, pack, kind: str):
    """The packed weights in `cache` under `owner` if they were made from `source` (what identifies the weights'
    data and version), else `pack()`, kept there until `owner` is freed."""
    key = id(owner)
    entry = cache.get(key)
    if entry is not None and entry[0]() is owner and entry[1] == source:
        return entry[2]
    packed = pack()
    _PACKS_MADE[kind] += 1
    cache[key] = (weakref.ref(owner, lambda _ref: cache.pop(key, None)), source, packed)
    return packed


def _fbgemm_packed(weight: torch.Tensor, scale: torch.Tensor):
    def pack():
        with _fbgemm_engine():
            zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
            quantized = torch._make_per_channel_quantized_tensor(weight, scale.double(), zero_points, 0)
            return torch.ops.quantized.linear_prepack(quantized, None)

    return _cached_pack(_FBGEMM_PACKED, weight, (weight._version, scale._version), pack, "int8")


def _fbgemm_fp16_pack(weight: torch.Tensor):
    with _fbgemm_engine():
        return torch.ops.quantized.linear_prepack_fp16(weight.detach().float().contiguous(), None)


# FBGEMM's float16 copies of the float32 weights seen by the op below, kept like `_FBGEMM_PACKED`'s
_FBGEMM_FP16_PACKED: dict[int, tuple] = {}


def _fbgemm_fp16_packed(weight: torch.Tensor, owner: torch.Tensor):
    # The weight is recognised by its data, shape and version counter, not by its Python object: a compiled step may
    # pass another tensor object on the same data (e.g. tied embeddings: the parameter instead of its detached view).
    source = (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()), weight._version)
    return _cached_pack(_FBGEMM_FP16_PACKED, owner, source, lambda: _fbgemm_fp16_pack(weight), "fp16")


def _fp16_fbgemm_linear(x: torch.Tensor, weight: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic_fp16(x.contiguous(), _fbgemm_fp16_packed(weight, owner))


_LIBRARIES: list = []  # the ops' registrations live as long as their Library objects


def _define_op(name: str, schema: str, kernel, fake):
    """The op `hf_vit_plus::<name>` with a plain `torch.library` CPU kernel and a fake kernel for export, defined
    once per process (a second copy of this file, e.g. remote code, reuses it)."""
    namespace = torch.ops.hf_vit_plus
    if not hasattr(namespace, name):
        library = torch.library.Library("hf_vit_plus", "FRAGMENT")
        library.define(schema)
        library.impl(name, kernel, "CPU")
        torch.library.register_fake(f"hf_vit_plus::{name}", fake, lib=library)
        _LIBRARIES.append(library)
    return getattr(namespace, name).default


def _int8_fbgemm_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x.contiguous(), _fbgemm_packed(weight, scale), True)


def _fbgemm_linear_fake(x: torch.Tensor, weight: torch.Tensor, _other: torch.Tensor) -> torch.Tensor:
    """Every FBGEMM op's output for export: (rows of x, rows of weight)."""
    return x.new_empty(x.shape[0], weight.shape[0])


def fbgemm_int8_linear_op():
    """The op `x @ (weight * scale[:, None])^T` (x, weight, scale) by FBGEMM's dynamic int8 linear (activations
    quantized per tensor to 7 bits, asymmetric; int8 weights with one scale per output row), its packed weights made
    at the first call with each weight tensor and kept as long as it lives (packed again if it is changed in place).
    Opaque to Dynamo, torch.export and AOTInductor (which calls it through the dispatcher), so that the compiled step
    runs FBGEMM's kernel. Where a C++ compiler is at hand this is `hf_vit_plus_cpp::int8_fbgemm_linear`, a C++ kernel
    built once per torch install (`cpp_fbgemm_ops`): no Python per call, which at one row costs as much as a small
    product. Otherwise `hf_vit_plus::int8_fbgemm_linear`, a plain `torch.library` Python kernel (not
    `torch.library.custom_op`, whose dispatch costs more per call). The same products, bit for
    bit. Defined once per process (a second copy of this file, e.g. remote code, reuses it)."""
    if cpp_fbgemm_ops():
        return torch.ops.hf_vit_plus_cpp.int8_fbgemm_linear.default
    return python_int8_fbgemm_linear_op()


def python_int8_fbgemm_linear_op():
    """`fbgemm_int8_linear_op`'s Python kernel, `hf_vit_plus::int8_fbgemm_linear`."""
    schema = "int8_fbgemm_linear(Tensor x, Tensor weight, Tensor scale) -> Tensor"
    return _define_op("int8_fbgemm_linear", schema, _int8_fbgemm_linear, _fbgemm_linear_fake)


def fbgemm_fp16_linear_op():
    """The op `x @ half(weight)^T` (x, weight, owner) by FBGEMM's linear with float16 weights (half the bytes of
    float32) and float32 activations and sums. Its float16 copy of the float32 `weight` is made at the first call and
    kept as long as the tensor `owner` lives (packed again if `weight` is changed in place or replaced): recognised by
    its data, shape, strides and version counter, not by its tensor object. What `OutputScreen` reads. The C++ kernel
    `hf_vit_plus_cpp::fp16_fbgemm_linear` where it could be built (`cpp_fbgemm_ops`), else the Python kernel
    `hf_vit_plus::fp16_fbgemm_linear`."""
    if cpp_fbgemm_ops():
        return torch.ops.hf_vit_plus_cpp.fp16_fbgemm_linear.default
    return python_fp16_fbgemm_linear_op()


def python_fp16_fbgemm_linear_op():
    """`fbgemm_fp16_linear_op`'s Python kernel, `hf_vit_plus::fp16_fbgemm_linear`."""
    return _define_op(
        "fp16_fbgemm_linear",
        "fp16_fbgemm_linear(Tensor x, Tensor weight, Tensor owner) -> Tensor",
        _fp16_fbgemm_linear,
        _fbgemm_linear_fake,
    )


# The C++ kernels of the two ops (`cpp_fbgemm_ops`), in their own file: see its header.
CPP_SOURCE = "fast_kernels.cpp"  # next to this module (package data)
# HF_VIT_PLUS_CPP_KERNELS=0 keeps the Python kernels; HF_VIT_PLUS_KERNEL_CACHE is where the C++ ones are built.
CPP_KERNELS_ENV = "HF_VIT_PLUS_CPP_KERNELS"
KERNEL_CACHE_ENV = "HF_VIT_PLUS_KERNEL_CACHE"


def kernel_cache_dir(environ=None):
    """Where the C++ kernels are built and kept: `HF_VIT_PLUS_KERNEL_CACHE`; else under torch's folder of extension
    builds, `TORCH_EXTENSIONS_DIR/hf_vit_plus`; else under the Hugging Face cache, `HF_HOME/hf_vit_plus/kernels`,
    with HF_HOME as huggingface_hub resolves it (`XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`).

    Args:
        environ: the environment to read (default: `os.environ`).

    Returns:
        The folder (a `Path`), which need not exist yet.
    """
    import os
    from pathlib import Path

    environ = os.environ if environ is None else environ
    if environ.get(KERNEL_CACHE_ENV):
        return Path(environ[KERNEL_CACHE_ENV]).expanduser()
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(environ["TORCH_EXTENSIONS_DIR"]).expanduser() / "hf_vit_plus"
    hf_home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(hf_home).expanduser() / "hf_vit_plus" / "kernels"


def cpp_source() -> str:
    """The C++ kernels' source: `fast_kernels.cpp` next to this module, else the installed package's (a copy of this
    module loaded as remote code comes without it); FileNotFoundError where there is neither."""
    import importlib.util
    from pathlib import Path

    candidates = [Path(__file__).with_name(CPP_SOURCE)]
    try:
        spec = importlib.util.find_spec("hf_vit_plus")
    except ImportError:  # an import hook that refuses the package: not installed, as far as this copy can tell
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "models" / CPP_SOURCE for p in spec.submodule_search_locations]
    for path in candidates:
        if path.is_file():
            return path.read_text()
    raise FileNotFoundError(f"{CPP_SOURCE} is not next to {Path(__file__).name} and hf_vit_plus is not installed")


def _cpp_kernels_loaded() -> bool:
    return hasattr(torch.ops.hf_vit_plus_cpp, "int8_fbgemm_linear")


@functools.cache
def cpp_fbgemm_ops() -> bool:
    """Whether the FBGEMM ops run their C++ kernels (`fast_kernels.cpp`): built at the first call in a process
    (tens of seconds, then kept in `kernel_cache_dir()`, one build per source, torch and Python)
    by torch's own `torch.utils.cpp_extension.load` (a C++ compiler and ninja), loaded into torch's op registry. False,
    with a warning saying why, where they cannot be built (the Python kernels then run: the same products, slower
    per call); False without a warning where `HF_VIT_PLUS_CPP_KERNELS=0`, torch has no FBGEMM, or the source is not
    at hand (remote code without the package)."""
    import os

    if _cpp_kernels_loaded():  # e.g. by another copy of this file (remote code)
        _register_cpp_fakes()
        return True
    # (no tensor work here: the first call may come while torch.export traces the step with fake tensors)
    if os.environ.get(CPP_KERNELS_ENV, "1") == "0" or not (fbgemm_int8_available() and _has_fbgemm_fp16_ops()):
        return False
    try:
        cpp_source()
    except FileNotFoundError as error:  # a copy of this module loaded as remote code, without the package
        logger.info("hf_vit_plus: %s: the Python kernels of the FBGEMM products run", error)
        return False
    try:
        _build_cpp_kernels()
    except Exception as error:  # no compiler, no ninja, headers that do not build: the Python kernels still work
        warnings.warn(
            f"hf_vit_plus: the C++ kernels of the FBGEMM products could not be built ({type(error).__name__}: "
            f"{str(error).strip().splitlines()[-1] if str(error).strip() else error!r}); the Python kernels run "
            f"instead (the same products, more overhead per call). Set {CPP_KERNELS_ENV}=0 to silence this.",
            stacklevel=2,
        )
        return False
    _register_cpp_fakes()
    return _cpp_kernels_loaded()


class _BuildChatter(logging.Filter):
    """torch's extension builder's own log lines (its import says "No CUDA runtime is found, using CUDA_HOME=..." on
    a CPU machine) as this module's debug lines: shown at debug level only."""

    def filter(self, record: logging.LogRecord) -> bool:
        logger.debug("torch.utils.cpp_extension: %s", record.getMessage())
        return False


def _build_cpp_kernels() -> None:
    import hashlib
    import os
    import sys
    from pathlib import Path

    from transformers.utils.logging import tqdm

    builder_logger = logging.getLogger("torch.utils.cpp_extension")
    chatter = _BuildChatter()
    builder_logger.addFilter(chatter)
    try:
        from torch.utils import cpp_extension

        if not cpp_extension.is_ninja_available():
            raise RuntimeError('ninja is not installed: pip install "hf_vit_plus[fast]"')
        text = cpp_source()
        # One build per source, torch build and Python: a .so built against another torch must never be loaded.
        key = "\n".join((text, torch.__version__, str(Path(torch.__file__).parent), sys.version))
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        folder = kernel_cache_dir() / digest
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / "fbgemm_ops.cpp"
        if not source.exists() or source.read_text() != text:
            partial = folder / f"fbgemm_ops.cpp.{os.getpid()}.tmp"
            partial.write_text(text)
            partial.replace(source)
        built = any(folder.glob("*.so"))  # a build of this source: loading it takes no compilation
        logger.info("building the fast decoding kernels in %s (once: kept for later processes)", folder)
        with tqdm(total=1, desc="building fast decoding kernels, once", disable=built) as bar:
            cpp_extension.load(
                name=f"hf_vit_plus_fbgemm_{digest}",
                sources=[str(source)],
                build_directory=str(folder),
                extra_cflags=["-O2"],
                is_python_module=False,
                verbose=logger.isEnabledFor(logging.DEBUG),  # the compiler's commands at debug level
            )
            bar.update(1)
    finally:
        builder_logger.removeFilter(chatter)


def _linear_fake(x: torch.Tensor, weight: torch.Tensor, *_others) -> torch.Tensor:
    """The C++ products' output for export: (rows of x, rows of weight)."""
    return x.new_empty(x.shape[0], weight.shape[0])


def _register_cpp_fakes() -> None:
    """The C++ ops' fake kernels (shapes for torch.export), registered once per process."""
    from torch._library.simple_registry import singleton

    fakes = dict.fromkeys(
        ("int8_fbgemm_linear", "fp16_fbgemm_linear", "int8_vnni_linear", "fp32_packed_linear"), _linear_fake
    )
    fakes.update(cache_attention=_cache_attention_fake, source_attention=_source_attention_fake, topk_rows=_topk_fake)
    for name, fake in fakes.items():
        if (
            hasattr(torch.ops.hf_vit_plus_cpp, name)
            and singleton.find(f"hf_vit_plus_cpp::{name}").fake_impl.kernel is None
        ):
            torch.library.register_fake(f"hf_vit_plus_cpp::{name}", fake)


def _cache_attention_fake(query, keys, *_others) -> torch.Tensor:
    return query.new_empty(keys.shape[0], keys.shape[2])


def _source_attention_fake(query, *_others) -> torch.Tensor:
    return query.new_empty(query.shape)


def _topk_fake(x, k, vectorized=True):
    return x.new_empty(x.shape[0], k), x.new_empty(x.shape[0], k, dtype=torch.long)


class CppKernels(NamedTuple):
    """What the C++ kernels run in this process (`cpp_kernels`)."""

    level: str | None  # the instruction-set level of their paths (`cpu_isa()`); None where they are not built
    vnni: bool  # whether `int8_vnni_linear` runs AVX512-VNNI (else vpmaddubsw at AVX2 and AVX-512, plain loops below)


@functools.cache
def cpp_kernels() -> CppKernels:
    """The level the C++ kernels run at: `cpu_isa()` (the CPU's widest, capped by `HF_VIT_PLUS_CPU_ISA`: a cap wider
    than the CPU is a ValueError, and the C++ side refuses it too), passed to them once per process
    (`hf_vit_plus_cpp::set_cpu_isa`); level None where they are not built (`cpp_fbgemm_ops`). Asks the CPU's flags
    only (no tensor work)."""
    level = cpu_isa()
    if not cpp_fbgemm_ops() or not hasattr(torch.ops.hf_vit_plus_cpp, "set_cpu_isa"):
        return CppKernels(None, False)
    torch.ops.hf_vit_plus_cpp.set_cpu_isa(ISA_LEVELS.index(level))
    in_use, _widest, vnni = torch.ops.hf_vit_plus_cpp.cpu_kernels()
    return CppKernels(ISA_LEVELS[in_use], bool(vnni))


@contextlib.contextmanager
def use_cpu_isa(level: str) -> Iterator[CppKernels]:
    """Run the C++ kernels, and every choice of kernel made inside (`FastLinear`, `FastDecoder`, `kernel_paths`), at
    `level` (at most the CPU's widest) in this process, then at the level before: how the tests run every path on
    one machine. Objects built inside keep the choices they made there. torch's own kernels are not capped (their
    variables are read when torch loads: `cpu_isa.capped_environment` is for a new process)."""
    level = check_isa(level)
    previous = os.environ.get(ISA_ENV)
    os.environ[ISA_ENV] = level
    cpp_kernels.cache_clear()
    try:
        yield cpp_kernels()
    finally:
        if previous is None:
            os.environ.pop(ISA_ENV, None)
        else:
            os.environ[ISA_ENV] = previous
        cpp_kernels.cache_clear()
        cpp_kernels()


def packed_float32_rows(level: str | None = None) -> tuple[int, int | None] | None:
    """The row counts (first, last; last None: no bound) at which float32 products run `fp32_packed_linear` at
    `level` (default: the C++ kernels' level, `cpp_kernels`); None where they never do (F.linear instead)."""
    level = cpp_kernels().level if level is None else level
    return PACKED_FLOAT32_ROWS.get(level) if level is not None else None


def cpp_int8_rows(level: str | None = None) -> tuple[int, int | None] | None:
    """The row counts (first, last; last None: no bound) at which dynamic int8 runs `int8_vnni_linear` at `level`
    (default: the C++ kernels'), and "int8" on a CPU without native int8 products takes it instead of FBGEMM's;
    None where it never does (the Python definition, `torch._int_mm`, and FBGEMM for "int8")."""
    kernels = cpp_kernels()
    level = kernels.level if level is None else level
    if level == "avx512" and kernels.vnni:
        return (1, None)
    return CPP_INT8_ROWS.get(level) if level is not None else None


def _in_rows(rows: int, bounds: tuple[int, int | None] | None) -> bool:
    return bounds is not None and rows >= bounds[0] and (bounds[1] is None or rows <= bounds[1])


def kernel_paths() -> dict[str, str]:
    """Which path of each C++ kernel the fast decoding engine runs in this process: kernel name ->
    "avx512_vnni", "avx512", "avx2" (the instruction set of its path), "generic" (portable C++, e.g. on ARM64), or
    "python" (the Python definition runs instead: `F.linear` for float32, `torch._int_mm` for dynamic int8 and FBGEMM
    for "int8", torch's ops for attention and top-k; also where the C++ kernels are not built). The products run
    their path at some row counts only (`packed_float32_rows`, `cpp_int8_rows`), F.linear / FBGEMM at the others.
    What `hf-vit-plus env` and a benchmark's first lines report."""
    kernels = cpp_kernels()
    level = kernels.level
    if level is None:
        return dict.fromkeys(CPP_KERNEL_NAMES, "python")
    attention = level
    int8 = ("avx512_vnni" if kernels.vnni else "avx2") if cpp_int8_rows() is not None else "python"
    return {
        "fp32_packed_linear": level if packed_float32_rows() is not None else "python",
        "int8_vnni_linear": int8,
        "cache_attention": attention,
        "source_attention": attention,
        "topk_rows": level,
    }


def fbgemm_pack_counts() -> dict[str, int]:
    """FBGEMM's packed weights of the kernels in use: how many packs this process made ("int8_made", "fp16_made")
    and how many it holds now ("int8_live", "fp16_live")."""
    if cpp_fbgemm_ops():
        int8_made, int8_live, fp16_made, fp16_live = torch.ops.hf_vit_plus_cpp.pack_counts()[:4]
    else:
        int8_made, fp16_made = _PACKS_MADE["int8"], _PACKS_MADE["fp16"]
        int8_live, fp16_live = len(_FBGEMM_PACKED), len(_FBGEMM_FP16_PACKED)
    return dict(int8_made=int8_made, int8_live=int8_live, fp16_made=fp16_made, fp16_live=fp16_live)


def fused_attention_available(weight: torch.Tensor, heads: int) -> bool:
    """Whether a decoder layer of `heads` heads whose projections are `weight` (D, D) attends through the C++ kernels
    `cache_attention` / `source_attention`: a CPU tensor, the C++ kernels built, heads of a multiple of the vector
    width of their level (16 dimensions at AVX-512, 8 at AVX2, any for the portable path)."""
    dim, level = weight.shape[0], cpp_kernels().level
    if weight.device.type != "cpu" or level is None or dim % heads:
        return False
    return (dim // heads) % ATTENTION_MULTIPLE[level] == 0


def cache_attention(query, keys, values, position, history, heads: int, scaling: float) -> torch.Tensor:
    """Masked self-attention of one new token per row (query (R, D)) over the positions 0..`position` of its cache
    keys, values (R, L, D), one C++ kernel (`hf_vit_plus_cpp::cache_attention`): no score of a later position is
    computed, and `history` (None, or (R, L) the slot holding each position of row r) is followed in place."""
    return torch.ops.hf_vit_plus_cpp.cache_attention.default(query, keys, values, position, history, heads, scaling)


def source_attention(query, keys, values, bias, heads: int, scaling: float) -> torch.Tensor:
    """Attention of each row (query (R, D), R = B sources x R/B beams) over its source's keys, values (B, S, D), with
    `bias` (B, S) 0 or -inf: one C++ kernel (`hf_vit_plus_cpp::source_attention`)."""
    return torch.ops.hf_vit_plus_cpp.source_attention.default(query, keys, values, bias, heads, scaling)


def topk_rows(x: torch.Tensor, k: int, vectorized: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(x, k, dim=1)` of a 2-D float32 CPU tensor by the C++ kernel `hf_vit_plus_cpp::topk_rows`: the k
    largest values of each row, largest first, NaN above every number, equal values by smaller index (torch.topk
    leaves their order unspecified). With `vectorized` (at every level), the k-th largest of the maxima of blocks of
    16 values is a threshold that no value of the k largest is below, and only the values at or above it are ranked
    (a row with a NaN takes the heap); without, a plain loop over a heap of the k best. Needs the C++ kernels
    (`cpp_fbgemm_ops`); the decoder calls it where they are built (`cpp_kernels`)."""
    return torch.ops.hf_vit_plus_cpp.topk_rows.default(x, k, vectorized)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (int8 weight, float32 scale per row) with weight ~ q * scale[:, None]."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (N,)
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)  # (N, K)
    return q, scale


class FastLinear(nn.Module):
    """`x @ W^T + b` for the fused step, with W in one of `PRECISIONS` (float32 keeps the model's tensor itself).

    The product is chosen when the step is traced, from the number of rows, which is fixed per compiled graph."""

    def __init__(self, linear: nn.Linear, precision: str, bias: torch.Tensor | None = None):
        super().__init__()
        self.precision = precision
        weight = linear.weight.detach()
        # "bfloat16" and "int8" choose their product by it: whether this device multiplies bf16 / int8 natively
        # (asked once, outside any traced graph); the other precisions name their product
        check = {"bfloat16": cpu_has_native_bf16_products, "int8": cpu_has_fast_int8_products}.get(precision)
        self.native_products = weight.device.type != "cpu" or check is None or check()
        self.fbgemm = weight.device.type == "cpu" and fbgemm_int8_available()
        # The C++ kernels' products at the row counts where they beat the library's at the level in use (asked once,
        # outside any traced graph; `cpp_kernels`): dynamic int8 (the Python definition's numbers, bit for bit) by
        # VNNI or vpmaddubsw, float32 on packed weights
        on_cpu = weight.device.type == "cpu" and precision in ("float32", "int8", "int8-dynamic")
        self.cpp_int8 = cpp_int8_rows() if on_cpu else None
        self.packed_float32 = packed_float32_rows() if on_cpu else None
        if precision == "int8-fbgemm" and not self.fbgemm:
            raise ValueError(
                f"precision='int8-fbgemm' needs FBGEMM's int8 linear on a CPU tensor: this is a {weight.device.type} "
                f"tensor and this torch has FBGEMM: {fbgemm_int8_available()} (torch.backends.quantized."
                "supported_engines). Use 'int8', which picks the int8 product this device has."
            )
        if linear.bias is not None:
            bias = linear.bias.detach() if bias is None else linear.bias.detach() + bias
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)
        self.register_buffer("scale", None, persistent=False)
        if precision == "float32":
            self.register_buffer("weight", weight if weight.dtype == torch.float32 else weight.float(), False)
        elif precision == "bfloat16":
            self.register_buffer("weight", weight.to(torch.bfloat16), persistent=False)
        else:
            q, scale = quantize_rows(weight)
            self.register_buffer("weight", q, persistent=False)
            self.scale = scale
        # the int8 weights' row sums, for FBGEMM's products of rows mapped onto [0, 1] (see `forward`), where "int8"
        # takes FBGEMM's product at some row count
        fbgemm = self.precision == "int8-fbgemm" or (
            self.precision == "int8" and not self.native_products and self.fbgemm and self.cpp_int8 != (1, None)
        )
        if fbgemm:
            cpp_fbgemm_ops()  # the C++ kernels' one build, here rather than inside the step's export
        row_sums = (self.weight.float() * self.scale[:, None]).sum(dim=1) if fbgemm else None
        self.register_buffer("row_sums", row_sums, persistent=False)

    def kernel(self, rows: int) -> str:
        """The product used for `rows` input rows: "float32", "bfloat16-rows", "bfloat16", "int8-weight-only",
        "int8-dynamic" or "int8-fbgemm". On a CPU, "bfloat16" and "int8" take the bf16 or dynamic-int8 GEMM only
        where the CPU has native products of that kind; otherwise bf16 weights are converted to float32 inside the
        product, and "int8" takes dynamic int8 by our C++ kernel at the row counts where it beats FBGEMM's
        (`cpp_int8_rows`), else FBGEMM's int8 linear (AVX2), or weight-only int8 where torch has no FBGEMM."""
        if self.precision == "bfloat16":
            return "bfloat16-rows" if rows <= SMALL_ROWS or not self.native_products else "bfloat16"
        if self.precision == "int8":
            if not self.native_products:
                if _in_rows(rows, self.cpp_int8):
                    return "int8-dynamic"
                return "int8-fbgemm" if self.fbgemm else "int8-weight-only"
            return "int8-weight-only" if rows <= INT8_WEIGHT_ONLY_MAX_ROWS else "int8-dynamic"
        return self.precision

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (M, K) float32 -> (M, N) float32
        kernel = self.kernel(x.shape[0])
        if kernel == "float32":
            if _in_rows(x.shape[0], self.packed_float32):
                return torch.ops.hf_vit_plus_cpp.fp32_packed_linear.default(x, self.weight, self.bias)
            return F.linear(x, self.weight, self.bias)
        if kernel == "int8-dynamic" and _in_rows(x.shape[0], self.cpp_int8):
            return torch.ops.hf_vit_plus_cpp.int8_vnni_linear.default(x, self.weight, self.scale, self.bias)
        if kernel == "bfloat16-rows":
            # Few rows: the conversion fuses into the vector-matrix loop (`row_matmul_pass`), which reads bf16 bytes;
            # more rows on a CPU without native bf16: float32 products of the converted weights.
            out = F.linear(x, self.weight.float())
        elif kernel == "bfloat16":
            out = F.linear(x.to(torch.bfloat16), self.weight).float()
        elif kernel == "int8-fbgemm":
            # FBGEMM quantizes the activations per tensor, over their range (with 0). One row: that is per row.
            # More rows: each is first mapped onto [0, 1] (x = lo + r * u), so that every row gets the whole range
            # and its products do not depend on the other rows of the batch, then mapped back: x W^T = r * (u W^T)
            # + lo * (row sums of W). (Not for one row: the two element-wise kernels would cost more than they save.)
            if x.shape[0] == 1:
                out = fbgemm_int8_linear_op()(x, self.weight, self.scale)
            else:
                lo = x.amin(dim=1, keepdim=True)
                spread = (x.amax(dim=1, keepdim=True) - lo).clamp(min=1e-12)
                mapped = fbgemm_int8_linear_op()((x - lo) / spread, self.weight, self.scale)
                out = mapped * spread + lo * self.row_sums
        elif kernel == "int8-weight-only":
            out = F.linear(x, self.weight.float()) * self.scale
        else:  # int8-dynamic: symmetric per-row activations, int32 accumulation
            x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0  # (M, 1)
            xq = torch.round(x / x_scale).clamp(-127, 127).to(torch.int8)
            out = torch._int_mm(xq, self.weight.t()).float() * (x_scale * self.scale)
        return out if self.bias is None else out + self.bias

    def nbytes(self) -> int:
        """Bytes read per step (weight, scales, bias)."""
        tensors = (self.weight, self.scale, self.bias, self.row_sums)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def stacked_linear(*linears: nn.Linear) -> nn.Linear:
    """One linear layer whose outputs are those of `linears` side by side (a missing bias counts as zeros)."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    stacked = nn.Linear(weight.shape[1], weight.shape[0], bias=any(lin.bias is not None for lin in linears))
    stacked = stacked.to(device=weight.device, dtype=weight.dtype).requires_grad_(False)
    stacked.weight.copy_(weight)
    if stacked.bias is not None:
        biases = [lin.bias.detach() if lin.bias is not None else weight.new_zeros(lin.out_features) for lin in linears]
        stacked.bias.copy_(torch.cat(biases))
    return stacked


# Tokens of the exact float32 recomputation per row in `OutputScreen`
SCREEN_CANDIDATES = 16


def _rounded_up(values: torch.Tensor) -> torch.Tensor:
    """float64 -> the float32 values at least as large."""
    out = values.float()
    return torch.where(out.double() < values, torch.nextafter(out, torch.full_like(out, float("inf"))), out)


class OutputScreen(nn.Module):
    """Greedy decoding's float32 choice for half the output projection's bytes: the token of largest float32 score,
    proven from a float16 pass.

    A one-row step reads every output-projection weight once: in float32 that is most of the step's bytes at
    translation sizes, where the step is memory-bound. The screen reads float16 copies of those weights instead
    (FBGEMM's linear, float32 activations and sums) and bounds each logit's error: with x the row's last hidden
    state, h_j the float16 weights of token j and w_j its float32 ones,

        |x.w_j + b_j - approx_j| <= |x| (|w_j - h_j| + r |h_j|) + r' |b_j|

    (Cauchy-Schwarz for the weights' rounding, plus generous bounds r, r' for float32 sums and additions). The logits
    processors (masks and forced tokens) act on the approximate scores as on the exact ones. The `candidates` tokens of
    largest upper bound are recomputed exactly in float32 from the float32 weights; if even the next upper bound is
    below the best lower bound, no other token can be the largest, and the choice among the candidates (largest
    exact score, smallest id among equals, as `argmax`) is float32's. Otherwise the step says so (`certain` False) and
    the caller takes the choice from all float32 logits (`FastDecoder.greedy_choice`). The bound is a small share of a
    row's logit range (the tests check it), so that fallback is rare: `FastDecoding.screen_fallbacks` counts it and
    the benchmark reports it."""

    def __init__(self, head: FastLinear, candidates: int = SCREEN_CANDIDATES):
        super().__init__()
        self.register_buffer("weight", head.weight, persistent=False)  # the model's float32 tensor (no copy)
        self.register_buffer("bias", head.bias, persistent=False)
        self.candidates = max(1, min(candidates, head.weight.shape[0] - 1))
        self.register_buffer("slack", torch.empty(head.weight.shape[0]), persistent=False)
        self.register_buffer("bias_slack", torch.zeros(head.weight.shape[0]), persistent=False)
        self.versions = None
        self.refresh()
        cpp_fbgemm_ops()  # the C++ kernels' one build, here rather than inside the step's export

    def _sources(self) -> tuple:
        return tuple(t._version for t in (self.weight, self.bias) if t is not None)

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute the error bounds if the weights changed in place since (the float16 copy follows by itself)."""
        if self.versions == self._sources():
            return
        weight = self.weight.double()
        half = self.weight.half().double()
        rounding = _sum_rounding(weight.shape[1]) + 2.0**-16
        slack = ((weight - half).norm(dim=1) + rounding * half.norm(dim=1)) * (1 + 2.0**-10)
        self.slack.copy_(_rounded_up(slack))
        if self.bias is not None:
            self.bias_slack.copy_(_rounded_up(2.0**-16 * self.bias.double().abs()))
        self.versions = self._sources()

    def nbytes(self, rows: int = 1) -> int:
        """Bytes read per step of `rows` rows: the float16 weights, the bias and bounds, the candidates' weights."""
        vocab, width = self.weight.shape
        vectors = 2 + (self.bias is not None)
        return vocab * width * 2 + vocab * 4 * vectors + rows * self.candidates * width * 4

    def approximate(self, hidden):
        """hidden: (R, D) -> the float16 pass's logits (R, V) and the bound of each one's error (R, V)."""
        approx = fbgemm_fp16_linear_op()(hidden, self.weight, self.slack)
        if self.bias is not None:
            approx = approx + self.bias
        return approx, hidden.norm(dim=1, keepdim=True) * (1 + 2.0**-10) * self.slack + self.bias_slack

    def forward(self, hidden, cur_len, controls):
        """hidden: (R, D) the rows' last hidden states -> the float32 greedy token of each row (R,), and whether the
        screen proved it for every row (0-d bool)."""
        vocab = self.weight.shape[0]
        approx, error = self.approximate(hidden)
        scores = process_scores(approx, cur_len, controls)
        floor = (scores - error).amax(dim=1)  # (R,) the best proven lower bound
        top = (scores + error).topk(self.candidates + 1, dim=1)
        certain = (top.values[:, -1] < floor).all()
        ids = top.indices[:, :-1]  # (R, k)
        exact = (hidden.unsqueeze(1) * self.weight[ids]).sum(-1)  # (R, k)
        if self.bias is not None:
            exact = exact + self.bias[ids]
        exact = process_scores(exact, cur_len, controls, ids)
        best = exact.amax(dim=1, keepdim=True)
        return torch.where(exact == best, ids, vocab).amin(dim=1), certain


__all__ = [
    "CPP_INT8_ROWS",
    "INT8_WEIGHT_ONLY_MAX_ROWS",
    "PACKED_FLOAT32_MIN_ROWS",
    "PACKED_FLOAT32_ROWS",
    "PRECISIONS",
    "SMALL_ROWS",
    "CppKernels",
    "FastLinear",
    "OutputScreen",
    "cpp_fbgemm_ops",
    "cpp_int8_rows",
    "cpp_kernels",
    "fbgemm_fp16_available",
    "fbgemm_fp16_linear_op",
    "fbgemm_int8_available",
    "fbgemm_int8_linear_op",
    "fbgemm_pack_counts",
    "kernel_paths",
    "packed_float32_rows",
    "python_fp16_fbgemm_linear_op",
    "python_int8_fbgemm_linear_op",
    "quantize_rows",
    "source_attention",
    "stacked_linear",
    "topk_rows",
    "use_cpu_isa",
]
