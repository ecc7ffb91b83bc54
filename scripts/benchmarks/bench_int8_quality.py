"""Quality cost of int8 (torchao through `hf_vit_plus.quantization.quantize`) on the project's small real tasks.

    python scripts/benchmarks/bench_int8_quality.py                 # trains both models first (about 1 min each)
    python scripts/benchmarks/bench_int8_quality.py --vit_checkpoint outputs/demo --seq2seq_checkpoint DIR
    python scripts/benchmarks/bench_int8_quality.py --quick         # short training: checks that the script runs
    python scripts/benchmarks/bench_int8_quality.py --tasks sword --translation_model outputs/translation/model

Each model is scored in fp32, then a copy of it with each int8 scheme ("int8-dynamic": int8 weights and activations;
"int8-weight-only"):

- digits ViT: the model of `hf-vit-plus demo` (trained here through the same library loop, or --vit_checkpoint, a
  folder it wrote): accuracy on the 360 held-out digits, the number of predictions int8 changes, the largest logit
  change.
- numbers -> English words: the encoder-decoder of tests/training/test_seq2seq_training.py (trained here with the
  same recipe, or --seq2seq_checkpoint, a folder with its tokenizer): exact match on 200 held-out numbers, greedy and
  beam 4.
- SWORD English -> Spanish (scripts/train_translation.py's model, --translation_model): BLEU and chrF on the same
  held-out verses as that script (beam 4, length penalty 0.6, input length + 50 tokens); needs the SWORD modules
  (`apt-get install sword-text-kjv sword-text-sparv`) and a trained model, else the task says why it is skipped.

The table goes to stdout and, with the per-variant decoding seconds (noisy on a shared machine), to
OUTPUT_DIR/int8_quality.json; `--output FILE` also writes its rows as CSV, each followed by the run's context
(the command, the date, the versions, the CPU or GPU, the threads; `result_rows.write_rows`), as in
results/int8_quality.csv:

    python scripts/benchmarks/bench_int8_quality.py --output results/int8_quality.csv
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import torch

from hf_vit_plus.cli_utils import CommandParser
from hf_vit_plus.quantization import SCHEMES, quantize

VARIANTS = ("fp32", *SCHEMES)
# The columns of `--output`'s rows (before the run's context); a row leaves out those it has no value for.
COLUMNS = ("task", "variant", "metric", "value", "examples", "changed_predictions", "max_logit_change", "seconds")


def variants(model):
    """(name, model) for fp32 and each int8 scheme (quantized copies)."""
    for name in VARIANTS:
        yield name, model if name == "fp32" else quantize(copy.deepcopy(model), name)


# ------------------------------------------------------------------------------------------------ digits ViT
def train_digits_vit(output_dir: Path, quick: bool) -> Path:
    """`hf-vit-plus demo`'s training (the library's Accelerate loop, the demo's epochs and seed), without the card."""
    from hf_vit_plus.training.args import family_arguments
    from hf_vit_plus.training.cli import DEMO_DEFAULTS
    from hf_vit_plus.training.loop import train

    args = family_arguments(
        "vit",
        output_dir=str(output_dir),
        num_train_epochs=DEMO_DEFAULTS["num_train_epochs"],
        max_steps=60 if quick else None,
        seed=42,
        report_to="none",
        save_steps="none",
    )
    start = time.perf_counter()
    result = train(args)
    print(f"# trained the digits ViT: {result.global_step} updates, {time.perf_counter() - start:.0f} s", flush=True)
    return output_dir


@torch.inference_mode()
def digits_vit_rows(checkpoint: Path) -> list[dict]:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_vit_plus.data.digits import load_digits_dataset

    model = AutoModelForImageClassification.from_pretrained(checkpoint).eval()
    processor = AutoImageProcessor.from_pretrained(checkpoint)
    test = load_digits_dataset()["test"]  # the demo's held-out split
    mode = "L" if model.config.num_channels == 1 else "RGB"
    pixel_values = processor(images=[image.convert(mode) for image in test["image"]], return_tensors="pt")[
        "pixel_values"
    ]
    labels = torch.tensor(test["label"])
    rows, reference = [], None
    for name, variant in variants(model):
        start = time.perf_counter()
        logits = variant(pixel_values=pixel_values).logits
        seconds = time.perf_counter() - start
        predicted = logits.argmax(-1)
        row = {
            "task": "digits ViT",
            "variant": name,
            "metric": "accuracy %",
            "value": round(100 * (predicted == labels).float().mean().item(), 2),
            "examples": len(labels),
            "seconds": round(seconds, 3),
        }
        if reference is None:
            reference = logits, predicted
        else:
            row["changed_predictions"] = int((predicted != reference[1]).sum())
            row["max_logit_change"] = round((logits - reference[0]).abs().max().item(), 4)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------- number words
