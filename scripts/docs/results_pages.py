"""Render the docs' Results page (docs/results.md) and its plots (docs/images/results/*.png) from the committed result
files under results/: for each file, what wrote it, a plot where a reader would rather look than read, and its rows
as a table. The page is generated: edit the files' descriptions here, and re-run after a benchmark writes a file.

    python scripts/docs/results_pages.py            # write docs/results.md and the plots
    python scripts/docs/results_pages.py --check    # exit 1 when docs/results.md is not what the files give

The plots need matplotlib (the `train` extra); `--check` compares the page's text only.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
PAGE = ROOT / "docs" / "results.md"
IMAGES = ROOT / "docs" / "images" / "results"


@dataclass(frozen=True)
class ResultFile:
    """One result file: its name under results/, what wrote it, what it holds, and its plot (None: a table only)."""

    name: str
    written_by: str
    holds: str
    plot: Callable[[list[dict], Path], None] | None = None
    columns: tuple[str, ...] = ()  # the table's columns (default: all but the run's context)


def read_rows(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


# ----------------------------------------------------------------------------------------------------- plots
def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), dpi=100)
    return plt, figure, axis


def _save(plt, figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, metadata={"Software": None})  # no version stamp: the same rows give the same file
    plt.close(figure)


def plot_memory_per_process(rows: list[dict], path: Path) -> None:
    """Memory a process adds while the weights load, in units of the weights' size, against the processes: the main
    process and the others, with and without RAM-efficient loading."""
    plt, figure, axis = _figure()
    series = defaultdict(list)
    for row in rows:
        who = "main process" if row["rank"] == "0" else "other processes"
        flag = "RAM-efficient loading" if row["flag"] == "True" else "every process reads"
        added = (int(row["set_up_peak"]) - int(row["base_rss"])) / int(row["weights_bytes"])
        series[(row["model"], who, flag)].append((int(row["processes"]), added))
    for (model, who, flag), points in sorted(series.items()):
        by_processes = defaultdict(list)
        for processes, added in points:
            by_processes[processes].append(added)
        xs = sorted(by_processes)
        ys = [sum(by_processes[x]) / len(by_processes[x]) for x in xs]
        axis.plot(xs, ys, marker="o", linestyle="-" if "efficient" in flag else "--", label=f"{model}, {who}, {flag}")
    axis.set_xlabel("processes")
    axis.set_ylabel("memory added at set-up / weights' size")
    axis.set_xticks(sorted({int(row["processes"]) for row in rows}))
    axis.legend(fontsize=6)
    axis.set_title("FSDP2 set-up: memory per process")
    _save(plt, figure, path)


def _plot_vs_marian(rows: list[dict], path: Path, column: str, title: str) -> None:
    """Bars of each engine's `column` (its speed as a multiple of transformers' Marian, eager) per case: the median
    over the rows of the same case and engine."""
    plt, figure, axis = _figure()
    values = defaultdict(list)
    for row in rows:
        if row[column]:
            values[(row["case"], row["engine"])].append(float(row[column]))
    cases = list(dict.fromkeys(case for case, _ in values))
    engines = list(dict.fromkeys(engine for _, engine in values))
    width = 0.8 / max(1, len(engines))
    for i, engine in enumerate(engines):
        heights = [statistics.median(values.get((case, engine), [0.0])) for case in cases]
        axis.bar([c + i * width for c in range(len(cases))], heights, width, label=engine)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))])
    axis.set_xticklabels([case.replace("generate ", "") for case in cases], fontsize=7)
    axis.set_ylabel("tokens/s / Marian's")
    axis.set_title(title)
    axis.legend(fontsize=6, ncol=2)
    _save(plt, figure, path)


def plot_decoding_speed(rows: list[dict], path: Path) -> None:
    """Each engine's speed as a multiple of transformers' Marian (eager), per case: the median over the rounds of the
    file's after column, at the file's first preset."""
    preset = rows[0]["preset"]
    chosen = [row for row in rows if row["preset"] == preset]
    _plot_vs_marian(chosen, path, "after_vs_marian", f"Decoding speed per engine ({preset} preset)")


def plot_fast_decoding(rows: list[dict], path: Path) -> None:
    """Each engine's speed as a multiple of transformers' Marian (eager), per case, in the file's first run (its first
    row's preset and command: bench_seq2seq.py's rows, ratios with their ranges in the table)."""
    first = rows[0]
    chosen = [row for row in rows if (row["preset"], row["command"]) == (first["preset"], first["command"])]
    _plot_vs_marian(chosen, path, "vs_marian", f"Decoding speed per engine ({first['preset']} sizes)")


def plot_learning(rows: list[dict], path: Path) -> None:
    """Each family's default run: its metric against its minutes of training, one point per seed and thread count."""
    plt, figure, axis = _figure()
    for family in dict.fromkeys(row["family"] for row in rows):
        points = [(float(row["minutes"]), float(row["value"])) for row in rows if row["family"] == family]
        axis.scatter(*zip(*points), label=f"{family} ({rows[[r['family'] for r in rows].index(family)]['metric']})")
    axis.set_xlabel("minutes of training")
    axis.set_ylabel("final evaluation metric")
    axis.set_title("Default runs: metric against minutes")
    axis.legend(fontsize=7)
    _save(plt, figure, path)


