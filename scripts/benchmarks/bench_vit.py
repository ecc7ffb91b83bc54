"""ViT throughput: hf_vit_plus against timm and transformers' ViT with the same weights, measured interleaved.

    python scripts/benchmarks/bench_vit.py                       # ViT-B/16 at 224, batch 1/8/32, fp32, bf16, int8
    python scripts/benchmarks/bench_vit.py --preset tiny-patch16-224 --batch_sizes 1 8 --repeats 5
    python scripts/benchmarks/bench_vit.py --precisions fp32 int8-dynamic --batch_sizes 8   # the int8 target
    python scripts/benchmarks/bench_vit.py --attention_lengths 17 33 65 129 197 --threads 2   # CPU kernel choice
    python scripts/benchmarks/bench_vit.py --training_step --preset small-patch16-224 --batch_sizes 32 \
        --output results/vit_training_step.csv                    # a training step against timm's

`--attention_lengths` times one attention layer's forward + backward (training) on the CPU at each sequence length,
torch's sdpa against the reference kernel (matmul-softmax-matmul, `eager_attention_forward`), interleaved, with the
batch sized so that every length sees about `--attention_tokens` tokens: the measurement behind
`hf_vit_plus.models.attention.SHORT_CPU_SEQUENCE` (sdpa's CPU kernel is skipped up to that many keys).

For each (precision, batch) the three models run round-robin, `--repeats` times each, after warm-up; the table
gives the median images/s, our ratio to each peer, and the achieved GFLOP/s as a share of a measured GEMM peak
(a (B*T x D) @ (D x 4D) matmul in the same precision, the shape of the MLP's first layer).
Precisions: fp32; bf16-autocast (fp32 weights, `torch.autocast("cpu", torch.bfloat16)`); bf16 (bf16 weights);
int8-dynamic and int8-weight-only: ours quantized by `hf_vit_plus.quantization.quantize` (torchao; every linear
layer), while timm and transformers stay in fp32, the baseline int8 is measured against. The int8-dynamic row's
GEMM peak for ours is that of an int8 x int8 -> int32 product (`torch._int_mm`) of the same shape; weight-only int8
computes its products in fp32 (fp32 peak). int8-dynamic-compiled (not in the default list): the int8-dynamic model
under `torch.compile`, which fuses the per-row quantization of the activations (compiled during the warm-up).
Where the instruction set in use has no int8 dot products (no VNNI or AMX, or `--isa avx2` on a CPU with them),
`quantize` gives int8-dynamic FBGEMM's dynamic int8 linear instead (`hf_vit_plus.quantization.dynamic_int8_backend`,
in the table's header), and its GEMM peak is FBGEMM's product of the same shape.

`--isa LEVEL` measures with every library capped at that instruction set (ours, torch's ATen, MKL, oneDNN, FBGEMM):
the script starts again in a process capped so, and its rows record `isa` and `isa_capped`. A capped run on a wider
CPU runs the narrower set's instructions, not a narrower CPU's caches and clocks (the header says so).

`--training_step` times one fp32 training update instead (forward, cross-entropy, backward, AdamW with torch's
defaults, gradients set to None), each model on its own copy of the same weights and its own optimizer, in turn;
the GEMM-peak share counts 3 forward passes' FLOPs (forward, and backward's two products per GEMM).

In every table the FLOPs counted are the whole encoder's, as timm computes it: our classifier computes its last block
for the class token alone (its keys and values for every token), so its GFLOP/s and share are effective ones.

"ours" is hf_vit_plus with the opt-in `hf_vit_plus.cpu_precision.use_fp32_matmul_for_low_precision` (bf16/fp16 CPU
products computed in fp32 where the CPU lacks native bf16 instructions; a no-op in fp32 and on CPUs with native
bf16); the table's header says so. `--no_fp32_matmul` measures the plain model instead, with standard layers like
the peers.
"""

from __future__ import annotations

import functools
import platform
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from hf_vit_plus.cli_utils import CommandParser
from hf_vit_plus.cpu_precision import cpu_has_native_low_precision_matmul

INT8_SCHEMES = ("int8-dynamic", "int8-weight-only")  # hf_vit_plus.quantization.SCHEMES (imported only when measured)


