"""Render the docs' Results page (docs/results.md) and its plots (docs/images/results/*.png) from the committed result
files under results/, as a report: a summary table of the headline claims first, then one section per topic with a
short reading, its plots and each file's rows collapsed. The page is generated: edit the topics and the files'
descriptions here, and re-run after a benchmark writes a file.

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
sys.path.insert(0, str(ROOT / "scripts" / "benchmarks"))
from result_rows import CONTEXT_FIELDS  # noqa: E402  (the benchmarks' folder is not a package)


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
@dataclass(frozen=True)
class PlotStyle:
    """The one style every Results plot is drawn in (tests/test_docs_site.py checks its text sizes).

    The figure (720 px) is narrower than the site's content column at a 1280 px window (817 px), so the browser shows
    it at its own size: 10 pt text in the figure is 10 pt on the page.
    """

    width_in: float = 7.2
    height_in: float = 4.4
    dpi: int = 100
    rendered_width_px: int = 817  # `.md-content__inner` at a 1280 px window (two 10rem sidebars: extra.css)
    text_pt: float = 10.0  # tick labels and legends
    label_pt: float = 11.0  # axis titles
    title_pt: float = 12.0
    colours: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999")
    markers: str = "osD^vP*Xh<>"

    def rc(self) -> dict:
        from cycler import cycler

        count = min(len(self.colours), len(self.markers))
        return {
            "figure.figsize": (self.width_in, self.height_in),
            "figure.dpi": self.dpi,
            "savefig.dpi": self.dpi,
            "font.size": self.text_pt,
            "xtick.labelsize": self.text_pt,
            "ytick.labelsize": self.text_pt,
            "legend.fontsize": self.text_pt,
            "legend.title_fontsize": self.text_pt,
            "axes.labelsize": self.label_pt,
            "axes.titlesize": self.title_pt,
            "axes.grid": True,
            "grid.alpha": 0.3,
            # a colour and a marker per series: told apart in grey print and by colour-blind readers
            "axes.prop_cycle": cycler(color=list(self.colours[:count])) + cycler(marker=list(self.markers[:count])),
        }


PLOT_STYLE = PlotStyle()


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(PLOT_STYLE.rc())
    figure, axis = plt.subplots(layout="constrained")
    return plt, figure, axis


def _legend_below(figure, axis, columns: int = 2) -> None:
    """The legend under the plot, outside it: no point hidden, the figure's width unchanged."""
    handles, labels = axis.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncol=columns, frameon=False)


def _reference_line(axis, value: float, label: str, horizontal: bool = True) -> None:
    """A labelled reference line (a peer's level, a target), in the legend with its meaning."""
    line = axis.axhline if horizontal else axis.axvline
    line(value, color="black", linestyle="--", linewidth=1.0, label=label)


def _save(plt, figure, path: Path) -> None:
    figure.savefig(path, metadata={"Software": None})  # no version stamp: the same rows give the same file
    plt.close(figure)


def plot_memory_per_process(rows: list[dict], path: Path) -> None:
    """Memory a process adds while the weights load, in units of the weights' size, against the processes: the main
    process and the others, with and without RAM-efficient loading."""
    plt, figure, axis = _figure()
    series = defaultdict(list)
    for row in rows:
        who = "main" if row["rank"] == "0" else "others"
        flag = "RAM-efficient" if row["flag"] == "True" else "all read"
        added = (int(row["set_up_peak"]) - int(row["base_rss"])) / int(row["weights_bytes"])
        series[(row["model"], who, flag)].append((int(row["processes"]), added))
    for (model, who, flag), points in sorted(series.items()):
        by_processes = defaultdict(list)
        for processes, added in points:
            by_processes[processes].append(added)
        xs = sorted(by_processes)
        ys = [sum(by_processes[x]) / len(by_processes[x]) for x in xs]
        style = "-" if "efficient" in flag else "--"
        axis.plot(xs, ys, linestyle=style, label=f"{model}, {who}, {flag}")
    axis.set_xlabel("processes")
    axis.set_ylabel("memory added at set-up (x weights' size)")
    axis.set_xticks(sorted({int(row["processes"]) for row in rows}))
    axis.set_title("FSDP2 set-up: memory a process adds")
    _legend_below(figure, axis)
    _save(plt, figure, path)


def _plot_vs_marian(rows: list[dict], path: Path, column: str, title: str) -> None:
    """Bars of each engine's `column` (its speed as a multiple of transformers' Marian, eager) per case: the median
    over the rows of the same case and engine; Marian's own level as a labelled line at 1."""
    plt, figure, axis = _figure()
    values = defaultdict(list)
    for row in rows:
        if row[column]:
            values[(row["case"], row["engine"])].append(float(row[column]))
    cases = list(dict.fromkeys(case for case, _ in values))
    engines = list(dict.fromkeys(engine for _, engine in values))
    width = 0.8 / max(1, len(engines))
    # a colour and a hatch per engine: 8 colours x 9 hatches, so no two of up to 72 engines look alike
    hatches = ("", "//", "..", "xx", "\\\\", "--", "++", "oo", "**")
    for i, engine in enumerate(engines):
        heights = [statistics.median(values.get((case, engine), [0.0])) for case in cases]
        xs = [c + i * width for c in range(len(cases))]
        colour = PLOT_STYLE.colours[i % len(PLOT_STYLE.colours)]
        axis.bar(xs, heights, width, label=engine, color=colour, hatch=hatches[i % len(hatches)], edgecolor="white")
    _reference_line(axis, 1.0, "transformers' Marian (= 1)")
    axis.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))])
    axis.set_xticklabels([case.replace("generate ", "").replace(", ", "\n") for case in cases])
    axis.set_xlabel("decoding, batch size")
    axis.set_ylabel("tokens/s (x Marian's)")
    axis.set_title(title)
    axis.grid(axis="x", visible=False)
    _legend_below(figure, axis, columns=4)
    _save(plt, figure, path)


def plot_decoding_speed(rows: list[dict], path: Path) -> None:
    """Each engine's speed as a multiple of transformers' Marian (eager), per case: the median over the rounds of the
    file's after column, at the file's first preset."""
    preset = rows[0]["preset"]
    chosen = [row for row in rows if row["preset"] == preset]
    _plot_vs_marian(chosen, path, "after_vs_marian", f"Decoding speed after the refactor ({preset} preset)")