def plot_vit_throughput(rows: list[dict], path: Path) -> None:
    """Images per second against the batch: ours per precision (solid), and the peers at the precisions they run
    (timm dashed, transformers dotted; the int8 rows' peers run fp32, drawn once with the fp32 rows), one colour per
    precision."""
    plt, figure, axis = _figure()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, precision in enumerate(dict.fromkeys(row["precision"] for row in rows)):
        chosen = [row for row in rows if row["precision"] == precision]
        batches = [int(row["batch"]) for row in chosen]
        series = [("ours_images_per_s", "hf_vit_plus", "-")]
        if not precision.startswith("int8"):
            series += [("timm_images_per_s", "timm", "--"), ("transformers_images_per_s", "transformers", ":")]
        for column, label, style in series:
            values = [float(row[column]) for row in chosen]
            colour = colours[index % len(colours)]
            axis.plot(batches, values, style, color=colour, marker="o", markersize=3, label=f"{label}, {precision}")
    axis.set_xscale("log", base=2)
    ticks = sorted({int(row["batch"]) for row in rows})
    axis.set_xticks(ticks, [str(tick) for tick in ticks])
    axis.set_xlabel("batch")
    axis.set_ylabel("images/s")
    axis.set_title(f"ViT throughput ({rows[0]['preset']}, {rows[0].get('threads', '?')} threads)")
    axis.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(plt, figure, path)


def plot_sparse_attention(rows: list[dict], path: Path) -> None:
    """Forward + backward time as a multiple of dense causal SDPA's, against the sequence length, per kernel and
    pattern."""
    plt, figure, axis = _figure()
    series = defaultdict(list)
    for row in rows:
        if row["kernel"] != "sdpa" and row["fwd_bwd_vs_sdpa"]:
            series[f"{row['kernel']}, {row['pattern']}"].append((int(row["n"]), float(row["fwd_bwd_vs_sdpa"])))
    for label, points in sorted(series.items()):
        axis.plot(*zip(*sorted(points)), marker="o", label=label)
    axis.axhline(1.0, color="black", linewidth=0.8, label="dense SDPA")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("sequence length n")
    axis.set_ylabel("fwd+bwd time / dense SDPA's")
    axis.set_title("Sparse attention against dense, by length")
    axis.legend(fontsize=7)
    _save(plt, figure, path)


