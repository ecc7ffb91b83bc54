"""One warm call of a batch of short translations: `Translator(engine="fast")(sources)` (text in, text out) against
CTranslate2's `translate_batch` on the same sources already tokenized (tokens in, tokens out), on the same weights
(our export, `hf_vit_plus.export.export_ctranslate2`), greedy, side by side in one process.

The sources are the first `--batch` (16) of the number-words test split (`load_number_words_dataset(max_number=9999,
num_test=500, seed=0)`, the built-in `hf-vit-plus train seq2seq` task's evaluation split: 1-4 digits, translations
of about five tokens) with `--model`, a trained folder (`hf-vit-plus train seq2seq --output_dir numbers`). Without
`--model`, random weights of the default `train seq2seq` size stand in (`bench_translate_file.default_model`), with
`--max_new_tokens` (default 6 then) bounding both engines' length: its translations run to that bound, which tells
the time of a call of that length, not of a trained model's translations.

Per precision (`--precisions`: float32, int8: FastDecoding's `precision`, CTranslate2's `compute_type`) and thread
count (`--threads`: torch's threads, CTranslate2's `intra_threads`), after a first untimed call of each (which
compiles or loads FastDecoding's steps), the calls take turns `--repeats` times (each takes each place in turn,
so that load on the machine affects all alike): ours, CTranslate2, and CTranslate2 behind its tokenizer round trip
(`ct2_text_ms`: text in, text out, as ours is timed). The rows give the medians of the wall-clock times, the ratio
ours / CTranslate2 (at or below 1: ours is as fast or faster), the median of the per-repetition ratios, and the
medians of the process's CPU time per call (`*_cpu_ms`, all threads: steadier than the wall clock on a loaded machine
at one thread; at two it counts the threads' waiting too) with their ratio. `agrees` says whether CTranslate2's
translations are ours (float32 greedy: they should be). `--output FILE` writes the rows as CSV
(`result_rows.write_rows`), each with the CPU's instruction set (`isa`, `hf_vit_plus.models.cpu_isa.isa_label()`).

    hf-vit-plus train seq2seq --output_dir numbers
    python scripts/benchmarks/bench_translate_call.py --model numbers --output results/translate_call.csv
    python scripts/benchmarks/bench_translate_call.py --quick     # a short check that the cell runs (a tiny model)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# --quick: a tiny random model, FastDecoding uncompiled, float32 at one thread, a few repetitions
QUICK = dict(threads=[1], precisions=["float32"], repeats=5, max_new_tokens=6)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    sys.path.insert(0, str(HERE.parents[1]))
    from hf_vit_plus.cli_utils import CommandParser

    p = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a trained number-words checkpoint (default: random weights of the default size)")
    p.add_argument("--batch", type=int, default=16, help="sources translated in one call")
    p.add_argument("--threads", type=int, nargs="+", help="thread counts (1 2)")
    p.add_argument("--precisions", nargs="+", choices=("float32", "int8"), help="precisions (float32 int8)")
    p.add_argument("--repeats", type=int, help="timed calls of each engine per cell, their median reported (200)")
    p.add_argument("--max_new_tokens", type=int, help="a fixed length limit (default: the model's; random weights: 6)")
    p.add_argument("--fast_backend", default="aoti", help="FastDecoding's backend (aoti; eager: no compilation)")
    p.add_argument("--quick", action="store_true", help="a short check on a tiny random model (well under a minute)")
    p.add_argument("--output", type=Path, help="CSV file of the rows (result_rows.write_rows)")
    args = p.parse_args(argv)
    defaults = dict(threads=[1, 2], precisions=["float32", "int8"], repeats=200)
    if args.quick:
        defaults = {**defaults, **QUICK}
        args.fast_backend = "eager" if args.fast_backend == "aoti" else args.fast_backend
    elif args.model is None:
        defaults["max_new_tokens"] = 6
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    for name in ("batch", "repeats", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} must be >= 1, got {value}")
    return args


def _load_sibling(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def rotated(calls, repeats: int) -> list[tuple[list[float], list[float]]]:
    """(wall seconds, process CPU seconds) of `repeats` calls of each of `calls`, in turns, the order rotated at each
    repetition so that each takes each place (load on the machine affects all alike)."""
    times = [([], []) for _ in calls]
    for repeat in range(repeats):
        for k in range(len(calls)):
            which = (repeat + k) % len(calls)
            start, cpu = time.perf_counter(), time.process_time()
            calls[which]()
            times[which][0].append(time.perf_counter() - start)
            times[which][1].append(time.process_time() - cpu)
    return times


def measure_cell(model: Path, ct2_model: Path, texts: list[str], precision: str, threads: int, args) -> dict:
    """One precision and thread count: the medians of both calls, their ratio and the check."""
    import ctranslate2
    import torch

    from hf_vit_plus.models.fast_decoding import FastDecoding
    from hf_vit_plus.serving import Translator

    torch.set_num_threads(threads)
    ours = Translator(model, engine="fast", precision=precision)
    if args.fast_backend != "aoti":
        ours.decoder = FastDecoding(precision=precision, backend=args.fast_backend)
    tokenizer = ours.tokenizer
    settings = dict(num_beams=1)
    if args.max_new_tokens:
        settings["max_new_tokens"] = args.max_new_tokens
    tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(texts)["input_ids"]]
    # ours: the longest source + 50 new tokens, or the fixed limit; CTranslate2's max_decoding_length counts the same
    length = args.max_new_tokens or max(map(len, tokens)) + 50
    ct2 = ctranslate2.Translator(str(ct2_model), compute_type=precision, intra_threads=threads, inter_threads=1)
    options = dict(max_batch_size=len(texts), beam_size=1, max_decoding_length=length)

    def ct2_call():
        return ct2.translate_batch(tokens, **options)

    def ct2_text():
        encoded = tokenizer(texts)["input_ids"]
        results = ct2.translate_batch([tokenizer.convert_ids_to_tokens(ids) for ids in encoded], **options)
        ids = [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]
        return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]

    def our_call():
        return ours(texts, batch_size=len(texts), **settings)

    outputs, theirs = our_call(), ct2_text()  # the first calls: FastDecoding compiles or loads its steps here
    new_tokens = [len(result.hypotheses[0]) for result in ct2_call()]
    (ours_s, ours_cpu), (ct2_s, ct2_cpu), (ct2_text_s, _) = rotated([our_call, ct2_call, ct2_text], args.repeats)
    ratios = [a / b for a, b in zip(ours_s, ct2_s)]
    ours_ms, ct2_ms = statistics.median(ours_s) * 1e3, statistics.median(ct2_s) * 1e3
    ours_cpu_ms, ct2_cpu_ms = statistics.median(ours_cpu) * 1e3, statistics.median(ct2_cpu) * 1e3
    return dict(
        precision=precision,
        threads=threads,
        sentences=len(texts),
        source_tokens=round(statistics.mean(map(len, tokens)), 2),
        output_tokens=round(statistics.mean(new_tokens), 2),
        max_new_tokens=args.max_new_tokens or "",
        ours_ms=round(ours_ms, 4),
        ct2_ms=round(ct2_ms, 4),
        ct2_text_ms=round(statistics.median(ct2_text_s) * 1e3, 4),
        ours_vs_ct2=round(ours_ms / ct2_ms, 3),
        ratio_median=round(statistics.median(ratios), 3),
        ours_cpu_ms=round(ours_cpu_ms, 4),
        ct2_cpu_ms=round(ct2_cpu_ms, 4),
        cpu_ours_vs_ct2=round(ours_cpu_ms / ct2_cpu_ms, 3),
        repeats=args.repeats,
        agrees=outputs == theirs,
    )


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    from hf_vit_plus.data.number_words import load_number_words_dataset
    from hf_vit_plus.models.cpu_isa import isa_label
    from hf_vit_plus.utils.environment import cpu_description
    from hf_vit_plus.utils.logging import disable_progress_bar

    disable_progress_bar()
    translate_file = _load_sibling("bench_translate_file")
    isa, cpu = isa_label(), cpu_description()[0]
    texts = list(load_number_words_dataset(max_number=9999, num_test=500, seed=0)["test"]["source"])[: args.batch]
    workdir = Path(tempfile.mkdtemp(prefix="bench_translate_call_"))
    if args.model:
        model = Path(args.model)
    else:
        model = translate_file.default_model(workdir / "number-words-random", args.quick)
    print(f"CPU: {cpu} ({isa}); {len(texts)} sources; model: {args.model or 'random weights'}")
    ct2_model = translate_file.export_models(model, workdir)
    rows = []
    for threads in args.threads:
        for precision in args.precisions:
            rows.append(dict(measure_cell(model, ct2_model, texts, precision, threads, args), isa=isa, cpu=cpu))
    columns = ("precision", "threads", "output_tokens", "ours_ms", "ct2_ms", "ct2_text_ms", "ours_vs_ct2")
    columns += ("ours_cpu_ms", "ct2_cpu_ms", "cpu_ours_vs_ct2", "agrees")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[column]) for column in columns) + " |")
    for row in rows:
        print(
            f"summary | {row['precision']} {row['threads']} thread(s) | ours / CTranslate2: {row['ours_vs_ct2']:.2f}x "
            f"(at or below 1: ours as fast or faster)"
        )
    if args.output:
        from result_rows import write_rows

        write_rows(args.output, rows)
        print(f"rows written to {args.output}")
    return rows


if __name__ == "__main__":
    main()