def plot_fast_decoding(rows: list[dict], path: Path) -> None:
    """Each engine's speed as a multiple of transformers' Marian (eager), per case, in the file's first run (its first
    row's preset and command: bench_seq2seq.py's rows, ratios with their ranges in the table)."""
    first = rows[0]
    chosen = [row for row in rows if (row["preset"], row["command"]) == (first["preset"], first["command"])]
    _plot_vs_marian(chosen, path, "vs_marian", f"Decoding speed per engine ({first['preset']} sizes)")


# the direction each default run's metric improves in, and its unit, for the axis titles
_METRICS = {
    "eval_accuracy": "accuracy (%)",
    "eval_exact_match": "exact match (%)",
    "eval_bits_per_token": "bits per token (lower is better)",
    "eval_bits_per_dim": "bits per dim (lower is better)",
}


def _target(row: dict) -> float | None:
    """The level a default run must reach, from its `target` text: `>= 0.95`, `<= 0.75 x unigram` (a multiple of the
    baseline) or `< pixel histogram` (the baseline itself)."""
    import re

    number = re.search(r"[<>]=?\s*([\d.]+)", row["target"])
    if "x unigram" in row["target"] and number and row["baseline"]:
        return float(number.group(1)) * float(row["baseline"])
    if "histogram" in row["target"] and row["baseline"]:
        return float(row["baseline"])
    return float(number.group(1)) if number else None