def plot_small_data(rows: list[dict], path: Path) -> None:
    """Test accuracy against training minutes on Fashion-MNIST, one marker per kind of row (the bench's row, with the
    hybrid ViT apart), leaving out the rows of a budget under 10 minutes (a fraction of an epoch); the issue's target
    (92% within 45 minutes) as dashed lines."""
    plt, figure, axis = _figure()
    markers = "osD^v<>PXh*"
    series = defaultdict(list)
    for row in rows:
        if row["minutes"] and not (row["budget_minutes"] and float(row["budget_minutes"]) < 10):
            kind = row["row"].replace("vit-", "hybrid-", 1) if "hybrid" in row["model"] else row["row"]
            series[kind].append((float(row["minutes"]), float(row["test_accuracy_pct"])))
    for i, (kind, points) in enumerate(series.items()):
        axis.scatter(*zip(*points), marker=markers[i % len(markers)], label=kind)
    axis.axhline(92.0, color="grey", linestyle="--", linewidth=0.8)
    axis.axvline(45.0, color="grey", linestyle="--", linewidth=0.8)
    axis.set_xlabel("training minutes")
    axis.set_ylabel("test accuracy (%)")
    axis.set_title("Fashion-MNIST: test accuracy against training minutes")
    axis.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot: no point hidden
    _save(plt, figure, path)


def plot_input_pipeline(rows: list[dict], path: Path) -> None:
    """Images per second of each image loader, by the workers it has: ours (read whole, streamed) next to timm's."""
    plt, figure, axis = _figure()
    images = [row for row in rows if row["part"] == "images"]
    cases = list(dict.fromkeys(row["case"] for row in images))
    workers = sorted({int(row["workers"]) for row in images})
    width = 0.8 / max(1, len(cases))
    for i, case in enumerate(cases):
        heights = [next((float(r["images_per_s"]) for r in images if r["case"] == case and int(r["workers"]) == w), 0)
                   for w in workers]  # fmt: skip
        axis.bar([x + i * width for x in range(len(workers))], heights, width, label=case)
    axis.set_xticks([x + 0.4 - width / 2 for x in range(len(workers))])
    axis.set_xticklabels([f"{w} worker{'s' if w > 1 else ''}" for w in workers])
    axis.set_ylabel("images / s")
    axis.set_title("Image loaders, DeiT's augmentations at 224 px")
    axis.legend(fontsize=7)
    _save(plt, figure, path)


def plot_import_time(rows: list[dict], path: Path) -> None:
    plt, figure, axis = _figure()
    labels = [row["row"] for row in rows]
    axis.barh(range(len(rows)), [float(row["median_s"]) for row in rows])
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels(labels, fontsize=6)
    axis.invert_yaxis()
    axis.set_xlabel("seconds (median of fresh processes)")
    axis.set_title("Start-up time")
    _save(plt, figure, path)


