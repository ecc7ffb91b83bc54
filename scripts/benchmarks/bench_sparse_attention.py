"""Sparse Transformer attention kernels against dense causal SDPA: time and peak memory, n = 1k ... 16k.

    python scripts/benchmarks/bench_sparse_attention.py                          # n up to 16k, 3 repeats
    python scripts/benchmarks/bench_sparse_attention.py --max_n 4096 --repeats 2 --no_memory

Batch 1, 8 heads, head dim 64, fp32, causal; stride l = 32, 64, 64, 128, 128 for n = 1k, 2k, 4k, 8k, 16k and each
registered pattern's default second setting (`PatternKind.default_settings`: the fixed pattern's c = l / 4, the
settings of docs/sparse-attention.md). Every pattern of `sparse_layouts.PATTERNS` is measured (`--kinds`). Rows:

- sdpa: dense causal `F.scaled_dot_product_attention(is_causal=True)`, the baseline of every ratio;
- sparse_dense: the dense masked reference (pattern as a boolean mask; up to `--dense_max_n`);
- sparse_block: the O(n sqrt(n)) kernel (per-part flash attention + log-sum-exp merge), forward and backward;
- sparse_flex: flex_attention compiled (CPU: forward only; up to `--flex_max_n`; compilation, tens of seconds
  per shape, excluded; no memory figure: the compiler's own peak would hide the kernel's).

Time: for each n the cases run round-robin, `--repeats` times, so that load from other processes hits all alike;
the table gives medians and the ratio to sdpa's median. "fwd" runs under no_grad; "fwd+bwd" is forward with
grad plus backward of `out.sum()`.
Memory: each case runs once more (forward + backward) in a fresh subprocess, which resets its peak resident set
size (/proc/self/clear_refs) after creating the inputs and reports the growth of the peak (VmHWM) over that RSS:
the extra host memory the kernel needed at its peak, masks, saved tensors and the input gradients (3 x the input
size, ~100 MB at 16k) included. It is coarse (page granularity, allocator caching) but honest for CPU tensors,
unlike tracemalloc, which does not see torch's allocations.

Other processes share the machine: the times are noisy (compare ratios from one run, not absolute seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from hf_vit_plus.cli_utils import CommandParser
from hf_vit_plus.models.sparse_layouts import PATTERN_KINDS

STRIDES = {1024: 32, 2048: 64, 4096: 64, 8192: 128, 16384: 128}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max_n", type=int, default=16384, help="longest sequence measured")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per case")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--head_dim", type=int, default=64, help="size of each head")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--dense_max_n", type=int, default=4096, help="largest n for the dense masked reference")
    p.add_argument("--flex_max_n", type=int, default=2048, help="largest n for compiled flex (forward only)")
    p.add_argument("--no_memory", action="store_true", help="skip the per-case memory subprocesses")
    p.add_argument("--no_flex", action="store_true", help="skip flex_attention")
    p.add_argument("--output", default=None, help="write the table's rows to this CSV (results/sparse_attention.csv)")
    p.add_argument(
        "--kinds", nargs="+", default=list(PATTERN_KINDS), choices=PATTERN_KINDS, help="sparse patterns to measure"
    )
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # internal: one memory measurement
    return p.parse_args(argv)


def make_inputs(n: int, heads: int, head_dim: int, requires_grad: bool):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, heads, n, head_dim, generator=g, requires_grad=requires_grad) for _ in range(3)]


def make_call(kernel: str, kind: str | None, n: int):
    """A function (q, k, v) -> (B, H, T, D) for one case."""
    from hf_vit_plus.models.sparse_attention import (
        block_sparse_attention,
        dense_sparse_attention,
        flex_sparse_attention,
    )
    from hf_vit_plus.models.sparse_layouts import PATTERNS, build_pattern

    if kernel == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    stride = STRIDES[n]
    pattern = build_pattern(kind, stride, **PATTERNS[kind].default_settings(stride))
    fn = {"sparse_dense": dense_sparse_attention, "sparse_block": block_sparse_attention}.get(kernel)
    if kernel == "sparse_flex":
        return lambda q, k, v: flex_sparse_attention(q, k, v, pattern)
    return lambda q, k, v: fn(q, k, v, pattern)


def cases_for(n: int, args) -> list[tuple[str, str | None]]:
    cases = [("sdpa", None)]
    for kind in args.kinds:
        if n <= args.dense_max_n:
            cases.append(("sparse_dense", kind))
        cases.append(("sparse_block", kind))
        if not args.no_flex and n <= args.flex_max_n:
            cases.append(("sparse_flex", kind))
    return cases


def time_fwd(call, inputs) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        call(*inputs)
        return time.perf_counter() - start


def time_fwd_bwd(call, inputs) -> float:
    for x in inputs:
        x.grad = None
    start = time.perf_counter()
    call(*inputs).sum().backward()
    return time.perf_counter() - start


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure_memory_case(spec: str) -> None:
    """Subprocess body: one case, print the growth of the peak RSS (MB) as JSON."""
    kernel, kind, n, heads, head_dim = spec.split(",")
    n = int(n)
    inputs = make_inputs(n, int(heads), int(head_dim), requires_grad=True)
    call = make_call(kernel, None if kind == "-" else kind, n)
    base = rss_mb()
    reset = reset_peak_rss()
    before_peak = peak_rss_mb()
    time_fwd_bwd(call, inputs)
    extra = peak_rss_mb() - (base if reset else max(base, before_peak))
    print(json.dumps({"extra_peak_mb": max(0.0, extra)}))


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0), so that import-time peaks do not hide the case's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def memory_of(kernel: str, kind: str | None, n: int, args) -> float | None:
    spec = f"{kernel},{kind or '-'},{n},{args.heads},{args.head_dim}"
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run(
        [sys.executable, __file__, "--case", spec, "--threads", str(args.threads)],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        print(f"memory case {spec} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["extra_peak_mb"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.case:
        measure_memory_case(args.case)
        return
    print(
        f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} cpus visible, "
        f"{args.threads} thread(s); B=1, H={args.heads}, D={args.head_dim}, fp32, causal; repeats={args.repeats}"
    )
    rows = []
    for n in [n for n in STRIDES if n <= args.max_n]:
        cases = cases_for(n, args)
        calls = {case: make_call(case[0], case[1], n) for case in cases}
        grad_inputs = make_inputs(n, args.heads, args.head_dim, True)
        inputs = [x.detach() for x in grad_inputs]
        for call in calls.values():  # warm-up (and flex compilation) outside the measurements
            time_fwd(call, inputs)
        fwd = {case: [] for case in cases}
        fwd_bwd = {case: [] for case in cases}
        for _ in range(args.repeats):
            for case, call in calls.items():
                fwd[case].append(time_fwd(call, inputs))
                if case[0] != "sparse_flex":
                    fwd_bwd[case].append(time_fwd_bwd(call, grad_inputs))
        base_f = statistics.median(fwd[("sdpa", None)])
        base_fb = statistics.median(fwd_bwd[("sdpa", None)])
        for case in cases:
            f = statistics.median(fwd[case])
            fb = statistics.median(fwd_bwd[case]) if fwd_bwd[case] else None
            mem = None if args.no_memory or case[0] == "sparse_flex" else memory_of(case[0], case[1], n, args)
            row = (n, STRIDES[n], case[0], case[1] or "-", f, f / base_f, fb, fb / base_fb if fb else None, mem)
            rows.append(row)
            print_row(row, header=len(rows) == 1)
    print("\npeak MB: growth of the peak RSS of a fresh process over its RSS with the inputs allocated (fwd+bwd)")
    if args.output:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from result_rows import write_rows

        fields = ("n", "stride", "kernel", "pattern", "fwd_s", "fwd_vs_sdpa", "fwd_bwd_s", "fwd_bwd_vs_sdpa",
                  "peak_mb")  # fmt: skip
        table = [{k: ("" if v is None else round(v, 5) if isinstance(v, float) else v) for k, v in zip(fields, row)}
                 for row in rows]  # fmt: skip
        for row in table:
            row.update(heads=args.heads, head_dim=args.head_dim, repeats=args.repeats)
        print(f"wrote {write_rows(args.output, table, threads=args.threads)}")


def print_row(row, header=False) -> None:
    if header:
        print("| n | l | kernel | pattern | fwd s | fwd / sdpa | fwd+bwd s | fwd+bwd / sdpa | peak MB |")
        print("|---|---|---|---|---|---|---|---|---|")
    n, stride, kernel, kind, f, fr, fb, fbr, mem = row
    fb_s = "-" if fb is None else f"{fb:.3f}"
    fbr_s = "-" if fbr is None else f"{fbr:.3f}x"
    mem_s = "-" if mem is None else f"{mem:.0f}"
    print(f"| {n} | {stride} | {kernel} | {kind} | {f:.3f} | {fr:.3f}x | {fb_s} | {fbr_s} | {mem_s} |", flush=True)


if __name__ == "__main__":
    main()