def plot_learning(rows: list[dict], path: Path) -> None:
    """Each family's default run: its metric against its minutes of training, one panel per family (each metric on
    an axis of its own), one point per seed and thread count, the target as a labelled line."""
    plt, _, _ = _figure()
    plt.close("all")
    families = list(dict.fromkeys(row["family"] for row in rows))
    figure, axes = plt.subplots(2, (len(families) + 1) // 2, layout="constrained", squeeze=False)
    for axis, family in zip(axes.flat, families):
        chosen = [row for row in rows if row["family"] == family]
        metric = chosen[0]["metric"]
        scale = 100.0 if metric in ("eval_accuracy", "eval_exact_match") else 1.0
        for i, threads in enumerate(sorted({row["threads"] for row in chosen})):
            points = [(float(r["minutes"]), float(r["value"]) * scale) for r in chosen if r["threads"] == threads]
            plural = "s" if threads != "1" else ""
            axis.scatter(*zip(*points), marker=PLOT_STYLE.markers[i], label=f"{threads} thread{plural}")
        target = _target(chosen[0])
        if target is not None:
            _reference_line(axis, target * scale, f"target ({chosen[0]['target']})")
        axis.set_title(family)
        axis.set_xlabel("training time (minutes)")
        axis.set_ylabel(_METRICS.get(metric, metric))
        axis.legend()
    for axis in list(axes.flat)[len(families) :]:
        axis.set_visible(False)
    _save(plt, figure, path)


def plot_vit_throughput(rows: list[dict], path: Path) -> None:
    """Images per second at batch 8, per precision: ours, timm's and transformers' side by side (the int8 rows' peers
    run fp32, so they are left out there)."""
    plt, figure, axis = _figure()
    batch = "8" if any(row["batch"] == "8" for row in rows) else rows[0]["batch"]
    chosen = [row for row in rows if row["batch"] == batch]
    precisions = [row["precision"] for row in chosen]
    libraries = [
        ("ours_images_per_s", "hf_vit_plus"),
        ("timm_images_per_s", "timm"),
        ("transformers_images_per_s", "transformers"),
    ]
    width = 0.8 / len(libraries)
    for i, (column, label) in enumerate(libraries):
        heights = [
            float(row[column]) if column.startswith("ours") or not row["precision"].startswith("int8") else 0.0
            for row in chosen
        ]
        axis.bar([x + i * width for x in range(len(chosen))], heights, width, label=label)
    axis.set_xticks([x + 0.4 - width / 2 for x in range(len(chosen))])
    axis.set_xticklabels([precision.replace("-", "-\n", 1) for precision in precisions])
    axis.set_xlabel("precision")
    axis.set_ylabel("images/s")
    axis.set_title(f"ViT throughput ({rows[0]['preset']}, batch {batch}, {rows[0].get('threads', '?')} threads)")
    axis.grid(axis="x", visible=False)
    _legend_below(figure, axis, columns=3)
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
        axis.plot(*zip(*sorted(points)), label=label)
    _reference_line(axis, 1.0, "dense causal SDPA (= 1)")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("sequence length n (tokens)")
    axis.set_ylabel("fwd+bwd time (x dense SDPA's)")
    axis.set_title("Sparse attention against dense, by length")
    _legend_below(figure, axis, columns=3)
    _save(plt, figure, path)


def plot_small_data(rows: list[dict], path: Path) -> None:
    """Test accuracy against training minutes on Fashion-MNIST, one marker per kind of row (the bench's row, with the
    hybrid ViT apart), leaving out the rows of a budget under 10 minutes (a fraction of an epoch); the issue's target
    (92% within 45 minutes) as labelled lines."""
    plt, figure, axis = _figure()
    series = defaultdict(list)
    for row in rows:
        if row["minutes"] and not (row["budget_minutes"] and float(row["budget_minutes"]) < 10):
            kind = row["row"].replace("vit-", "hybrid-", 1) if "hybrid" in row["model"] else row["row"]
            series[kind].append((float(row["minutes"]), float(row["test_accuracy_pct"])))
    for i, (kind, points) in enumerate(series.items()):
        colour = PLOT_STYLE.colours[i % len(PLOT_STYLE.colours)]
        axis.scatter(*zip(*points), color=colour, marker=PLOT_STYLE.markers[i % len(PLOT_STYLE.markers)], label=kind)
    axis.axhline(92.0, color="black", linestyle="--", linewidth=1.0, label="target: 92% ...")
    axis.axvline(45.0, color="black", linestyle=":", linewidth=1.0, label="... within 45 minutes")
    axis.set_xlabel("training time (minutes)")
    axis.set_ylabel("test accuracy (%)")
    axis.set_title("Fashion-MNIST: test accuracy against training time")
    _legend_below(figure, axis, columns=3)
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
    axis.set_xticklabels([str(w) for w in workers])
    axis.set_xlabel("loader workers")
    axis.set_ylabel("images/s")
    axis.set_title("Image loaders, DeiT's augmentations at 224 px")
    _legend_below(figure, axis)
    _save(plt, figure, path)


def plot_import_time(rows: list[dict], path: Path) -> None:
    """Median start-up seconds of each import and command, as horizontal bars."""
    plt, figure, axis = _figure()
    figure.set_figheight(PLOT_STYLE.height_in * 1.4)
    labels = [row["row"] for row in rows]
    axis.barh(range(len(rows)), [float(row["median_s"]) for row in rows], color=PLOT_STYLE.colours[0])
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels(labels)
    axis.invert_yaxis()
    axis.set_xlabel("seconds (median)")
    axis.set_ylabel("import or command")
    axis.set_title("Start-up time")
    _save(plt, figure, path)


# The columns shown of bench_vit.py's files (throughput, training step, int8)
VIT_COLUMNS = (
    "preset",
    "precision",
    "batch",
    "ours_images_per_s",
    "timm_images_per_s",
    "transformers_images_per_s",
    "vs_timm",
    "vs_transformers",
)

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
        "ct2-int8 --repeats 5 --output results/fast_decoding.csv`, then again with `--preset opus-mt` (each run "
        "replaces its preset's rows)",
        "each decoding engine's tokens/s at its fastest of 1 and 2 threads (`threads`) and its multiple of "
        "transformers' Marian (eager, the same weights), with the range over the repetitions, per case, at the small "
        "and opus-mt sizes; `vs_ctranslate2`: ours-fast against ct2-fp32 and ours-fast-int8 against ct2-int8 (the "
        "same precision); `load_average`: the machine's 1-minute load during the run ([fast inference]"
        "(guides/fast-inference.md#measuring))",
        plot_fast_decoding,
        (
            "preset",
            "threads",
            "case",
            "engine",
            "tokens_per_s",
            "vs_marian",
            "vs_marian_min",
            "vs_marian_max",
            "vs_ctranslate2",
            "load_average",
        ),
    ),
    ResultFile(
        "fast_decoding_avx2.csv",
        "`scripts/benchmarks/bench_seq2seq.py --isa avx2 --engines marian,ours-fast,ours-fast-full,ours-fast-int8,"
        "ct2-fp32,ct2-int8 --repeats 5 --train_batch 0 --output results/fast_decoding_avx2.csv`",
        "the small preset's cells of [fast decoding](#fast-decoding) with every library (ours, torch, MKL, oneDNN, "
        "FBGEMM, CTranslate2) capped at AVX2 (`isa_capped`) on the AVX-512 machine: the AVX2 paths' figures, not a "
        "real AVX2 CPU's (its caches and clocks differ) ([fast inference](guides/fast-inference.md#measuring))",
        None,
        (
            "preset",
            "isa",
            "threads",
            "case",
            "engine",
            "tokens_per_s",
            "vs_marian",
            "vs_ctranslate2",
            "vs_ctranslate2_min",
            "vs_ctranslate2_max",
            "load_average",
        ),
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
        "translate_call.csv",
        "`scripts/benchmarks/bench_translate_call.py --model numbers --output results/translate_call.csv` (before and "
        "after the change named in `run`)",
        'one warm call of 16 short translations (number words): `Translator(engine="fast")` text in, text out, '
        "against CTranslate2's `translate_batch` on the same tokens: wall-clock and process CPU milliseconds, medians "
        "of calls taking turns, and their ratios "
        "([fast inference](guides/fast-inference.md#measuring))",
        None,
        (
            "run",
            "precision",
            "threads",
            "output_tokens",
            "ours_ms",
            "ct2_ms",
            "ct2_text_ms",
            "ours_vs_ct2",
            "ours_cpu_ms",
            "ct2_cpu_ms",
            "cpu_ours_vs_ct2",
            "agrees",
        ),  # fmt: skip
    ),
    ResultFile(
        "translate_file.csv",
        "`scripts/benchmarks/bench_translate_file.py --model numbers --datasets number-words --output "
        "results/translate_file.csv`",
        "a translation job as users run it: the number-words test split (500 sources of 1-4 digits) translated from "
        "a fresh process by `Translator(texts, batch_size=16)` and by CTranslate2's `translate_batch(max_batch_size="
        "16)`, cold (import, load, build, translate; our steps built once on the machine beforehand: "
        "`steps_compiled_cold`) and warm (median of 3 passes), each engine at its best of 1 and 2 threads, with the "
        "ratios at the same precision (above 1: ours faster) and the share of sentences translated as alone "
        "([fast inference](guides/fast-inference.md#measuring))",
        None,
        (
            "case",
            "engine",
            "precision",
            "threads",
            "cold_s",
            "warm_s",
            "vs_ctranslate2_cold",
            "vs_ctranslate2_warm",
            "alone_equal",
            "agrees_with_ours",
            "steps_compiled_cold",
        ),  # fmt: skip
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
        VIT_COLUMNS,
    ),
    ResultFile(
        "vit_training_step.csv",
        "`scripts/benchmarks/bench_vit.py --training_step --preset small-patch16-224 --batch_sizes 32 --output "
        "results/vit_training_step.csv`",
        "images/s of one fp32 training update (forward, backward, AdamW) of our ViT-S/16, timm's and transformers' "
        "with the same weights, measured in turn. The three compute the same loss and gradients; ours computes its "
        "last block for the class token alone (the only token its head reads), the others for every token",
        None,
        VIT_COLUMNS,
    ),
    ResultFile(
        "vit_int8.csv",
        "`scripts/benchmarks/bench_vit.py --precisions int8-dynamic int8-dynamic-compiled --batch_sizes 8 32 "
        "--output results/vit_int8.csv`",
        "images/s of our ViT-B/16 in dynamic int8 (torchao), eager and under `torch.compile`, against timm's and "
        "transformers' in fp32, measured in turn at batch 8 and 32. Eager mode quantizes each activation in "
        "separate element-wise passes, which fell out of cache at batch 32 (6,304 rows) while `torch._int_mm` slowed "
        "there too: its layers now multiply at most 1,024 rows at a time "
        "(`hf_vit_plus.quantization.RowBlockedLinear`), and `torch.compile` fuses the passes",
        None,
        VIT_COLUMNS,
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
# the run's context that every benchmark row ends with (result_rows.CONTEXT_FIELDS), and older files' "machine"
CONTEXT = {*CONTEXT_FIELDS, "machine"}
FILE_BY_NAME = {entry.name: entry for entry in FILES}


# ------------------------------------------------------------------------------------------- the report's topics
@dataclass(frozen=True)
class Plot:
    """A plot of one result file: `draw(rows, path)` writes docs/images/results/<name>.png."""

    file: str
    draw: Callable[[list[dict], Path], None]

    @property
    def name(self) -> str:
        return self.file.removesuffix(".csv")


@dataclass(frozen=True)
class Claim:
    """One row of the summary table: a headline figure of ours, the peer's, their ratio, where it was measured and
    the file behind it (the file's part below names the command). `summary=False`: a figure the README may quote
    that the one-screen summary leaves to its section."""

    what: str
    ours: str
    peer: str
    ratio: str
    file: str
    command: str
    machine: str = ""
    summary: bool = True


@dataclass(frozen=True)
class Topic:
    """A section of the report: a heading a person would write, a short reading of the plot, the plots, the claims
    for the summary table (computed from the files' rows) and the files whose rows it holds (collapsed)."""

    title: str
    reading: str
    files: tuple[str, ...]
    plots: tuple[Plot, ...] = ()
    claims: Callable[[Callable[[str], list[dict]]], list[Claim]] = lambda rows: []

    @property
    def anchor(self) -> str:
        import re

        return re.sub(r"[^\w\s-]", "", self.title.lower()).strip().replace(" ", "-")


# ------------------------------------------------------------------------------- number formats (one for the page)
def fmt_ratio(ours: float, peer: float, kind: str = "speed") -> str:
    """ours / peer with two decimals and what it means: for a speed (higher is better) "1.49x faster" or "0.93x the
    speed"; for a time, a memory or a share (lower is better) "0.07x the time" / "the memory" / "the padding"."""
    ratio = ours / peer
    if kind == "speed":
        return f"{ratio:.2f}x faster" if round(ratio, 2) >= 1 else f"{ratio:.2f}x the speed"
    return f"{ratio:.2f}x the {kind}"


def fmt_multiple(ratio: float | str, kind: str = "speed") -> str:
    """A ratio a benchmark wrote (ours over the peer), in fmt_ratio's words."""
    return fmt_ratio(float(ratio), 1.0, kind)


def fmt_time(seconds: float | str) -> str:
    """A time in seconds to three significant digits."""
    return f"{float(seconds):.3g}"


def fmt_rate(value: float | str) -> str:
    """A rate (images/s, tokens/s): whole numbers from 100 up, else three significant digits."""
    value = float(value)
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def fmt_accuracy(percent: float | str) -> str:
    """An accuracy in percent, to one decimal."""
    return f"{float(percent):.1f}%"


def fmt_score(value: float | str) -> str:
    """A BLEU score, or a share of a whole: two decimals."""
    return f"{float(value):.2f}"


def fmt_mib(value: float | str) -> str:
    """A memory in MiB, whole."""
    return f"{float(value):,.0f}"


def _cell(value: str) -> str:
    """A row's value as the tables show it: a float's binary noise (0.9980000257492065) cut to 6 significant digits."""
    try:
        number = float(value)
    except ValueError:
        return value
    return f"{number:.6g}" if "." in value and len(value.split(".")[1]) > 6 else value


_ISA_NAMES = {"avx512_vnni": "AVX-512 VNNI", "avx512": "AVX-512", "avx2": "AVX2", "neon": "NEON", "generic": "generic"}


def measured_on(*rows: dict) -> str:
    """Where rows were measured: the CPU (`device`) and the widest instruction set in use (`isa`, or what `device`
    says); "several machines" when the rows disagree. Figures from different machines are never set side by side."""
    places = set()
    for row in rows:
        recorded = row.get("device") or row.get("machine") or ""
        device = recorded.removeprefix("CPU: ").split(",")[0].strip()
        device = "CPU" if "AVX" in device or device in ("", "x86_64") else device
        isa = _ISA_NAMES.get(row.get("isa") or "", row.get("isa") or "")
        if not isa:
            text = recorded.upper().replace("-", "")
            wide = "AVX512" in text.replace("NO AVX512", "")
            isa = "AVX-512" if wide else "AVX2" if "AVX2" in text else "ISA not recorded"
        places.add(f"{device}, {isa}" if recorded or row.get("isa") else "not recorded")
    return places.pop() if len(places) == 1 else "several machines (see the rows)"


# ------------------------------------------------------------------------------------------------- the claims
def _claims_start_up(rows) -> list[Claim]:
    by = {row["row"]: row for row in rows("import_time.csv")}
    ours, peer = float(by["import hf_vit_plus"]["median_s"]), float(by[by["import hf_vit_plus"]["peer"]]["median_s"])
    name, slowest = max(
        ((name, float(row["median_s"])) for name, row in by.items() if name.startswith("hf-vit-plus")),
        key=lambda item: item[1],
    )
    return [
        Claim(
            "`import hf_vit_plus` (s)",
            fmt_time(ours),
            f"{fmt_time(peer)} (importing transformers' ViT)",
            fmt_ratio(ours, peer, "time"),
            "import_time.csv",
            "make bench-import",
            measured_on(by["import hf_vit_plus"]),
        ),
        Claim(
            "the slowest `hf-vit-plus COMMAND --help` (s)",
            f"{fmt_time(slowest)} (`{name.removeprefix('hf-vit-plus ').removesuffix(' --help')}`)",
            "",
            "",
            "import_time.csv",
            "make bench-import",
            measured_on(by[name]),
        ),
    ]


def _claims_learning(rows) -> list[Claim]:
    demo = rows("demo.csv")[0]
    defaults = rows("learning_defaults.csv")
    passed = sum(row["passed"] == "True" for row in defaults)
    return [
        Claim(
            "default `hf-vit-plus train` runs that reach their target",
            f"{passed} of {len(defaults)}",
            "",
            "",
            "learning_defaults.csv",
            "scripts/learning_matrix.py",
            measured_on(*defaults),
        ),
        Claim(
            "`make demo`: held-out digits accuracy",
            fmt_accuracy(demo["held_out_accuracy_percent"]),
            "",
            "",
            "demo.csv",
            "hf-vit-plus demo --output_dir outputs/demo",
            measured_on(demo),
            summary=False,
        ),
    ]


def _joined(rows: list[dict], column: str, format_value) -> str:
    return " / ".join(format_value(row[column]) for row in rows)


def _claims_vit(rows) -> list[Claim]:
    claims = []
    throughput = rows("vit_throughput.csv")
    chosen = [
        next((r for r in throughput if r["precision"] == precision and r["batch"] == "8"), None)
        for precision in ("fp32", "bf16")
    ]
    if all(chosen):
        claims.append(
            Claim(
                "ViT-B/16 images/s, batch 8, fp32 / bf16",
                _joined(chosen, "ours_images_per_s", fmt_rate),
                f"{_joined(chosen, 'timm_images_per_s', fmt_rate)} (timm)",
                " / ".join(fmt_multiple(r["vs_timm"]) for r in chosen),
                "vit_throughput.csv",
                "make bench",
                measured_on(*chosen),
            )
        )
    for name, precisions, what in (
        ("vit_training_step.csv", ("fp32-training-step",), "ViT-S/16 images/s in training updates, fp32"),
        ("vit_int8.csv", ("int8-dynamic", "int8-dynamic-compiled"), "ViT-B/16 images/s, int8 eager / compiled"),
    ):
        table = rows(name) if (RESULTS / name).is_file() else []
        found = [next((r for r in table if r["precision"] == p and r["batch"] == "32"), None) for p in precisions]
        if all(found):
            claims.append(
                Claim(
                    f"{what}, batch 32",
                    _joined(found, "ours_images_per_s", fmt_rate),
                    f"{fmt_rate(found[0]['timm_images_per_s'])} (timm fp32)",
                    " / ".join(fmt_multiple(r["vs_timm"]) for r in found),
                    name,
                    "python scripts/benchmarks/bench_vit.py",
                    measured_on(*found),
                )
            )
    return claims


def _claims_small_data(rows) -> list[Claim]:
    timed = [
        r for r in rows("small_data.csv") if r["minutes"] and r["budget_minutes"] == "45" and r["test_accuracy_pct"]
    ]
    vits = [r for r in timed if r["model"].startswith("ViTPlus")]
    cnns = [r for r in timed if r["model"] == "ResNet"]
    if not (vits and cnns):
        return []
    best, cnn = (
        max(vits, key=lambda r: float(r["test_accuracy_pct"])),
        max(cnns, key=lambda r: float(r["test_accuracy_pct"])),
    )
    return [
        Claim(
            "Fashion-MNIST test accuracy in a 45-minute budget",
            f"{fmt_accuracy(best['test_accuracy_pct'])} ({best['model']}, {best['minutes']} min)",
            f"{fmt_accuracy(cnn['test_accuracy_pct'])} (a ResNet, {cnn['minutes']} min)",
            f"{float(best['test_accuracy_pct']) - float(cnn['test_accuracy_pct']):+.1f} points",
            "small_data.csv",
            "scripts/benchmarks/bench_small_data.py",
            measured_on(best, cnn),
        ),
    ]


def _claims_decoding(rows) -> list[Claim]:
    first = rows("fast_decoding.csv")[0]
    run = [r for r in rows("fast_decoding.csv") if (r["preset"], r["command"]) == (first["preset"], first["command"])]
    case = "generate greedy, batch 1"
    marian = next((r for r in run if r["engine"] == "marian" and r["case"] == case), None)
    found = [
        next((r for r in run if r["engine"] == engine and r["case"] == case and r["vs_marian"]), None)
        for engine in ("ours-fast", "ours-fast-int8")
    ]
    if not (marian and all(found)):
        return []
    return [
        Claim(
            f"tokens/s, greedy decoding, batch 1, `FastDecoding` fp32 / int8 ({first['preset']} sizes)",
            _joined(found, "tokens_per_s", fmt_rate),
            f"{fmt_rate(marian['tokens_per_s'])} (transformers' Marian, eager)",
            " / ".join(fmt_multiple(r["vs_marian"]) for r in found),
            "fast_decoding.csv",
            "python scripts/benchmarks/bench_seq2seq.py",
            measured_on(marian, *found),
        )
    ]


def ctranslate2_grid(table: list[dict]) -> list[str]:
    """`FastDecoding` against CTranslate2 at the same precision, each at its fastest thread count, as one grid: a
    row per case, a column per size and precision, each cell the benchmark's ratio (`vs_ctranslate2`)."""
    pairs = (("ours-fast", "fp32"), ("ours-fast-int8", "int8"))
    presets = list(dict.fromkeys(r["preset"] for r in table))
    cases = list(dict.fromkeys(r["case"] for r in table if r.get("vs_ctranslate2")))
    columns = [(preset, engine, precision) for preset in presets for engine, precision in pairs]
    cells = {(r["preset"], r["engine"], r["case"]): r for r in table if r.get("vs_ctranslate2")}
    if not cells:
        return []
    lines = [
        "| case | " + " | ".join(f"{preset} {precision}" for preset, _, precision in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for case in cases:
        values = []
        for preset, engine, _ in columns:
            row = cells.get((preset, engine, case))
            ratio = float(row["vs_ctranslate2"]) if row else None
            values.append("" if ratio is None else f"{ratio:.2f}x" if ratio >= 1 else f"**{ratio:.2f}x**")
        lines.append(f"| {case.removeprefix('generate ')} | " + " | ".join(values) + " |")
    where = measured_on(*cells.values())
    return [
        f"[`FastDecoding` against CTranslate2](#translation-decoding-speed) at the same precision, each engine at "
        f"its fastest thread count: our tokens/s over CTranslate2's (above 1.00x ours is faster; below, in bold, "
        f"slower). Measured on {where} (`fast_decoding.csv`); on another instruction set the cells differ.",
        "",
        *lines,
        "",
    ]


def _claims_quality(rows) -> list[Claim]:
    quality: dict[tuple[str, str], dict] = {}
    for row in rows("translation_quality.csv"):
        quality.setdefault((row["mode"], row["engine"]), row)  # the first of a repeated pair: dynamic int8 products
    sword = rows("translation_sword.csv")
    claims = []
    ours, peer = quality.get(("beam 4", "fast int8")), quality.get(("beam 4", "generate float32"))
    if ours and peer:
        claims.append(
            Claim(
                "BLEU, beam 4, `FastDecoding` int8 against float32 `generate`",
                fmt_score(ours["bleu"]),
                fmt_score(peer["bleu"]),
                f"{float(ours['bleu']) - float(peer['bleu']):+.2f} BLEU",
                "translation_quality.csv",
                "python scripts/benchmarks/bench_seq2seq.py --quality MODEL_DIR",
                measured_on(ours, peer),
            )
        )
    floor = next((r for r in sword if r["weights"].startswith("copy")), None)
    model = next((r for r in sword if r["weights"].startswith("average")), None)
    if floor and model:
        claims.append(
            Claim(
                "English -> Spanish verses, test BLEU (averaged checkpoints)",
                fmt_score(model["test_bleu"]),
                f"{fmt_score(floor['test_bleu'])} (copying the source)",
                "",
                "translation_sword.csv",
                "python scripts/train_translation.py",
                measured_on(model),
                summary=False,
            )
        )
    return claims


def _claims_sparse(rows) -> list[Claim]:
    table = rows("sparse_attention.csv")
    longest = max(int(r["n"]) for r in table)
    row = next(
        (r for r in table if int(r["n"]) == longest and r["kernel"] == "sparse_block" and r["pattern"] == "strided"),
        None,
    )
    if not row:
        return []
    sdpa = next(r for r in table if int(r["n"]) == longest and r["kernel"] == "sdpa")
    return [
        Claim(
            f"attention fwd+bwd at {longest:,} tokens, strided block-sparse (s)",
            fmt_time(row["fwd_bwd_s"]),
            f"{fmt_time(sdpa['fwd_bwd_s'])} (dense causal SDPA)",
            fmt_multiple(row["fwd_bwd_vs_sdpa"], "time"),
            "sparse_attention.csv",
            "python scripts/benchmarks/bench_sparse_attention.py",
            measured_on(row, sdpa),
        )
    ]


def _claims_sharding(rows) -> list[Claim]:
    table = [r for r in rows("sharding_memory.csv") if r["state_mib"]]
    counts = sorted({r["processes"] for r in table}, key=int)
    ddp = [next(r for r in table if r["processes"] == n and r["run"] == "DDP") for n in counts]
    fsdp = [next(r for r in table if r["processes"] == n and r["run"] == "FSDP2") for n in counts]
    if not counts:
        return []
    return [
        Claim(
            f"ViT-B/16 training state per process, FSDP2, {' / '.join(counts)} processes (MiB)",
            _joined(fsdp, "state_mib", fmt_mib),
            f"{_joined(ddp, 'state_mib', fmt_mib)} (DDP)",
            " / ".join(fmt_ratio(float(f["state_mib"]), float(d["state_mib"]), "memory") for f, d in zip(fsdp, ddp)),
            "sharding_memory.csv",
            "python scripts/benchmarks/bench_sharding.py",
            measured_on(*fsdp),
        )
    ]


def _claims_input_pipeline(rows) -> list[Claim]:
    table = rows("input_pipeline.csv")
    command = "python scripts/benchmarks/bench_input_pipeline.py --output results/input_pipeline.csv"
    claims = []
    images = [r for r in table if r["part"] == "images"]
    workers = max((r["workers"] for r in images), key=int, default=None)
    timm = next((r for r in images if r["workers"] == workers and r["case"].startswith("timm")), None)
    ours = next((r for r in images if r["workers"] == workers and r["case"] == "ours, streamed"), None)
    if timm and ours:
        claims.append(
            Claim(
                f"images/s streamed with DeiT's augmentations at 224 px, {workers} loader workers",
                fmt_rate(ours["images_per_s"]),
                f"{fmt_rate(timm['images_per_s'])} (timm's create_loader)",
                fmt_ratio(float(ours["images_per_s"]), float(timm["images_per_s"])),
                "input_pipeline.csv",
                command,
                measured_on(ours, timm),
            )
        )
    text = {r["case"].split(" ")[0]: r for r in table if r["part"] == "text"}
    if "token" in text and "fixed" in text:
        claims.append(
            Claim(
                "padded share of a seq2seq batch's tokens, token budget",
                fmt_score(text["token"]["padding_fraction"]),
                f"{fmt_score(text['fixed']['padding_fraction'])} (fixed-size batches)",
                fmt_ratio(
                    float(text["token"]["padding_fraction"]), float(text["fixed"]["padding_fraction"]), "padding"
                ),
                "input_pipeline.csv",
                command,
                measured_on(text["token"]),
                summary=False,
            )
        )
    return claims


TOPICS = (
    Topic(
        "Start-up time",
        "Importing the package costs what importing transformers' own ViT costs, and every command's `--help` but "
        "`explain pattern`'s answers in a fraction of a second: the heavy parts are imported when first used.",
        ("import_time.csv",),
        (Plot("import_time.csv", plot_import_time),),
        _claims_start_up,
    ),
    Topic(
        "Models that learn by default",
        "Each family's default `hf-vit-plus train` run, over seeds and thread counts, against its target (the dashed "
        "line; one panel per family, each metric on its own axis); the demo and the learning tests below it.",
        ("demo.csv", "learning_defaults.csv", "learning_tests.csv"),
        (Plot("learning_defaults.csv", plot_learning),),
        _claims_learning,
    ),
    Topic(
        "Vision Transformer speed on a CPU",
        "With the same weights, our ViT-B/16 runs as fast as timm's and transformers' at every precision they share; "
        "the int8 rows have no peer at int8. The files below hold the kernel choices behind it.",
        (
            "vit_throughput.csv",
            "vit_training_step.csv",
            "vit_int8.csv",
            "vit_cpu_attention_lengths.csv",
            "vit_cpu_attention_update.csv",
            "cpu_bf16_gemm_fallback.csv",
            "adamw_update_time.csv",
        ),
        (Plot("vit_throughput.csv", plot_vit_throughput),),
        _claims_vit,
    ),
    Topic(
        "Small data: Fashion-MNIST",
        "Test accuracy against training time, one marker per kind of model; the target is 92% within 45 minutes "
        "(the dashed and dotted lines). The hybrid ViT (a convolutional stem before the encoder) reaches it within "
        "the budget; the plain ViTs with DeiT's recipe stop about a point short.",
        ("small_data.csv", "small_data_update_time.csv", "small_data_augmentation.csv", "small_data_recipe_none.csv"),
        (Plot("small_data.csv", plot_small_data),),
        _claims_small_data,
    ),
    Topic(
        "Translation decoding speed",
        "Each engine's tokens per second as a multiple of transformers' Marian with the same weights (the dashed line "
        "at 1): our compiled `FastDecoding` is several times faster at batch 1, int8 faster still; the summary "
        "table sets it against CTranslate2 at the same precision, cell by cell.",
        (
            "fast_decoding.csv",
            "decoding_refactor_before_after.csv",
            "fast_decoding_history.csv",
            "fast_decoding_profile.csv",
            "fast_decoding_details.csv",
            "translate_call.csv",
            "translate_file.csv",
            "seq2seq_vs_marian.csv",
        ),
        (
            Plot("fast_decoding.csv", plot_fast_decoding),
            Plot("decoding_refactor_before_after.csv", plot_decoding_speed),
        ),
        _claims_decoding,
    ),
    Topic(
        "Translation quality",
        "Faster engines and lower precisions keep BLEU within a few tenths of float32 `generate`; the trained "
        "English -> Spanish model against a copy-the-source floor.",
        (
            "translation_quality.csv",
            "int8_quality.csv",
            "int8_speed.csv",
            "translation_sword.csv",
            "translation_sword_curve.csv",
            "translation_malloc.csv",
        ),
        (),
        _claims_quality,
    ),
    Topic(
        "Sparse attention",
        "Forward and backward time of each sparse kernel as a multiple of dense causal SDPA's (the dashed line at 1): "
        "the block-sparse kernels pull ahead as the sequence grows.",
        (
            "sparse_attention.csv",
            "sparse_lm.csv",
            "image_lm_patterns.csv",
            "image_lm_depth.csv",
            "image_lm_sampling.csv",
        ),
        (Plot("sparse_attention.csv", plot_sparse_attention),),
        _claims_sparse,
    ),
    Topic(
        "Sharded training memory",
        "FSDP2 holds 1/N of the training state per process; with RAM-efficient loading only the main process reads "
        "the weights (solid lines) instead of every process (dashed).",
        ("sharding_memory.csv", "ram_efficient_loading.csv"),
        (Plot("ram_efficient_loading.csv", plot_memory_per_process),),
        _claims_sharding,
    ),
    Topic(
        "Data loading",
        "The training loaders alone, without a model: ours against timm's `create_loader`.",
        ("input_pipeline.csv",),
        (Plot("input_pipeline.csv", plot_input_pipeline),),
        _claims_input_pipeline,
    ),
)


NOT_RECORDED = "not recorded"


def _isa(row: dict) -> str:
    """The instruction set a row was measured at (`isa`, "capped" when a cap held it below the CPU's widest), or
    "not recorded" (rows from before result files recorded it)."""
    isa = (row.get("isa") or "").strip()
    if not isa:
        return NOT_RECORDED
    return f"{isa} (capped)" if (row.get("isa_capped") or "").strip().lower() == "true" else isa


def _table(rows: list[dict], columns: tuple[str, ...]) -> str:
    columns = columns or tuple(key for key in rows[0] if key not in CONTEXT)
    if "device" in columns and "isa" not in columns:  # the instruction set next to the CPU
        at = columns.index("device") + 1
        columns = (*columns[:at], "isa", *columns[at:])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [_isa(row) if column == "isa" else _cell(row.get(column, "")) for column in columns]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def _measured_on(rows: list[dict]) -> str:
    """The devices of a file's rows, each with its instruction set(s), in the order they first appear ("" for a file
    without a device column)."""
    if not rows or "device" not in rows[0]:
        return ""
    seen: dict[str, list[str]] = {}
    for row in rows:
        isas = seen.setdefault(row.get("device") or NOT_RECORDED, [])
        if _isa(row) not in isas:
            isas.append(_isa(row))
    return "; ".join(f"{device} (instruction set: {', '.join(isas)})" for device, isas in seen.items())


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" if line else "" for line in text.splitlines())


def _file_anchor(entry: ResultFile) -> str:
    """The anchor of a file's part: its name, or `<name>-rows` where a section's heading has that id already."""
    anchor = entry.name.removesuffix(".csv").replace("_", "-")
    return f"{anchor}-rows" if anchor in {topic.anchor for topic in TOPICS} else anchor


def _file_part(entry: ResultFile, rows: list[dict]) -> list[str]:
    """One file's part of a topic: an anchor named after the file, what it holds, its rows collapsed."""
    anchor = _file_anchor(entry)
    measured_on = _measured_on(rows)
    return [
        f'<a id="{anchor}"></a>',
        "",
        f"`results/{entry.name}`: {entry.holds}. Written by {entry.written_by}.",
        "",
        *([f"Measured on: {measured_on}.", ""] if measured_on else []),
        f'??? note "rows ({len(rows)})"',
        "",
        _indent(_table(rows, entry.columns)),
        "",
    ]


def _missing_file_part(entry: ResultFile) -> list[str]:
    """A described file that is not committed: its anchor (pages link to it), what it will hold, what writes it."""
    anchor = _file_anchor(entry)
    return [
        f'<a id="{anchor}"></a>',
        "",
        f"`results/{entry.name}` is not committed yet: it will hold {entry.holds}. Written by {entry.written_by}.",
        "",
    ]


MAX_SUMMARY_ROWS = 12
MACHINES_NOTE = (
    "Figures from different machines are not compared: each row names the CPU it ran on and its widest instruction "
    "set (ISA: the result files' `device` and `isa`), every ratio sets two figures of one run on one machine "
    "against each other, and a speed "
    "measured with AVX-512 need not hold with AVX2 alone."
)
PAIRED_NOTE = (
    "A decoding ratio is the median of the per-repetition ratios (the engines take turns in each repetition, so "
    "that the machine's load weighs on both alike); it can differ from the ratio of the two medians beside it."
)


def summary(topics, rows, present: set[str]) -> list[str]:
    """The summary: one screen of headline rows (at most MAX_SUMMARY_ROWS, each naming where it was measured),
    then the CTranslate2 cells as one grid; every section below has a row."""
    lines = [
        "## Summary",
        "",
        MACHINES_NOTE,
        "",
        "| what (the section: its files and commands) | ours | peer | ours against the peer | measured on |",
        "|---|---|---|---|---|",
    ]
    count = 0
    for topic in topics:
        measured = any(name in present for name in topic.files)
        claims = topic.claims(rows) if all(name in present for name in topic.files[:1]) else []
        what = "see the section" if measured else f"{topic.title.lower()}: not measured yet (no rows committed)"
        claims = [claim for claim in claims if claim.summary] or [Claim(what, "", "", "", topic.files[0], "")]
        for claim in claims:
            count += 1
            lines.append(
                f"| [{claim.what}](#{topic.anchor}) | {claim.ours} | {claim.peer} | {claim.ratio} | {claim.machine} |"
            )
    if count > MAX_SUMMARY_ROWS:
        raise ValueError(f"the summary has {count} rows, over {MAX_SUMMARY_ROWS}: mark the rest summary=False")
    lines += ["", PAIRED_NOTE, ""]
    if "fast_decoding.csv" in present:
        lines += ctranslate2_grid(rows("fast_decoding.csv"))
    return lines


def plot_caption(topic, plot: Plot, rows) -> str:
    """What a plot shows the run of: its file, its dates and machine, and, where the section has a newer plot, that
    this one is an older run (its figures are not those of the newer one)."""
    table = rows(plot.file)
    dates = sorted({row["date"] for row in table if row.get("date")})
    newest = max((row.get("date") or "" for other in topic.plots for row in rows(other.file)), default="")
    when = f", {dates[0]}" + (f" to {dates[-1]}" if dates[-1] != dates[0] else "") if dates else ""
    older = (
        " An older run than the section's other plot: compare within a plot, not across."
        if dates and newest and dates[-1] < newest
        else ""
    )
    return f"*The rows of `results/{plot.file}`{when}, measured on {measured_on(*table)}.{older}*"


README = ROOT / "README.md"
README_START = "<!-- headlines: generated by scripts/docs/results_pages.py from results/; do not edit by hand -->"
README_END = "<!-- end of headlines -->"
# the summary's claims the README quotes, by file and the start of their `what`
README_CLAIMS = (
    ("demo.csv", "`make demo`"),
    ("vit_int8.csv", "ViT-B/16"),
    ("fast_decoding.csv", "tokens/s, greedy decoding"),
    ("sparse_attention.csv", "attention fwd+bwd"),
)


def readme_headlines() -> str:
    """The README's headline figures: claims of the summary, from the same rows, with where they were measured."""
    cache: dict[str, list[dict]] = {}

    def rows(name: str) -> list[dict]:
        if name not in cache:
            cache[name] = read_rows(RESULTS / name)
        return cache[name]

    claims = [claim for topic in TOPICS for claim in topic.claims(rows)]
    lines = [README_START]
    for file, start in README_CLAIMS:
        claim = next((c for c in claims if c.file == file and c.what.startswith(start)), None)
        if claim is None:
            continue
        against = f" against {claim.peer}" if claim.peer else ""
        ratio = f": {claim.ratio}" if claim.ratio else ""
        lines.append(f"- {claim.what}: {claim.ours}{against}{ratio} (on {claim.machine}).")
        if file == "fast_decoding.csv":
            cells = [float(r["vs_ctranslate2"]) for r in rows(file) if r.get("vs_ctranslate2")]
            lines.append(
                f"- `FastDecoding` against CTranslate2 at the same precision: {min(cells):.2f}x to "
                f"{max(cells):.2f}x its tokens/s in {len(cells)} cells (on {measured_on(*rows(file))})."
            )
    lines += [
        "",
        "Figures from different machines are not compared; all of them, with their commands: "
        "[Results](docs/results.md).",
        README_END,
    ]
    return "\n".join(lines)


def _readme_with_headlines(text: str) -> str:
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    return text[:start] + readme_headlines() + text[end:]


def render(plots: bool = True) -> str:
    """The page's text; with `plots`, the plots are written too."""
    present = {path.name for path in RESULTS.glob("*.csv")}
    cache: dict[str, list[dict]] = {}

    def rows(name: str) -> list[dict]:
        if name not in cache:
            cache[name] = read_rows(RESULTS / name)
        return cache[name]

    topics = list(TOPICS)  # a topic without committed rows still has its section: what will measure it
    parts = [
        "# Results",
        "",
        "<!-- Generated by scripts/docs/results_pages.py from the files under results/: do not edit by hand. -->",
        "",
        "Every number on this site comes from a file under `results/` in the repository, written by the command "
        "named with it; each row there also records the date, the releases and the machine it was measured on. "
        "`results/gpu/` holds a lent GPU machine's check, committed after it (`make gpu-check`, see "
        "[the GPU check](contributing/testing.md#gpu-check)).",
        "",
    ]
    parts += summary(topics, rows, present)
    if plots:
        IMAGES.mkdir(parents=True, exist_ok=True)
    for topic in topics:
        parts += [f"## {topic.title}", "", topic.reading, ""]
        for plot in topic.plots:
            if plot.file not in present:
                continue
            if plots:
                plot.draw(rows(plot.file), IMAGES / f"{plot.name}.png")
            parts += [f"![{plot.name.replace('_', ' ')}](images/results/{plot.name}.png)", ""]
            parts += [plot_caption(topic, plot, rows), ""]
        for name in topic.files:
            if name in present:
                parts += _file_part(FILE_BY_NAME[name], rows(name))
            else:
                parts += _missing_file_part(FILE_BY_NAME[name])
    listed = {name for topic in TOPICS for name in topic.files}
    others = sorted(present - listed)
    if others:
        parts += ["## Other files", ""]
        for name in others:
            entry = FILE_BY_NAME.get(name, ResultFile(name, "(not described)", "rows without a description yet"))
            parts += _file_part(entry, rows(name))
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    from hf_vit_plus.cli_utils import CommandParser

    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare docs/results.md with the files; write nothing")
    args = parser.parse_args(argv)
    readme = README.read_text(encoding="utf-8")
    if args.check:
        stale = [PAGE] if PAGE.read_text(encoding="utf-8") != render(plots=False) else []
        stale += [README] if readme != _readme_with_headlines(readme) else []
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date with results/: run python scripts/docs/results_pages.py")
        return 1 if stale else 0
    PAGE.write_text(render(), encoding="utf-8")
    README.write_text(_readme_with_headlines(readme), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} and {len(list(IMAGES.glob('*.png')))} plots in {IMAGES.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