FILES = (
    ResultFile(
        "decoding_refactor_before_after.csv",
        "`scripts/benchmarks/bench_seq2seq.py`, run from the checkouts before and after the decoding refactor, in "
        "turn",
        "each engine's tokens/s as a multiple of transformers' Marian (eager), before and after, at the small and "
        "opus-mt sizes ([fast inference](guides/fast-inference.md))",
        plot_decoding_speed,
        ("preset", "round", "case", "engine", "before_vs_marian", "after_vs_marian"),
    ),
    ResultFile(
        "fast_decoding.csv",
        "`scripts/benchmarks/bench_seq2seq.py --engines marian,ours-fast,ours-fast-full,ours-fast-int8,ct2-fp32,"
        "ct2-int8 --repeats 5 --output results/fast_decoding.csv` (add `--preset opus-mt` for opus-mt's sizes)",
        "each decoding engine's tokens/s and its multiple of transformers' Marian (eager, the same weights), with the "
        "range over the repetitions, per case, at the small and opus-mt sizes ([fast inference]"
        "(guides/fast-inference.md#measuring))",
        plot_fast_decoding,
        ("preset", "threads", "case", "engine", "tokens_per_s", "vs_marian", "vs_marian_min", "vs_marian_max"),
    ),
    ResultFile(
        "fast_decoding_history.csv",
        "`scripts/benchmarks/bench_seq2seq.py`, with the engines as they were at each run (`run` says what changed)",
        "earlier runs of the same comparison: compiled static-cache `generate` and torchao int8, then `FastDecoding` "
        "before and after its int8 kernel, output screen and C++ kernels, on CPUs with AVX512-VNNI and with AVX2 only "
        "([fast inference](guides/fast-inference.md#measuring))",
        None,
        ("run", "preset", "threads", "case", "engine", "tokens_per_s", "vs_marian", "vs_marian_min", "vs_marian_max"),
    ),
    ResultFile(
        "fast_decoding_profile.csv",
        "`scripts/benchmarks/bench_seq2seq.py --profile` (printed tables, copied here)",
        "where the time of a token goes in `FastDecoding` and in compiled `generate`: milliseconds, megabytes read "
        "and the rate per part of the step ([fast inference](guides/fast-inference.md#measuring))",
        None,
        ("run", "preset", "threads", "precision", "case", "part", "ms_per_token", "mb_per_token", "gb_per_s"),
    ),
    ResultFile(
        "fast_decoding_details.csv",
        "one-off timings beside `scripts/benchmarks/bench_seq2seq.py` runs (copied from the guide's notes)",
        "compilation times, single-kernel timings, the plain read rate, the output screen's counts and the greedy "
        "tokens' agreement ([fast inference](guides/fast-inference.md#measuring))",
        None,
        ("run", "topic", "quantity", "value", "unit", "preset", "threads", "date"),
    ),
    ResultFile(
        "translation_quality.csv",
        "`scripts/benchmarks/bench_seq2seq.py --quality MODEL_DIR --output results/translation_quality.csv`",
        "BLEU, chrF and agreement with float32 `generate` of each engine and precision on the SWORD English -> "
        "Spanish test verses ([fast inference](guides/fast-inference.md#quality))",
        None,
        ("mode", "engine", "note", "bleu", "chrf", "identical", "agreement"),
    ),
    ResultFile(
        "int8_quality.csv",
        "`scripts/benchmarks/bench_int8_quality.py --output results/int8_quality.csv`",
        "held-out accuracy and exact match in fp32 and each torchao int8 scheme on the digits ViT and the "
        "number-words model ([fast inference](guides/fast-inference.md#int8-with-torchao))",
        None,
    ),
    ResultFile(
        "int8_speed.csv",
        "a one-off measurement (the command was not recorded)",
        "torchao int8 against fp32 ViTs on a CPU, eager and compiled ([fast inference]"
        "(guides/fast-inference.md#int8-with-torchao))",
        None,
    ),
    ResultFile(
        "seq2seq_vs_marian.csv",
        "`scripts/benchmarks/bench_seq2seq.py` (eager engines; the paired-ratio rows from back-to-back pairs)",
        "our model's eager `generate` and training step against transformers' Marian with the same dimensions "
        "([fast inference](guides/fast-inference.md#measuring))",
        None,
        ("run", "preset", "threads", "repeats", "case", "engine", "tokens_per_s", "vs_marian"),
    ),
    ResultFile(
        "vit_throughput.csv",
        "`make bench` (`scripts/benchmarks/bench_vit.py --output results/vit_throughput.csv`)",
        "images/s of our ViT, timm's and transformers' with the same weights, measured in turn, per precision and "
        "batch ([Vision Transformer](families/vit.md))",
        plot_vit_throughput,
        (
            "preset",
            "precision",
            "batch",
            "ours_images_per_s",
            "timm_images_per_s",
            "transformers_images_per_s",
            "vs_timm",
            "vs_transformers",
        ),
    ),
    ResultFile(
        "sparse_attention.csv",
        "`scripts/benchmarks/bench_sparse_attention.py --output results/sparse_attention.csv`",
        "each sparse attention kernel's time and peak memory against dense causal SDPA, by sequence length "
        "([Sparse Transformer](families/sparse.md))",
        plot_sparse_attention,
        ("n", "stride", "kernel", "pattern", "fwd_vs_sdpa", "fwd_bwd_vs_sdpa", "peak_mb"),
    ),
    ResultFile(
        "small_data.csv",
        "`scripts/benchmarks/bench_small_data.py --output` (the rows of many runs appended; a field the run did not "
        "record is empty)",
        "test accuracy on Fashion-MNIST's 10,000 test images of each row the bench trains (a CNN, ViTs plain, with "
        "DeiT's recipe, distilled, pre-trained by masked patch prediction, the hybrid, transformers' ViT) against its "
        "training minutes ([small data](guides/small-data.md)); `config_overrides` is the shape against the built-in "
        "one (7 x 7 patches, width 96)",
        plot_small_data,
        (
            "row",
            "model",
            "config_overrides",
            "recipe",
            "flags",
            "budget_minutes",
            "minutes",
            "updates",
            "epochs",
            "test_accuracy_pct",
            "ema_last_accuracy_pct",
            "cls_head_accuracy_pct",
            "distillation_head_accuracy_pct",
            "threads",
            "date",
            "device",
            "note",
        ),
    ),
    ResultFile(
        "small_data_update_time.csv",
        "`scripts/benchmarks/bench_small_data.py --time_precision --output` and timings by hand",
        "milliseconds of a training update (batch 128) of the small-data models, fp32 against bf16 autocast, by "
        "shape, compiled and eager ([small data](guides/small-data.md))",
        None,
        (
            "model",
            "config_overrides",
            "parameters",
            "what",
            "precision",
            "ms",
            "fp32_over_bf16",
            "threads",
            "date",
            "device",
            "note",
        ),
    ),
    ResultFile(
        "small_data_augmentation.csv",
        "`scripts/benchmarks/bench_small_data.py --time_augmentation --output`",
        "milliseconds to augment a batch of Fashion-MNIST-sized images with DeiT's recipe, torchvision image by image "
        "against batched ([small data](guides/small-data.md))",
        None,
        ("step", "images", "ms_per_batch", "x_batched", "threads", "date", "device", "note"),
    ),
    ResultFile(
        "small_data_recipe_none.csv",
        "`hf-vit-plus train vit --max_steps 150`, timed by hand",
        "`--recipe none` against the training before `--recipe` existed: accuracy and seconds of one short run",
    ),
    ResultFile(
        "input_pipeline.csv",
        "`scripts/benchmarks/bench_input_pipeline.py --output results/input_pipeline.csv`",
        "the training loaders alone, no model ([training on large data](guides/large-data.md)): images per second "
        "of ours (read whole and streamed) against timm's `create_loader`, DeiT's augmentations at 224 px from "
        "20,000 JPEGs, at 1 and 2 workers; tokens per second and padding fraction of the token-budget loader against "
        "fixed-size batches (SWORD's verse pairs); the cost of an exact resume half-way through an epoch against "
        "reading the batches before it; the peak memory of a run that streams 10 times as much data",
        plot_input_pipeline,
        (
            "part",
            "case",
            "workers",
            "images_per_s",
            "startup_s",
            "tokens_per_s",
            "padding_fraction",
            "examples",
            "skipped_per_s",
            "peak_rss_mb",
            "vs_reference",
            "reference",
            "load_average",
            "threads",
            "date",
            "device",
        ),
    ),
    ResultFile(
        "ram_efficient_loading.csv",
        "`scripts/benchmarks/bench_ram_efficient_loading.py`",
        "memory while FSDP2 loads the weights, with and without RAM-efficient loading, per process "
        "([sharding](guides/sharding.md))",
        plot_memory_per_process,
    ),
    ResultFile(
        "learning_defaults.csv",
        "`scripts/learning_matrix.py` (`make test-learning` checks the targets)",
        "every family's default run over seeds x threads: the metric, the baseline, the target, minutes",
        plot_learning,
        ("family", "seed", "threads", "metric", "value", "baseline", "target", "passed", "minutes"),
    ),
    ResultFile(
        "import_time.csv",
        "`make bench-import` (`scripts/benchmarks/bench_import.py`)",
        "start-up time of `import hf_vit_plus` and `hf-vit-plus --help` against transformers: medians of fresh "
        "processes",
        plot_import_time,
    ),
    ResultFile(
        "vit_cpu_attention_lengths.csv",
        "`scripts/benchmarks/bench_vit.py --attention_lengths 17 33 65 97 129 197 257 --threads 2`",
        "one attention layer's forward + backward on the CPU, torch's sdpa against the reference kernel, by the keys "
        "a row holds: the measurement behind `attention.SHORT_CPU_SEQUENCE` ([Vision Transformer](families/vit.md))",
    ),
    ResultFile(
        "vit_cpu_attention_update.csv",
        "a training update of the built-in Fashion-MNIST ViT, timed by hand",
        "the model time of one training update with each CPU attention kernel ([Vision Transformer](families/vit.md))",
    ),
    ResultFile(
        "cpu_bf16_gemm_fallback.csv",
        "the GEMM peak of `scripts/benchmarks/bench_vit.py`",
        "bf16 against fp32 GEMM throughput on a CPU without bf16 instructions ([Vision Transformer](families/vit.md))",
    ),
    ResultFile(
        "demo.csv",
        "`hf-vit-plus demo --output_dir outputs/demo`",
        "the demo's held-out accuracy and time ([Getting started](getting-started.md))",
    ),
    ResultFile(
        "sparse_lm.csv",
        "`scripts/benchmarks/bench_sparse_lm.py --output results/sparse_lm.csv`",
        "sparse against dense language models of equal size and steps: held-out bits per byte and time per step "
        "([Sparse Transformer](families/sparse.md))",
    ),
    ResultFile(
        "image_lm_patterns.csv",
        "`scripts/benchmarks/bench_image_lm.py`",
        "dense, strided and fixed image models on Fashion-MNIST trained in lockstep: time per step, test bits/dim, "
        "the step that reaches dense's final bits/dim ([Sparse Transformer](families/sparse.md))",
    ),
    ResultFile(
        "image_lm_depth.csv",
        "`scripts/benchmarks/bench_image_lm_depth.py`",
        "a 48-layer image model with and without recomputation: activations kept, peak memory, and a training run "
        "([Sparse Transformer](families/sparse.md))",
    ),
    ResultFile(
        "image_lm_sampling.csv",
        "`hf-vit-plus sample`, timed",
        "seconds to sample 16 images of 28 x 28, with and without the cache, compiled "
        "([Sparse Transformer](families/sparse.md))",
    ),
    ResultFile(
        "learning_tests.csv",
        "the learning tests (`pytest`; each prints what it reached)",
        "what the learning tests reached against their baselines and thresholds",
    ),
    ResultFile(
        "translation_sword.csv",
        "`scripts/train_translation.py` (English -> Spanish Bible verses)",
        "test BLEU and chrF of the last and the averaged checkpoints, beside a copy-the-source floor "
        "([encoder-decoder Transformer](families/seq2seq.md))",
    ),
    ResultFile(
        "translation_sword_curve.csv",
        "`scripts/train_translation.py` (its validation every 400 steps)",
        "the validation loss and greedy BLEU along the translation run "
        "([encoder-decoder Transformer](families/seq2seq.md))",
    ),
    ResultFile(
        "translation_malloc.csv",
        "`scripts/train_translation.py`, the same 10 batches with each malloc setting",
        "a training step's time with glibc's default malloc and with GLIBC_TUNABLES's higher thresholds "
        "([encoder-decoder Transformer](families/seq2seq.md))",
    ),
    ResultFile(
        "sharding_memory.csv",
        "`scripts/benchmarks/bench_sharding.py --output results/sharding_memory.csv`",
        "per-process memory of DDP and FSDP2 fine-tuning ViT-B/16 on CPU processes: the state's tensors, RSS after "
        "set-up, peak RSS ([sharding](guides/sharding.md))",
    ),
    ResultFile(
        "adamw_update_time.csv",
        "an AdamW update timed on the CPU",
        "torch's default (per-tensor) AdamW against the fused kernel ([training](guides/training.md))",
    ),
)
CONTEXT = {"command", "date", "hf_vit_plus", "python", "torch", "transformers", "device", "threads", "machine"}


