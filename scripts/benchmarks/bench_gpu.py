"""Short GPU benchmarks against the peers holding the same weights, written as JSON (`make gpu-check` runs them).

    python scripts/benchmarks/bench_gpu.py                          # every part on the GPU
    python scripts/benchmarks/bench_gpu.py --parts sparse --repeats 5
    python scripts/benchmarks/bench_gpu.py --quick --device cpu     # tiny sizes: checks that every part runs

Parts (`--parts`), each written to `bench_gpu_<part>.json` in `--out_dir` (default: $OUT, else results/gpu/), the file
rewritten after every measured case, so that a part stopped by a time limit keeps what it measured:

- vit: ViT-B/16 at 224 px (random weights) as hf_vit_plus, timm and transformers' ViT holding the same weights
  (timm's model converted by `hf_vit_plus.conversion.vit_plus_from_timm`, its state dict loaded into transformers'
  `ViTForImageClassification`): inference and one training step (forward, cross-entropy, backward, AdamW) under bf16
  autocast, images/s and peak memory; and the fp32 logits' largest difference from timm's (the same function).
- sparse: the Sparse Transformer's kernels at 4k, 8k and 16k tokens (batch 1, 8 heads of 64; bf16 on CUDA, fp32 on
  the CPU; each registered pattern at the stride of docs/sparse-attention.md) against dense causal attention
  (`F.scaled_dot_product_attention(is_causal=True)`: flash attention on CUDA): `sparse_flex` (flex_attention
  compiled with the pattern's block mask) and `sparse_block` (the parts merged by log-sum-exp), forward and forward +
  backward (flex: forward only on the CPU), median time, first call (compilation), peak memory on CUDA.
- decoding: greedy and beam search of a random Marian model (`scripts/benchmarks/bench_seq2seq.py`'s, opus-mt
  conventions) by transformers' `MarianMTModel`, our converted model (`seq2seq_from_marian`) eagerly, on a compiled
  static cache (`compiled_generation_config`: CUDA graphs on CUDA) and through `FastDecoding` (AOTInductor), and by
  CTranslate2 where it runs on the device: tokens/s, first call, and the share of tokens equal to Marian's.

Each case runs once untimed (warm-up, compilation), then `--repeats` times round-robin with the other engines of its
case, so that load on the machine affects all alike; the JSON holds the medians. What cannot run here (CTranslate2
without CUDA, flex's backward on the CPU) is listed under "skipped" with the reason, and printed; a case that fails is
listed under "failed" with its error, and the script exits with status 1 after the other cases.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from hf_vit_plus.cli_utils import CommandParser

PARTS = ("vit", "sparse", "decoding")
HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
# docs/sparse-attention.md's strides per length (about sqrt(n)); other lengths take the nearest smaller one
STRIDES = {256: 16, 512: 16, 1024: 32, 2048: 64, 4096: 64, 8192: 128, 16384: 128}
# (layers, width, MLP width, heads, image size, patch size): ViT-B/16, and the quick run's
VIT_SIZES = {"full": (12, 768, 3072, 12, 224, 16), "quick": (2, 64, 128, 2, 32, 8)}
# the random Marian model (bench_seq2seq.py's "small" preset, and the quick run's)
MARIAN_SIZES = {
    "full": dict(vocab_size=8000, d_model=256, layers=3, heads=4, ffn_dim=1024),
    "quick": dict(vocab_size=300, d_model=32, layers=2, heads=2, ffn_dim=64),
}


def default_out_dir() -> Path:
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO_ROOT / "results" / "gpu"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=list(PARTS), help=f"parts to run, from {', '.join(PARTS)} (all)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks that every part runs")
    p.add_argument("--repeats", type=int, help="timed runs per case (5; --quick: 1)")
    p.add_argument("--out_dir", type=Path, help="where the JSON files go (default: $OUT, else results/gpu/)")
    p.add_argument("--lengths", type=int, nargs="+", help="sparse: sequence lengths (4096 8192 16384; --quick: 256)")
    p.add_argument("--vit_batch", type=int, help="vit: images per batch (64; --quick: 2)")
    p.add_argument("--new_tokens", type=int, help="decoding: tokens generated per sequence, exactly (32; --quick: 4)")
    p.add_argument("--decode_batch", type=int, help="decoding: sequences per batch of the batched cases (16; 2)")
    args = p.parse_args(argv)
    unknown = [part for part in args.parts if part not in PARTS]
    if unknown:
        p.error(f"--parts: unknown part(s) {', '.join(unknown)}; expected some of {', '.join(PARTS)}")
    if args.device not in ("cuda", "cpu") and not args.device.startswith("cuda:"):
        p.error(f"--device must be cuda or cpu, got {args.device!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: the local host has no CUDA device (torch {torch.__version__}); use cpu")
    defaults = dict(repeats=(1, 5), lengths=([256], [4096, 8192, 16384]), vit_batch=(2, 64), new_tokens=(4, 32),
                    decode_batch=(2, 16))  # fmt: skip
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    for name in ("repeats", "vit_batch", "new_tokens", "decode_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    bad = [n for n in args.lengths if n < 16]
    if bad:
        p.error(f"--lengths must be at least 16 tokens each, got {bad}")
    args.out_dir = args.out_dir or default_out_dir()
    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        p.error(f"--out_dir {args.out_dir}: cannot create it ({error.strerror})")
    if not os.access(args.out_dir, os.W_OK):
        p.error(f"--out_dir {args.out_dir} is not writable")
    return args


def _load_script(name: str):
    """A sibling benchmark script as a module (its model builders: one definition of each peer)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------- the record