def train_number_words(output_dir: Path, quick: bool) -> Path:
    """tests/training/test_seq2seq_training.py's recipe: a shared BPE, 2+2 layers of width 128, the paper's Adam and
    Noam schedule (factor 1, 150 warm-up steps), label smoothing 0.1, 6 epochs, one thread."""
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, set_seed

    from hf_vit_plus import Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration
    from hf_vit_plus.data.number_words import load_number_words_dataset
    from hf_vit_plus.models.pipeline_text2text_generation import save_text2text_pipeline
    from hf_vit_plus.tokenization import train_bpe_tokenizer
    from hf_vit_plus.training.schedules import get_noam_schedule, paper_adam

    set_seed(0)
    data = load_number_words_dataset(max_number=9999, num_test=200, seed=0)
    tokenizer = train_bpe_tokenizer(
        list(data["train"]["source"]) + list(data["train"]["target"]), vocab_size=320, split_digits=True
    )
    encoded = data.map(
        lambda batch: tokenizer(batch["source"], text_target=batch["target"]),
        batched=True,
        remove_columns=["source", "target"],
    )
    config = Seq2SeqTransformerConfig(
        vocab_size=len(tokenizer), d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, dropout=0.0, max_position_embeddings=64,
        label_smoothing=0.1, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    model = Seq2SeqTransformerForConditionalGeneration(config)
    model.generation_config = Seq2SeqTransformerForConditionalGeneration.paper_generation_config(
        config, max_new_tokens=16
    )
    optimizer = paper_adam(model.parameters(), lr=1.0)
    scheduler = get_noam_schedule(optimizer, d_model=config.d_model, warmup_steps=150)
    args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir / "run"), per_device_train_batch_size=64, num_train_epochs=1 if quick else 6,
        use_cpu=True, report_to="none", save_strategy="no", eval_strategy="no", logging_steps=50,
        dataloader_num_workers=0, seed=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=encoded["train"],
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
    )
    start = time.perf_counter()
    trainer.train()
    print(f"# trained the number-words model: {time.perf_counter() - start:.0f} s", flush=True)
    return save_text2text_pipeline(trainer.model, tokenizer, output_dir / "number_words")


@torch.inference_mode()
def number_words_rows(checkpoint: Path, batch_size: int = 100) -> list[dict]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_vit_plus.data.number_words import load_number_words_dataset

    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    test = load_number_words_dataset(max_number=9999, num_test=200, seed=0)["test"]
    sources, targets = list(test["source"]), list(test["target"])
    rows = []
    for name, variant in variants(model):
        for beams in (1, 4):
            start, predictions = time.perf_counter(), []
            for begin in range(0, len(sources), batch_size):
                batch = tokenizer(sources[begin : begin + batch_size], return_tensors="pt", padding=True)
                generated = variant.generate(**batch, num_beams=beams, do_sample=False, max_new_tokens=16)
                predictions += tokenizer.batch_decode(generated, skip_special_tokens=True)
            correct = sum(p.strip() == t.strip() for p, t in zip(predictions, targets))
            rows.append({
                "task": f"number words ({'greedy' if beams == 1 else 'beam 4'})",
                "variant": name,
                "metric": "exact match %",
                "value": round(100 * correct / len(targets), 2),
                "examples": len(targets),
                "seconds": round(time.perf_counter() - start, 2),
            })  # fmt: skip
    return rows