def build_models(preset: str, fp32_matmul: bool = True):
    import timm
    from transformers import ViTConfig, ViTForImageClassification

    from hf_vit_plus import ViTPlusConfig
    from hf_vit_plus.conversion import vit_plus_from_timm
    from hf_vit_plus.cpu_precision import use_fp32_matmul_for_low_precision

    config = ViTPlusConfig.from_preset(preset, num_labels=1000)
    size = preset.split("-")[0]
    timm_name = f"vit_{size}_patch{config.patch_size}_{config.image_size}"
    torch.manual_seed(0)
    timm_model = timm.create_model(
        timm_name,
        pretrained=False,
        patch_size=config.patch_size,
        img_size=config.image_size,
        embed_dim=config.hidden_size,
        depth=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
    ).eval()
    ours = vit_plus_from_timm(timm_model).eval()
    ours.set_attn_implementation("sdpa")
    hf_config = ViTConfig(
        **{k: getattr(ours.config, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads")},
        intermediate_size=ours.config.intermediate_size,
        image_size=ours.config.image_size,
        patch_size=ours.config.patch_size,
        layer_norm_eps=1e-6,
        num_labels=1000,
    )
    reference = ViTForImageClassification(hf_config).eval()
    reference.load_state_dict(ours.state_dict(), strict=True)
    reference.set_attn_implementation("sdpa")
    if fp32_matmul:  # after copying the weights: the opt-in changes layer classes only
        use_fp32_matmul_for_low_precision(ours)
    return config, {"hf_vit_plus": ours, "timm": timm_model, "transformers": reference}


def forward_flops(config, batch: int) -> float:
    """Multiply-adds x 2 of one forward pass (GEMMs and attention; norms and activations ignored)."""
    d, t = config.hidden_size, config.num_patches + 1
    per_layer = 2 * t * d * (3 * d) + 2 * t * d * d + 2 * 2 * t * t * d + 2 * 2 * t * d * config.intermediate_size
    patch = 2 * config.num_patches * (config.num_channels * config.patch_size**2) * d
    return batch * (config.num_hidden_layers * per_layer + patch + 2 * d * config.num_labels)


def gemm_peak(config, batch: int, dtype: torch.dtype, repeats: int = 5) -> float:
    m = batch * (config.num_patches + 1)
    if dtype == torch.int8 and _int8_backend() == "fbgemm":  # FBGEMM's dynamic int8 linear, as the model runs it
        from hf_vit_plus.quantization import FbgemmInt8Linear

        layer = torch.nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        FbgemmInt8Linear.from_float(layer)
        a = torch.randn(m, config.hidden_size)
        b = None

        def product(a, _b, layer=layer):
            return layer(a)

    elif dtype == torch.int8:  # int8 x int8 -> int32, the product of dynamic int8 quantization
        a = torch.randint(-127, 128, (m, config.hidden_size), dtype=dtype)
        b = torch.randint(-127, 128, (config.hidden_size, config.intermediate_size), dtype=dtype)
        product = torch._int_mm
    else:
        a = torch.randn(m, config.hidden_size, dtype=dtype)
        b = torch.randn(config.hidden_size, config.intermediate_size, dtype=dtype)
        product = torch.matmul
    for _ in range(2):
        product(a, b)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        product(a, b)
        times.append(time.perf_counter() - start)
    return 2 * m * config.hidden_size * config.intermediate_size / min(times)


def _int8_backend() -> str:
    from hf_vit_plus.quantization import dynamic_int8_backend

    return dynamic_int8_backend()


def timed_in_turn(calls: dict, warmup: int, repeats: int) -> dict[str, list[float]]:
    """Each call's times in seconds: `warmup` untimed rounds, then `repeats` rounds of every call in turn, the order
    rotated each round so that no call always goes first."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return times


def run(args) -> list[dict]:
    """Print the throughput table; return its rows (precision, batch, images/s of each model, ours' ratios)."""
    rows = []
    fp32_matmul = not args.no_fp32_matmul
    config, fp32_models = build_models(args.preset, fp32_matmul=fp32_matmul)
    ours = "ours (fp32-matmul opt-in)" if fp32_matmul else "ours (plain)"
    print(f"# {args.preset}: torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor()}")
    print(f"# CPU: {_cpu_name()}, native bf16 matmul: {cpu_has_native_low_precision_matmul()}")
    print(f"# {_result_rows().isa_summary()}")
    if fp32_matmul:
        print("# ours = hf_vit_plus with hf_vit_plus.cpu_precision.use_fp32_matmul_for_low_precision (opt-in)")
    if any(p.startswith("int8") for p in args.precisions):
        print(f"# int8-* rows: ours = hf_vit_plus quantized with hf_vit_plus.quantization.quantize (int8-dynamic: "
              f"{_int8_backend()}); timm and transformers in fp32")  # fmt: skip
    header = (
        f"| precision | batch | {ours} img/s | timm img/s | transformers img/s | vs timm | vs transformers "
        "| ours GFLOP/s | % of GEMM peak | timm % | transformers % |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for precision in args.precisions:
        if precision == "bf16":
            models = {name: _copy_to(m, torch.bfloat16) for name, m in fp32_models.items()}
        elif precision in INT8_SCHEMES:
            models = {**fp32_models, "hf_vit_plus": _quantized(fp32_models["hf_vit_plus"], precision)}
        elif precision == "int8-dynamic-compiled":
            compiled = torch.compile(_quantized(fp32_models["hf_vit_plus"], "int8-dynamic"))
            models = {**fp32_models, "hf_vit_plus": compiled}
        else:
            models = fp32_models
        autocast = precision == "bf16-autocast"
        context = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else nullcontext
        peak_dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float32
        ours_peak_dtype = torch.int8 if precision.startswith("int8-dynamic") else peak_dtype
        for batch in args.batch_sizes:
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            x = torch.randn(batch, config.num_channels, config.image_size, config.image_size, dtype=dtype)
            with torch.inference_mode(), context():
                times = timed_in_turn(
                    {name: functools.partial(_call, name, model, x) for name, model in models.items()},
                    args.warmup,
                    args.repeats,
                )
            ips = {name: batch / statistics.median(t) for name, t in times.items()}
            flops = forward_flops(config, batch)
            peak = gemm_peak(config, batch, peak_dtype)
            peaks = {name: peak for name in models}
            if ours_peak_dtype != peak_dtype:
                peaks["hf_vit_plus"] = gemm_peak(config, batch, ours_peak_dtype)
            share = {name: 100 * flops * ips[name] / batch / peaks[name] for name in models}
            print(
                f"| {precision} | {batch} | {ips['hf_vit_plus']:.1f} | {ips['timm']:.1f} | {ips['transformers']:.1f} "
                f"| {ips['hf_vit_plus'] / ips['timm']:.2f}x | {ips['hf_vit_plus'] / ips['transformers']:.2f}x "
                f"| {flops * ips['hf_vit_plus'] / batch / 1e9:.0f} | {share['hf_vit_plus']:.0f}% "
                f"| {share['timm']:.0f}% | {share['transformers']:.0f}% |",
                flush=True,
            )
            rows.append(dict(preset=args.preset, precision=precision, batch=batch,
                             ours_images_per_s=round(ips["hf_vit_plus"], 2), timm_images_per_s=round(ips["timm"], 2),
                             transformers_images_per_s=round(ips["transformers"], 2),
                             vs_timm=round(ips["hf_vit_plus"] / ips["timm"], 4),
                             vs_transformers=round(ips["hf_vit_plus"] / ips["transformers"], 4),
                             ours_share_of_gemm_peak=round(share["hf_vit_plus"] / 100, 4),
                             fp32_matmul_opt_in=fp32_matmul, repeats=args.repeats))  # fmt: skip
    return rows


def training_step_rows(args) -> list[dict]:
    """Print the training-step table (fp32; see the module docstring); return its rows in `run`'s columns."""
    import copy

    import torch.nn.functional as F

    rows = []
    config, eval_models = build_models(args.preset, fp32_matmul=False)
    print(f"# {args.preset} training step (fp32, AdamW): torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads, CPU: {_cpu_name()}")  # fmt: skip
    print("| batch | ours img/s | timm img/s | transformers img/s | vs timm | vs transformers | ours % of GEMM peak |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batch_sizes:
        models = {name: copy.deepcopy(model).train() for name, model in eval_models.items()}
        optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}
        generator = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, config.num_channels, config.image_size, config.image_size, generator=generator)
        labels = torch.randint(0, config.num_labels, (batch,), generator=generator)

        def step(name, models=models, optimizers=optimizers, x=x, labels=labels):
            optimizers[name].zero_grad(set_to_none=True)
            F.cross_entropy(_call(name, models[name], x), labels).backward()
            optimizers[name].step()

        times = timed_in_turn({name: functools.partial(step, name) for name in models}, args.warmup, args.repeats)
        ips = {name: batch / statistics.median(t) for name, t in times.items()}
        share = 3 * forward_flops(config, batch) * ips["hf_vit_plus"] / batch / gemm_peak(config, batch, torch.float32)
        print(f"| {batch} | {ips['hf_vit_plus']:.2f} | {ips['timm']:.2f} | {ips['transformers']:.2f} "
              f"| {ips['hf_vit_plus'] / ips['timm']:.3f}x | {ips['hf_vit_plus'] / ips['transformers']:.3f}x "
              f"| {100 * share:.0f}% |", flush=True)  # fmt: skip
        rows.append(dict(preset=args.preset, precision="fp32-training-step", batch=batch,
                         ours_images_per_s=round(ips["hf_vit_plus"], 2), timm_images_per_s=round(ips["timm"], 2),
                         transformers_images_per_s=round(ips["transformers"], 2),
                         vs_timm=round(ips["hf_vit_plus"] / ips["timm"], 4),
                         vs_transformers=round(ips["hf_vit_plus"] / ips["transformers"], 4),
                         ours_share_of_gemm_peak=round(share, 4), fp32_matmul_opt_in=False,
                         repeats=args.repeats))  # fmt: skip
    return rows


def _call(name: str, model, x: torch.Tensor):
    return model(x) if name == "timm" else model(pixel_values=x).logits


def _copy_to(model, dtype):
    import copy

    return copy.deepcopy(model).to(dtype)


def _quantized(model, scheme: str):
    """A copy of `model` with standard layers (the fp32-matmul opt-in undone), quantized by `quantize`."""
    import copy

    from hf_vit_plus.cpu_precision import restore_standard_layers
    from hf_vit_plus.quantization import quantize

    return quantize(restore_standard_layers(copy.deepcopy(model)), scheme)


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def attention_length_table(lengths, heads: int, head_dim: int, tokens: int, repeats: int) -> list[str]:
    """sdpa against the reference kernel, forward + backward of one layer, at each sequence length (markdown rows)."""
    import torch.nn.functional as F

    from hf_vit_plus.models.attention import SHORT_CPU_SEQUENCE, eager_attention_forward

    class Layer(torch.nn.Module):  # what the kernels read of the calling layer
        training, is_causal = True, False

    lines = [
        f"One attention layer, forward + backward, fp32 CPU, {heads} heads of {head_dim}, about {tokens} tokens a "
        f"batch, {torch.get_num_threads()} thread(s) (SHORT_CPU_SEQUENCE = {SHORT_CPU_SEQUENCE})",
        "",
        "| keys | batch | sdpa ms | reference ms | sdpa / reference | kernel run for sdpa |",
        "|---|---|---|---|---|---|",
    ]
    for length in lengths:
        batch = max(1, tokens // length)
        q, k, v = (torch.randn(batch, heads, length, head_dim, requires_grad=True) for _ in range(3))
        grad = torch.randn(batch, length, heads, head_dim)

        def sdpa(q=q, k=k, v=v, grad=grad):
            F.scaled_dot_product_attention(q, k, v).transpose(1, 2).backward(grad)

        def reference(q=q, k=k, v=v, grad=grad):
            eager_attention_forward(Layer(), q, k, v, None)[0].backward(grad)

        times = {sdpa: [], reference: []}
        for fn in (sdpa, reference, sdpa, reference):  # warm-up
            fn()
        for _ in range(repeats):
            for fn in times:
                start = time.perf_counter()
                fn()
                times[fn].append(time.perf_counter() - start)
        a, b = (1e3 * statistics.median(times[fn]) for fn in (sdpa, reference))
        chosen = "reference" if length <= SHORT_CPU_SEQUENCE else "sdpa"
        lines.append(f"| {length} | {batch} | {a:.2f} | {b:.2f} | {a / b:.2f} | {chosen} |")
    return lines


def main() -> None:
    parser = CommandParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base-patch16-224", help="ViTPlusConfig preset measured")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8, 32], help="batch sizes measured")
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=["fp32", "bf16-autocast", "bf16", *INT8_SCHEMES],
        choices=["fp32", "bf16-autocast", "bf16", *INT8_SCHEMES, "int8-dynamic-compiled"],
        help="precisions measured",
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per model and case")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs before the timed ones")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--no_fp32_matmul",
        action="store_true",
        help="measure our model without the cpu_precision opt-in (standard layers, like the peers)",
    )
    parser.add_argument(
        "--attention_lengths",
        type=int,
        nargs="+",
        default=None,
        help="time one attention layer's training step at these sequence lengths (sdpa vs reference) and nothing else",
    )
    parser.add_argument("--attention_heads", type=int, default=4, help="heads of --attention_lengths' layer")
    parser.add_argument("--attention_head_dim", type=int, default=24, help="head size of --attention_lengths' layer")
    parser.add_argument("--attention_tokens", type=int, default=128 * 17, help="tokens a batch (--attention_lengths)")
    parser.add_argument(
        "--training_step",
        action="store_true",
        help="time an fp32 training update (forward, backward, AdamW) of each model instead of inference",
    )
    parser.add_argument("--output", type=Path, default=None, help="write the table's rows to this CSV (results/)")
    _result_rows().add_isa_argument(parser)
    args = parser.parse_args()
    _result_rows().run_capped(args.isa)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.attention_lengths:
        lines = attention_length_table(
            args.attention_lengths, args.attention_heads, args.attention_head_dim, args.attention_tokens, args.repeats
        )
        print("\n".join(lines))
        return
    rows = training_step_rows(args) if args.training_step else run(args)
    if args.output is not None:
        print(f"wrote {_result_rows().write_rows(args.output, rows, threads=torch.get_num_threads())}")


def _result_rows():
    """scripts/benchmarks/result_rows.py (the rows' context, `--isa`)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import result_rows

    return result_rows


if __name__ == "__main__":
    main()