class Report:
    """One part's results: rows, skipped and failed cases, rewritten to its JSON file after every change."""

    def __init__(self, part: str, args: argparse.Namespace, settings: dict):
        self.path = args.out_dir / f"bench_gpu_{part}.json"
        self.data = {
            "part": part,
            "device": args.device,
            "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else _cpu_name(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "quick": args.quick,
            "repeats": args.repeats,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "settings": settings,
            "rows": [],
            "skipped": [],
            "failed": [],
        }
        self.save()

    def row(self, **fields) -> None:
        self.data["rows"].append(fields)
        self.save()

    def skip(self, what: str, why: str) -> None:
        self.data["skipped"].append({"what": what, "why": why})
        print(f"  skipped {what}: {why}")
        self.save()

    def fail(self, what: str, error: BaseException) -> None:
        self.data["failed"].append({"what": what, "error": f"{type(error).__name__}: {error}"[:2000]})
        print(f"  FAILED {what}: {type(error).__name__}: {str(error)[:300]}")
        traceback.print_exc(limit=3)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(cases: dict[str, Callable[[], object]], device: str, repeats: int, report: Report, what: str) -> dict:
    """Each case's first call (warm-up, compilation), then `repeats` timed calls round-robin; the peak memory of one
    more call on CUDA. Returns name -> {first_call_s, median_s, peak_mb}; a case that raises is reported failed and
    left out."""
    results, alive = {}, dict(cases)
    for name, fn in cases.items():
        try:
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            results[name] = {"first_call_s": time.perf_counter() - start, "times": []}
        except Exception as error:  # one engine's failure must not hide the others' results
            report.fail(f"{what}: {name}", error)
            alive.pop(name)
    for _ in range(repeats):
        for name, fn in list(alive.items()):
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            results[name]["times"].append(time.perf_counter() - start)
    for name, fn in alive.items():
        entry = results[name]
        entry["median_s"] = statistics.median(entry.pop("times"))
        entry["peak_mb"] = None
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            fn()
            sync(device)
            entry["peak_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    return results


# ------------------------------------------------------------------------------------------------------- vit
def build_vits(size: tuple, num_labels: int = 1000) -> dict[str, torch.nn.Module]:
    """timm's `VisionTransformer` (random weights), ours converted from it, transformers' ViT with our state dict."""
    import timm
    from transformers import ViTConfig, ViTForImageClassification

    from hf_vit_plus.conversion import vit_plus_from_timm

    layers, width, mlp, heads, image, patch = size
    torch.manual_seed(0)
    timm_model = timm.create_model(
        "vit_base_patch16_224", pretrained=False, img_size=image, patch_size=patch, embed_dim=width, depth=layers,
        num_heads=heads, mlp_ratio=mlp / width, num_classes=num_labels,
    )  # fmt: skip
    ours = vit_plus_from_timm(timm_model)
    ours.set_attn_implementation("sdpa")
    hf_config = ViTConfig(
        hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=mlp,
        image_size=image, patch_size=patch, layer_norm_eps=ours.config.layer_norm_eps, num_labels=num_labels,
    )  # fmt: skip
    reference = ViTForImageClassification(hf_config)
    reference.load_state_dict(ours.state_dict(), strict=True)
    reference.set_attn_implementation("sdpa")
    return {"hf_vit_plus": ours, "timm": timm_model, "transformers": reference}


def _logits(model, pixels):
    out = model(pixels)
    return out if isinstance(out, torch.Tensor) else out.logits


def run_vit(args) -> Report:
    size = VIT_SIZES["quick" if args.quick else "full"]
    device, batch = args.device, args.vit_batch
    report = Report("vit", args, {"layers_width_mlp_heads_image_patch": size, "batch": batch, "precision": "bf16"})
    models = {name: m.to(device) for name, m in build_vits(size).items()}
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn(batch, 3, size[4], size[4], generator=g).to(device)
    labels = torch.randint(0, 1000, (batch,), generator=g).to(device)
    with torch.no_grad():
        for m in models.values():
            m.eval()
        reference = _logits(models["timm"], pixels).float()
        for name, m in models.items():
            diff = (_logits(m, pixels).float() - reference).abs().max().item()
            report.row(case="fp32 logits against timm's", engine=name, max_abs_diff=diff)
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16)

    def inference(m):
        def fn():
            with torch.no_grad(), autocast:
                return _logits(m, pixels)

        return fn

    results = measure({n: inference(m) for n, m in models.items()}, device, args.repeats, report, "vit inference")
    for name, r in results.items():
        report.row(case=f"inference bf16, batch {batch}", engine=name, images_per_s=batch / r["median_s"], **r)
    trainable = {name: copy.deepcopy(m).train() for name, m in models.items()}
    fused = device.startswith("cuda")
    optimizers = {n: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=fused) for n, m in trainable.items()}

    def training(name):
        model, optimizer = trainable[name], optimizers[name]

        def fn():
            with autocast:
                loss = F.cross_entropy(_logits(model, pixels).float(), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return fn

    results = measure({n: training(n) for n in trainable}, device, args.repeats, report, "vit training")
    for name, r in results.items():
        report.row(case=f"training step bf16, batch {batch}", engine=name, images_per_s=batch / r["median_s"], **r)
    return report


# ---------------------------------------------------------------------------------------------------- sparse
def _stride(n: int) -> int:
    return STRIDES[max([k for k in STRIDES if k <= n] or [min(STRIDES)])]


def _attention(kernel: Callable, inputs, train: bool) -> Callable[[], None]:
    """One call of `kernel(q, k, v)`: forward without gradients, or forward and backward of the output's sum."""

    def call():
        with torch.set_grad_enabled(train):
            out = kernel(*inputs)
        if train:
            out.sum().backward()

    return call


def run_sparse(args) -> Report:
    from hf_vit_plus.models import sparse_attention as sa
    from hf_vit_plus.models.sparse_layouts import PATTERN_KINDS, PATTERNS, build_pattern

    device = args.device
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    heads, head_dim = 8, 64
    settings = {"batch": 1, "heads": heads, "head_dim": head_dim, "dtype": str(dtype), "lengths": args.lengths,
                "strides": {n: _stride(n) for n in args.lengths}, "kinds": list(PATTERN_KINDS)}  # fmt: skip
    report = Report("sparse", args, settings)
    if not cuda:
        report.skip("sparse_flex forward + backward", "flex_attention has no backward on the CPU")
    for n in args.lengths:
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(1, heads, n, head_dim, generator=g).to(device, dtype) for _ in range(3))
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        dense = functools.partial(F.scaled_dot_product_attention, is_causal=True)
        for kind in PATTERN_KINDS:
            stride = _stride(n)
            pattern = build_pattern(kind, stride, **PATTERNS[kind].default_settings(stride), causal=True)
            flex = lambda a, b, c, p=pattern: sa.flex_sparse_attention(a, b, c, p)  # noqa: E731
            block = lambda a, b, c, p=pattern: sa.block_sparse_attention(a, b, c, p)  # noqa: E731
            try:
                with torch.no_grad():
                    diff = (flex(q, k, v).float() - block(q, k, v).float()).abs().max().item()
                report.row(case=f"{kind} n={n}", engine="sparse_flex against sparse_block", max_abs_diff=diff)
            except Exception as error:
                report.fail(f"sparse {kind} n={n}: flex against block", error)
            for train in (False, True):
                mode = "fwd+bwd" if train else "fwd"
                inputs = leaves if train else (q, k, v)
                cases = {
                    "sdpa dense causal": _attention(dense, inputs, train),
                    "sparse_block": _attention(block, inputs, train),
                }
                if cuda or not train:
                    cases["sparse_flex"] = _attention(flex, inputs, train)
                results = measure(cases, device, args.repeats, report, f"sparse {kind} n={n} {mode}")
                base = results.get("sdpa dense causal", {}).get("median_s")
                for name, r in results.items():
                    ratio = r["median_s"] / base if base else None
                    report.row(case=f"{kind} n={n} {mode}", engine=name, stride=stride, time_vs_dense=ratio, **r)
        del q, k, v, leaves, inputs, cases
        if cuda:
            torch.cuda.empty_cache()
    return report