def _table(rows: list[dict], columns: tuple[str, ...]) -> str:
    columns = columns or tuple(key for key in rows[0] if key not in CONTEXT)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row.get(column, "").replace("|", "\\|") for column in columns) + " |" for row in rows]
    return "\n".join(lines)


def _context(rows: list[dict]) -> str:
    """What the rows were measured with, where the file records it (one line per distinct value set)."""
    keys = [key for key in ("date", "before", "after", "torch", "transformers", "device", "machine") if key in rows[0]]
    if not keys:
        return ""
    seen = dict.fromkeys(tuple(row[key] for key in keys) for row in rows)
    lines = [", ".join(f"{k} {v}" for k, v in zip(keys, values) if v) for values in seen]
    lines = [line for line in lines if line]
    if len(lines) > 1:  # one item per run
        return "Measured with:\n\n" + "\n".join(f"- {line}" for line in lines)
    return f"Measured with: {lines[0]}." if lines else ""


def render(plots: bool = True) -> str:
    """The page's text; with `plots`, the plots are written too."""
    known = {entry.name for entry in FILES}
    unknown = sorted(path.name for path in RESULTS.glob("*.csv") if path.name not in known)
    parts = [
        "# Results",
        "",
        "<!-- Generated by scripts/docs/results_pages.py from the files under results/: do not edit by hand. -->",
        "",
        "Measured numbers live once, in the result files the benchmarks write under `results/` in the repository; the "
        "pages of this site describe how to measure and link here. Each row of a file says the releases and the "
        "machine it was measured on.",
        "",
        "| file | written by | what it holds |",
        "|---|---|---|",
    ]
    parts += [f"| `results/{e.name}` | {e.written_by} | {e.holds} |" for e in FILES if (RESULTS / e.name).is_file()]
    parts += [f"| `results/{name}` | | |" for name in unknown]
    parts += [
        "| `results/gpu/` (a lent GPU machine's check, committed after it; the CPU fallback's are not kept) | "
        "`make gpu-check` (see "
        "[the GPU check](contributing/testing.md#gpu-check)) | `gpu_check.json`, the gpu tests' log and the GPU "
        "benchmarks' JSON |",
        "",
    ]
    if plots:
        IMAGES.mkdir(parents=True, exist_ok=True)
    for entry in FILES:
        path = RESULTS / entry.name
        if not path.is_file():
            continue
        rows = read_rows(path)
        stem = entry.name.removesuffix(".csv")
        parts += [f"## {stem.replace('_', ' ').capitalize()}", "", f"`results/{entry.name}`: {entry.holds}.", ""]
        context = _context(rows)
        if context:
            parts += [context, ""]
        if entry.plot is not None:
            if plots:
                entry.plot(rows, IMAGES / f"{stem}.png")
            parts += [f"![{stem}](images/results/{stem}.png)", ""]
        parts += [_table(rows, entry.columns), ""]
    for name in unknown:
        rows = read_rows(RESULTS / name)
        parts += [f"## {name.removesuffix('.csv')}", "", _table(rows, ()) if rows else "(empty)", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    from hf_vit_plus.cli_utils import CommandParser

    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare docs/results.md with the files; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        if PAGE.read_text(encoding="utf-8") != render(plots=False):
            print(f"{PAGE.relative_to(ROOT)} is out of date with results/: run python scripts/docs/results_pages.py")
            return 1
        return 0
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} and {len(list(IMAGES.glob('*.png')))} plots in {IMAGES.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
