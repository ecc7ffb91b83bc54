"""A translation job as users run it: a file of mixed-length sentences translated from a fresh process, by our
`Translator` (`hf_vit_plus.serving`, FastDecoding) and by CTranslate2's `translate_batch` on the whole list with the
same `max_batch_size`, on the same weights (our export, `hf_vit_plus.export.export_ctranslate2`).

Files (`--datasets`): the number-words test split (`load_number_words_dataset(max_number=9999, num_test=500,
seed=0)`, the built-in `hf-vit-plus train seq2seq` task's evaluation split: sources of 1-4 digits) with `--model`,
and the SWORD test verses (`load_sword_parallel_dataset()`'s split, `scripts/train_translation.py`'s) with
`--sword_model`, where the modules are installed (`apt-get install sword-text-kjv sword-text-sparv`) and a model is
given; otherwise the run says why it leaves them out. Without `--model` a model of the default `train seq2seq` size
with random weights stands in (its tokenizer trained on the training split): its translations run to the length
limit, which tells the speed of a call, not of a trained model's translations; pass a trained folder
(`hf-vit-plus train seq2seq --output_dir numbers`) for the job's own figures.

Each measurement is a fresh Python process (`--worker`): cold is the time from the process's start to the last
translation of its first pass (importing the package, loading the model, building the engine: FastDecoding's
conversions and compilation, CTranslate2's model load; tokenizing, translating, detokenizing), warm the median of
`--warm_repeats` passes over the same list in that process. Engines (`--engines`): ours-fast (`Translator(engine=
"fast")`, float32), ours-fast-int8 (`precision="int8"`), ct2 (CTranslate2 float32), ct2-int8 (`compute_type=
"int8"`); cases: greedy and beam 4 (`--cases`); each engine runs at every thread count of `--threads` (torch's
threads, CTranslate2's `intra_threads`) and is reported at its fastest warm, with that count. Ours translates with
`Translator(texts, batch_size=N)` (sorted by length in its buffer, back in input order); CTranslate2 with
`translate_batch(tokens, max_batch_size=N)` (which sorts the whole list by length), `max_decoding_length` the
longest source + 50 (ours: each batch's longest source + 50) unless `--max_new_tokens` fixes both.

Unless `--first_process`, each of our engines first translates the file once in a process of its own (not
measured), so that the measured processes find the steps (and encoders) built on the machine and kept in the step
cache, as a user's every run after the first does; `steps_compiled_cold` says how many the measured cold pass
compiled (0 then). With `--first_process` the cold pass of the first thread count compiles them.

Checks: every sentence of our engines' pass is compared with what the same `Translator` gives it alone (a call with
that sentence only, after the timed passes; `alone_equal` is the share equal, which should be 1.0), and CTranslate2's
translations with ours at the same precision (`agrees_with_ours`: the share of identical sentences; beam search
ranks finished hypotheses differently in CTranslate2, so a few beam outputs may differ).

The table gives per dataset, case and engine the cold and warm seconds and the ratios ours / CTranslate2 at the same
precision (CTranslate2's seconds over ours: above 1, ours is faster). `--output FILE` writes the rows as CSV
(`result_rows.write_rows`), each with the CPU's instruction set (`isa`, `hf_vit_plus.models.cpu_isa.isa_label()`).

    python scripts/benchmarks/bench_translate_file.py --model numbers --output results/translate_file.csv
    python scripts/benchmarks/bench_translate_file.py --model numbers --sword_model outputs/translation/model
    python scripts/benchmarks/bench_translate_file.py --quick      # a short check that the job runs (a tiny model)
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()  # a worker's cold time counts from here: before torch is imported

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ENGINES = {"ours-fast": "float32", "ours-fast-int8": "int8", "ct2": "float32", "ct2-int8": "int8"}
CASES = {"greedy": 1, "beam4": 4}
DATASETS = ("number-words", "sword")
EXTRA_TARGET_TOKENS = 50  # = hf_vit_plus.serving.EXTRA_TARGET_TOKENS (not imported: a worker times its imports)
# --quick: a tiny model, a few sentences, FastDecoding uncompiled, the float32 engines at one thread
QUICK = dict(
    sentences=24, engines=["ours-fast", "ct2"], cases=["greedy"], threads=[1], warm_repeats=1, max_new_tokens=6
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from hf_vit_plus.cli_utils import CommandParser

    p = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a trained number-words checkpoint (default: random weights of the default size)")
    p.add_argument("--sword_model", help="a checkpoint trained on the SWORD verses (scripts/train_translation.py)")
    p.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS), help="files translated")
    p.add_argument("--engines", nargs="+", choices=sorted(ENGINES), help="engines (all four)")
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), help="greedy and / or beam4 (both)")
    p.add_argument("--threads", type=int, nargs="+", help="thread counts, each engine at its fastest (1 2)")
    p.add_argument("--batch_size", type=int, default=16, help="Translator's batch_size, CTranslate2's max_batch_size")
    p.add_argument("--sentences", type=int, help="the first N sentences of each file (all)")
    p.add_argument("--warm_repeats", type=int, help="warm passes, their median reported (3)")
    p.add_argument("--max_new_tokens", type=int, help="a fixed length limit (default: the source length + 50)")
    p.add_argument("--fast_backend", default="aoti", help="FastDecoding's backend (aoti; eager: no compilation)")
    p.add_argument(
        "--first_process", action="store_true",
        help="measure the first process on the machine (default: a priming process builds the steps first)",
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="a short check on a tiny random model (well under a minute)")
    p.add_argument("--output", type=Path, help="CSV file of the rows (result_rows.write_rows)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a JSON job: run by the script itself in a fresh process
    args = p.parse_args(argv)
    defaults = dict(engines=list(ENGINES), cases=list(CASES), threads=[1, 2], warm_repeats=3)
    if args.quick:
        defaults = {**defaults, **QUICK}
        args.fast_backend = "eager" if args.fast_backend == "aoti" else args.fast_backend
        args.datasets = ["number-words"]
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    for name in ("batch_size", "warm_repeats", "sentences", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} must be >= 1, got {value}")
    return args


# ------------------------------------------------------------------------------------------------ the worker
def run_worker(job: dict) -> dict:
    """One engine, case and thread count in this fresh process: cold pass, warm passes, the checks."""
    texts = job["texts"]
    if job["engine"].startswith("ct2"):
        return _ctranslate2_worker(job, texts)
    import torch

    torch.set_num_threads(job["threads"])
    from hf_vit_plus.serving import Translator
    from hf_vit_plus.utils.logging import disable_progress_bar

    disable_progress_bar()
    translator = Translator(job["model"], engine="fast", precision=job["precision"])
    if job["fast_backend"] != "aoti":
        from hf_vit_plus.models.fast_decoding import FastDecoding

        translator.decoder = FastDecoding(precision=job["precision"], backend=job["fast_backend"])
    settings = _settings(job)
    translate = lambda: translator(texts, batch_size=job["batch_size"], **settings)  # noqa: E731
    outputs = translate()
    cold = time.perf_counter() - PROCESS_START
    from hf_vit_plus.models.fast_steps import step_counts

    compiled = step_counts["compiled"]  # the steps (and encoders) the cold pass compiled: 0 once built here
    if job.get("prime"):
        return dict(cold_s=cold, warm_s=0.0, outputs=outputs, compiled=compiled)
    warm = [_timed(translate) for _ in range(job["warm_repeats"])]
    alone = [translator([text], batch_size=1, **settings)[0] for text in texts]
    equal = sum(a == b for a, b in zip(outputs, alone))
    return dict(
        cold_s=cold, warm_s=statistics.median(warm), outputs=outputs, alone_equal=equal / len(texts), compiled=compiled
    )


def _ctranslate2_worker(job: dict, texts: list[str]) -> dict:
    import ctranslate2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(job["ct2_model"])
    translator = ctranslate2.Translator(
        job["ct2_model"], compute_type=job["precision"], intra_threads=job["threads"], inter_threads=1
    )
    config = json.loads((Path(job["model"]) / "generation_config.json").read_text())
    beams = job["beams"]

    def translate() -> list[str]:
        encoded = tokenizer(texts)["input_ids"]
        tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in encoded]
        length = job["max_new_tokens"] or max(map(len, encoded)) + EXTRA_TARGET_TOKENS
        results = translator.translate_batch(
            tokens,
            max_batch_size=job["batch_size"],
            beam_size=beams,
            length_penalty=config.get("length_penalty", 1.0) if beams > 1 else 1.0,
            max_decoding_length=length,
        )
        ids = [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]
        return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]

    outputs = translate()
    cold = time.perf_counter() - PROCESS_START
    warm = [_timed(translate) for _ in range(job["warm_repeats"])]
    return dict(cold_s=cold, warm_s=statistics.median(warm), outputs=outputs)


def _settings(job: dict) -> dict:
    settings = dict(num_beams=job["beams"])
    if job["max_new_tokens"]:
        settings["max_new_tokens"] = job["max_new_tokens"]
    return settings


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def spawn(job: dict, workdir: Path) -> dict:
    """`job` run by this script in a fresh process (`--worker`), its JSON result back."""
    path = workdir / "job.json"
    path.write_text(json.dumps(job))
    env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]), TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")])
    )
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(path)],
        env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(
            f"worker {job['engine']} ({job['case']}, {job['threads']} threads) failed:\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ the parent
def default_model(folder: Path, quick: bool) -> Path:
    """Random weights of the default `hf-vit-plus train seq2seq` size (or a tiny one with --quick), with the
    tokenizer that run trains on the number-words training split."""
    import torch

    from hf_vit_plus import Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration
    from hf_vit_plus.data.number_words import load_number_words_dataset
    from hf_vit_plus.models.pipeline_text2text_generation import save_text2text_pipeline
    from hf_vit_plus.tokenization import train_bpe_tokenizer
    from hf_vit_plus.training.tasks.seq2seq import SMALL_SEQ2SEQ_CONFIG

    train = load_number_words_dataset(max_number=9999, num_test=500, seed=0)["train"]
    texts = list(train["source"]) + list(train["target"])
    tokenizer = train_bpe_tokenizer(
        texts[:400] if quick else texts, vocab_size=300 if quick else 1000, split_digits=True
    )
    sizes = dict(SMALL_SEQ2SEQ_CONFIG)
    if quick:
        sizes.update(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=2,
                     decoder_attention_heads=2)  # fmt: skip
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    special.update(eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id)
    config = Seq2SeqTransformerConfig(**sizes, vocab_size=len(tokenizer), **special)
    torch.manual_seed(0)
    model = Seq2SeqTransformerForConditionalGeneration(config).eval()
    model.generation_config.num_beams, model.generation_config.length_penalty = 4, 0.6  # as train seq2seq saves it
    save_text2text_pipeline(model, tokenizer, folder)
    return folder


def load_files(args) -> dict[str, list[str]]:
    """dataset name -> its sources, the ones this run can translate (a line says why others are left out)."""
    files = {}
    if "number-words" in args.datasets:
        from hf_vit_plus.data.number_words import load_number_words_dataset

        files["number-words"] = list(
            load_number_words_dataset(max_number=9999, num_test=500, seed=0)["test"]["source"]
        )
    if "sword" in args.datasets:
        from hf_vit_plus.data.sword import load_sword_parallel_dataset

        if args.sword_model is None:
            print("sword: left out (no --sword_model: a model trained by scripts/train_translation.py)")
        else:
            try:
                files["sword"] = list(load_sword_parallel_dataset()["test"]["source"])
            except FileNotFoundError as error:
                print(f"sword: left out ({str(error).splitlines()[0]})")
    return {name: texts[: args.sentences] if args.sentences else texts for name, texts in files.items()}


def export_models(model: Path, workdir: Path) -> Path:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_vit_plus.export import export_ctranslate2

    folder = workdir / f"{model.name}-ct2"
    loaded = AutoModelForSeq2SeqLM.from_pretrained(model).eval()
    return export_ctranslate2(loaded, folder, tokenizer=AutoTokenizer.from_pretrained(model))


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(json.loads(Path(args.worker).read_text()))))
        return []
    from hf_vit_plus.models.cpu_isa import isa_label
    from hf_vit_plus.utils.environment import cpu_description

    isa, cpu = isa_label(), cpu_description()[0]
    print(f"CPU: {cpu} ({isa}); engines: {', '.join(args.engines)}; threads: {args.threads}; batch {args.batch_size}")
    workdir = Path(tempfile.mkdtemp(prefix="bench_translate_file_"))
    files = load_files(args)
    models = {"number-words": Path(args.model) if args.model else None, "sword": Path(args.sword_model or ".")}
    if "number-words" in files and models["number-words"] is None:
        models["number-words"] = default_model(workdir / "number-words-random", args.quick)
        print(
            f"number-words: random weights of the default train seq2seq size{' (tiny: --quick)' if args.quick else ''}"
        )
    rows = []
    for dataset, texts in files.items():
        model = models[dataset]
        ct2_model = export_models(model, workdir) if any(e.startswith("ct2") for e in args.engines) else None
        for case in args.cases:
            results = {}
            for engine in args.engines:
                by_threads = {}
                for threads in args.threads:
                    job = dict(engine=engine, precision=ENGINES[engine], case=case, beams=CASES[case], threads=threads,
                               texts=texts, model=str(model), ct2_model=str(ct2_model), batch_size=args.batch_size,
                               warm_repeats=args.warm_repeats, max_new_tokens=args.max_new_tokens,
                               fast_backend=args.fast_backend)  # fmt: skip
                    if engine.startswith("ours") and not args.first_process and args.fast_backend == "aoti":
                        spawn(dict(job, prime=True), workdir)  # the steps built here, as by a user's first run
                    by_threads[threads] = spawn(job, workdir)
                best = min(by_threads, key=lambda t: by_threads[t]["warm_s"])
                results[engine] = dict(by_threads[best], threads=best)
            rows += case_rows(dataset, case, texts, results, args, isa, cpu)
    report(rows)
    if args.output:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from result_rows import write_rows

        write_rows(args.output, [{k: v for k, v in row.items() if k != "outputs"} for row in rows])
        print(f"rows written to {args.output}")
    return rows


def _significant(seconds: float, digits: int = 4) -> float:
    """`seconds` to `digits` significant digits (a warm pass of the quick run takes milliseconds)."""
    return float(f"{seconds:.{digits}g}")


def case_rows(dataset, case, texts, results, args, isa, cpu) -> list[dict]:
    """The rows of one dataset and case: each engine's times, its ratios to CTranslate2 at the same precision (their
    seconds over ours) and the checks."""
    rows = []
    for engine, result in results.items():
        precision = ENGINES[engine]
        peer = ("ct2" if precision == "float32" else "ct2-int8") if engine.startswith("ours") else None
        ours = {"float32": "ours-fast", "int8": "ours-fast-int8"}[precision]
        row = dict(dataset=dataset, case=case, engine=engine, precision=precision, sentences=len(texts),
                   max_batch_size=args.batch_size, threads=result["threads"], cold_s=_significant(result["cold_s"]),
                   warm_s=_significant(result["warm_s"]), vs_ctranslate2_cold="", vs_ctranslate2_warm="",
                   alone_equal=result.get("alone_equal", ""), agrees_with_ours="",
                   steps_compiled_cold=result.get("compiled", ""), isa=isa, cpu=cpu,
                   outputs=result["outputs"])  # fmt: skip
        if peer in results:
            row["vs_ctranslate2_cold"] = round(results[peer]["cold_s"] / result["cold_s"], 3)
            row["vs_ctranslate2_warm"] = round(results[peer]["warm_s"] / result["warm_s"], 3)
        if engine.startswith("ct2") and ours in results:
            same = sum(a == b for a, b in zip(result["outputs"], results[ours]["outputs"]))
            row["agrees_with_ours"] = round(same / len(texts), 4)
        rows.append(row)
    return rows


def report(rows: list[dict]) -> None:
    columns = ("dataset", "case", "engine", "threads", "cold_s", "warm_s")
    columns += ("vs_ctranslate2_cold", "vs_ctranslate2_warm", "alone_equal", "agrees_with_ours", "steps_compiled_cold")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[column]) for column in columns) + " |")
    for r in rows:
        if r["vs_ctranslate2_warm"] != "":
            ratios = f"cold {r['vs_ctranslate2_cold']:.2f}x, warm {r['vs_ctranslate2_warm']:.2f}x"
            label = f"{r['dataset']} {r['case']} {r['precision']}"
            print(f"summary | {label} | {r['engine']} vs CTranslate2: {ratios} (above 1: ours faster)")


if __name__ == "__main__":
    main()