# -------------------------------------------------------------------------------------------------- decoding
def run_decoding(args) -> Report:
    from hf_vit_plus.conversion import seq2seq_from_marian
    from hf_vit_plus.generation import compiled_generation_config
    from hf_vit_plus.models.fast_decoding import FastDecoding

    bench = _load_script("bench_seq2seq")
    device, n = args.device, args.new_tokens
    cuda = device.startswith("cuda")
    sizes = MARIAN_SIZES["quick" if args.quick else "full"]
    marian_args = argparse.Namespace(**sizes, activation="swish", source_length=16 if args.quick else 32,
                                     new_tokens=n, attn_implementation="sdpa", threads=[torch.get_num_threads()],
                                     device=device, engines=["ct2-fp32"])  # fmt: skip
    # the CPU quick run traces the compiled steps without inductor (seconds, not minutes of compilation)
    light = args.quick and not cuda
    settings = {**sizes, "source_length": marian_args.source_length, "new_tokens": n,
                "compile": "dynamo trace only (quick CPU run)" if light else "inductor"}  # fmt: skip
    report = Report("decoding", args, settings)
    marian = bench.build_marian(marian_args).eval()
    ours = seq2seq_from_marian(marian).eval().to(device)
    marian = marian.to(device)
    if light:
        from transformers import CompileConfig

        compile_config = CompileConfig(backend="eager", fullgraph=True, dynamic=False, mode=None)
        compile_config._compile_all_devices = True
    else:
        compile_config = compiled_generation_config(device)
    fast = FastDecoding(backend="eager" if light else "aoti")
    engines: dict[str, Callable] = {}

    def hf_engine(model, **extra):
        def generate(ids, beams):
            settings = dict(num_beams=beams, do_sample=False, length_penalty=1.0, min_new_tokens=n, max_new_tokens=n)
            with torch.no_grad():
                return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **settings, **extra)[:, 1:]

        return generate

    engines["marian"] = hf_engine(marian)
    engines["ours"] = hf_engine(ours)
    engines["ours-compiled"] = hf_engine(ours, cache_implementation="static", compile_config=compile_config)
    engines["ours-fast"] = hf_engine(ours, custom_generate=fast)
    try:
        import ctranslate2

        if cuda and ctranslate2.get_cuda_device_count() < 1:
            report.skip("ct2-fp32", f"this CTranslate2 ({ctranslate2.__version__}) has no CUDA device support")
        else:
            workdir = Path(tempfile.mkdtemp(prefix="bench_gpu_"))
            marian.save_pretrained(workdir / "marian")
            built = bench.build_ctranslate2(workdir / "marian", workdir, marian_args)["ct2-fp32"]
            ct2 = bench.engine_at(built, torch.get_num_threads())  # one engine per thread count: this run's
            engines["ct2-fp32"] = lambda ids, beams: ct2.generate(ids.cpu(), beams, n)
    except ImportError as error:
        report.skip("ct2-fp32", f"ctranslate2 is not installed ({error})")
    except Exception as error:
        report.fail("ct2-fp32: conversion", error)

    g = torch.Generator().manual_seed(0)
    vocab = sizes["vocab_size"]
    cases = [("greedy", 1, 1), ("greedy", args.decode_batch, 1), ("beam 4", args.decode_batch, 4)]
    for label, batch, beams in cases:
        ids = torch.randint(2, vocab - 1, (batch, marian_args.source_length), generator=g).to(device)
        outputs = {}

        def call(name, ids=ids, beams=beams, outputs=outputs):
            def fn():
                outputs[name] = engines[name](ids, beams)

            return fn

        what = f"{label}, batch {batch}"
        results = measure({name: call(name) for name in engines}, device, args.repeats, report, what)
        reference = outputs.get("marian")
        for name, r in results.items():
            out = outputs[name]
            agreement = None
            if reference is not None and out.shape == reference.shape:
                agreement = (out.cpu() == reference.cpu()).float().mean().item()
            report.row(case=what, engine=name, tokens_per_s=batch * n / r["median_s"], agreement_with_marian=agreement,
                       **r)  # fmt: skip
    return report