# --------------------------------------------------------------------------------------------------- SWORD
def sword_rows(translation_model: Path | None, max_sentences: int | None) -> tuple[list[dict], str | None]:
    """BLEU / chrF of the SWORD model on scripts/train_translation.py's held-out split; ([], reason) if skipped."""
    if translation_model is None:
        return [], "no --translation_model given (a folder written by scripts/train_translation.py: OUTPUT_DIR/model)"
    scripts_dir = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(scripts_dir))
    import train_translation  # the split and the decoding of the script that trained the model
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_vit_plus.metrics import load_translation_metric

    script_args = train_translation.parse_args(["--output_dir", str(translation_model)])
    try:
        data = train_translation.load_pairs(script_args)
    except (FileNotFoundError, OSError, ValueError) as error:
        return [], f"the SWORD modules are not installed here ({str(error).splitlines()[0]})"
    test = data["test"]
    if max_sentences:
        test = test.select(range(min(max_sentences, test.num_rows)))
    model = AutoModelForSeq2SeqLM.from_pretrained(translation_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(translation_model)
    metric = load_translation_metric()
    rows = []
    for name, variant in variants(model):
        start = time.perf_counter()
        predictions = train_translation.translate(variant, tokenizer, list(test["source"]), script_args)
        scores = metric.compute(predictions=predictions, references=list(test["target"]))
        seconds = round(time.perf_counter() - start, 1)
        for key in ("bleu", "chrf"):
            rows.append({
                "task": "SWORD en->es (beam 4)", "variant": name, "metric": key.upper() if key == "bleu" else "chrF",
                "value": round(scores[key], 2), "examples": test.num_rows, "seconds": seconds,
            })  # fmt: skip
    return rows, None


# ---------------------------------------------------------------------------------------------------- main
def print_table(rows: list[dict]) -> None:
    print("| task | metric | variant | value | vs fp32 | changed predictions | decode s |")
    print("|---|---|---|---|---|---|---|")
    fp32 = {(r["task"], r["metric"]): r["value"] for r in rows if r["variant"] == "fp32"}
    for r in rows:
        delta = r["value"] - fp32[r["task"], r["metric"]]
        changed = r.get("changed_predictions", "")
        print(
            f"| {r['task']} | {r['metric']} | {r['variant']} | {r['value']:.2f} | {delta:+.2f} | {changed} "
            f"| {r['seconds']} |"
        )


def write_result_rows(path: Path, rows: list[dict], threads: int) -> Path:
    """Write `rows` (the tasks' result dicts) to the CSV `path`: the columns of `COLUMNS`, empty where a row has no
    value, then the run's context (`result_rows.write_rows`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from result_rows import write_rows

    return write_rows(path, [{column: row.get(column, "") for column in COLUMNS} for row in rows], threads=threads)


def main(argv: list[str] | None = None) -> dict:
    parser = CommandParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", type=Path, default=Path("outputs/int8_quality"), help="trained models go here")
    parser.add_argument("--tasks", nargs="+", default=["vit", "number-words", "sword"],
                        choices=["vit", "number-words", "sword"], help="tasks scored")  # fmt: skip
    parser.add_argument("--vit_checkpoint", type=Path, default=None, help="a digits ViT folder (default: train one)")
    parser.add_argument(
        "--seq2seq_checkpoint", type=Path, default=None, help="a number-words model folder (default: train one)"
    )
    parser.add_argument("--translation_model", type=Path, default=None, help="SWORD model folder (train_translation)")
    parser.add_argument("--max_sentences", type=int, default=None, help="SWORD: held-out verses decoded (default all)")
    parser.add_argument("--quick", action="store_true", help="train briefly: checks the script, not the numbers")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--output", type=Path, default=None, help="also write the rows to this CSV, with the context")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    note = "; --quick: short training, the numbers mean nothing" if args.quick else ""
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} thread(s), int8 by torchao{note}")

    rows, skipped = [], {}
    if "vit" in args.tasks:
        checkpoint = args.vit_checkpoint or train_digits_vit(args.output_dir / "digits_vit", args.quick)
        rows += digits_vit_rows(checkpoint)
    if "number-words" in args.tasks:
        checkpoint = args.seq2seq_checkpoint or train_number_words(args.output_dir, args.quick)
        rows += number_words_rows(checkpoint)
    if "sword" in args.tasks:
        sword, reason = sword_rows(args.translation_model, args.max_sentences)
        rows += sword
        if reason:
            skipped["sword"] = reason
    if rows:
        print_table(rows)
    for task, reason in skipped.items():
        print(f"# {task}: skipped, {reason}")
    results = {"rows": rows, "skipped": skipped, "quick": args.quick, "threads": args.threads}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "int8_quality.json").write_text(json.dumps(results, indent=2))
    if args.output is not None:
        if rows:
            print(f"# wrote {write_result_rows(args.output, rows, args.threads)}")
        else:
            print(f"# no rows: {args.output} not written")
    return results


if __name__ == "__main__":
    main()