RUNNERS = {"vit": run_vit, "sparse": run_sparse, "decoding": run_decoding}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"# bench_gpu: device {args.device}, torch {torch.__version__}, repeats {args.repeats}, "
          f"{'quick' if args.quick else 'full'} sizes -> {args.out_dir}")  # fmt: skip
    tf32, limit = torch.backends.cuda.matmul.allow_tf32, torch._dynamo.config.recompile_limit
    torch.backends.cuda.matmul.allow_tf32 = True  # what a user trains with on a GPU; the tests check exact fp32
    # one compiled flex_attention serves every pattern, length and direction: past torch's limit of 8 graphs per
    # function it would run eagerly, silently
    torch._dynamo.config.recompile_limit = 64
    try:
        return 1 if sum(run_part(part, args) for part in args.parts) else 0
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch._dynamo.config.recompile_limit = tf32, limit


def run_part(part: str, args: argparse.Namespace) -> int:
    """Run one part, print its rows; the number of its failed cases."""
    start = time.perf_counter()
    print(f"## {part}")
    try:
        report = RUNNERS[part](args)
    except Exception as error:  # a part that cannot start: recorded, the others still run
        report = Report(part, args, {})
        report.fail(f"{part}: set-up", error)
    report.data["seconds"] = time.perf_counter() - start
    report.save()
    for row in report.data["rows"]:
        numbers = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items() if k != "case"}
        print(f"  {row['case']}: {numbers}")
    print(f"  -> {report.path} ({report.data['seconds']:.1f} s, {len(report.data['skipped'])} skipped, "
          f"{len(report.data['failed'])} failed)")  # fmt: skip
    return len(report.data["failed"])


if __name__ == "__main__":
    sys.exit(main())
