r"""Train the encoder-decoder Transformer for translation and report BLEU / chrF on a held-out set.

Default data, no network needed: English -> Spanish Bible verses (King James Version / Reina-Valera 1909) read
from the Debian SWORD modules; install them first:

    sudo apt-get install sword-text-kjv sword-text-sparv
    # the documented run (results/translation_sword*.csv); the malloc setting keeps freed memory in the process
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1000000000:glibc.malloc.trim_threshold=1000000000 \
    python scripts/train_translation.py --output_dir outputs/translation --max_train_minutes 105 \
        --warmup_steps 1000 --lr_factor 0.5 --eval_steps 400
    # interrupted? continue from the newest checkpoint (same data split, tokenizer, optimizer and schedule state)
    python scripts/train_translation.py --output_dir outputs/translation --max_train_minutes 60 \
        --resume_from_checkpoint latest

With network, a Hub dataset in the WMT layout (a `translation` column of {lang: text} dicts):

    python scripts/train_translation.py --dataset_name wmt14 --dataset_config_name de-en \
        --source_lang en --target_lang de --preset base --max_steps 100000 --output_dir outputs/wmt14

Recipe of the paper (sec. 5): shared BPE vocabulary, Adam(0.9, 0.98, 1e-9) with the Noam schedule, label smoothing
0.1; decoding (sec. 6.1) with beam 4, length penalty 0.6, at most input length + 50 new tokens; the average of the
last 5 checkpoints (sec. 6.1), kept when it beats the last checkpoint on the validation split.

Splits: `test` is held out and decoded once at the end; `validation` (carved from the training pairs for SWORD)
gives the greedy-decoding BLEU curve during training and chooses between the final and the averaged weights. Held-out
pairs whose source or target also occurs verbatim in the training pairs (the Bible repeats some verses) are dropped.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from datasets import DatasetDict, load_dataset
from transformers import (
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)

from hf_vit_plus import Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.cli_utils import CommandParser
from hf_vit_plus.data.sword import load_sword_parallel_dataset
from hf_vit_plus.hub.card import hub_dataset_id, write_model_card
from hf_vit_plus.hub.figures import plot_training_curves
from hf_vit_plus.metrics import load_translation_metric
from hf_vit_plus.models.pipeline_text2text_generation import save_text2text_pipeline
from hf_vit_plus.tokenization import train_bpe_tokenizer
from hf_vit_plus.training.averaging import average_checkpoints, last_checkpoints
from hf_vit_plus.training.schedules import get_noam_schedule, paper_adam

logger = logging.getLogger("train_translation")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument("--dataset_name", default="sword", help="'sword' (local SWORD modules) or a Hub dataset name")
    data.add_argument("--dataset_config_name", default=None, help="Hub dataset configuration, e.g. de-en")
    data.add_argument("--dataset_config", dest="dataset_config_name", help=argparse.SUPPRESS)  # its former name
    data.add_argument("--source_lang", default="en", help="source language code (SWORD: en or es)")
    data.add_argument("--target_lang", default="es", help="target language code")
    data.add_argument("--num_test", type=int, default=1000, help="held-out test pairs (SWORD split)")
    data.add_argument("--num_validation", type=int, default=500, help="validation pairs (SWORD split)")
    data.add_argument("--max_eval_samples", type=int, default=None, help="test pairs decoded for BLEU (default all)")
    data.add_argument(
        "--max_validation_samples", type=int, default=200, help="validation pairs decoded (greedy) at each evaluation"
    )
    data.add_argument("--max_train_samples", type=int, default=None, help="train on the first N pairs only")
    data.add_argument("--max_source_length", type=int, default=128, help="source tokens kept per pair")
    data.add_argument("--max_target_length", type=int, default=128, help="target tokens kept per pair")
    model = p.add_argument_group("model")
    model.add_argument("--vocab_size", type=int, default=8000, help="shared BPE vocabulary")
    model.add_argument("--tokenizer_train_pairs", type=int, default=200_000, help="pairs the BPE is learned from")
    model.add_argument("--preset", default=None, help="paper preset ('base', 'big') instead of the sizes below")
    model.add_argument("--d_model", type=int, default=256, help="model width")
    model.add_argument("--layers", type=int, default=3, help="encoder and decoder layers")
    model.add_argument("--heads", type=int, default=4, help="attention heads")
    model.add_argument("--ffn_dim", type=int, default=1024, help="feed-forward width")
    model.add_argument("--dropout", type=float, default=0.1, help="dropout of embeddings and sub-layers")
    model.add_argument(
        "--label_smoothing_factor", type=float, default=0.1, help="label smoothing of the loss (the paper: 0.1)"
    )
    model.add_argument("--label_smoothing", dest="label_smoothing_factor", type=float, help=argparse.SUPPRESS)
    train = p.add_argument_group("training")
    train.add_argument("--output_dir", required=True, help="where the model, results and checkpoints go")
    train.add_argument("--batch_size", type=int, default=32, help="training pairs per step")
    train.add_argument("--max_steps", type=int, default=100_000, help="training steps at most")
    train.add_argument("--max_train_minutes", type=float, default=None, help="stop training after this wall time")
    train.add_argument("--warmup_steps", type=int, default=4000, help="warm-up steps of the Noam schedule")
    train.add_argument("--lr_factor", type=float, default=1.0, help="multiplies the Noam curve (paper: 1)")
    train.add_argument("--logging_steps", type=int, default=50, help="log (and plot) the training loss every N steps")
    train.add_argument(
        "--eval_steps", type=int, default=1000, help="validation loss + greedy BLEU and a checkpoint every N steps"
    )
    train.add_argument("--average_last", type=int, default=5, help="checkpoints averaged at the end (paper: 5; 1=off)")
    train.add_argument(
        "--resume_from_checkpoint", default=None, help="'latest' or a checkpoint folder of this output_dir's run"
    )
    train.add_argument("--seed", type=int, default=0, help="random seed of the split, weights and batches")
    decode = p.add_argument_group("decoding")
    decode.add_argument("--num_beams", type=int, default=4, help="beam size of the final decoding")
    decode.add_argument("--length_penalty", type=float, default=0.6, help="length penalty alpha of the beam search")
    decode.add_argument("--eval_batch_size", type=int, default=32, help="pairs per decoding batch")
    return p.parse_args(argv)


def load_pairs(args: argparse.Namespace) -> DatasetDict:
    """`train`, `validation` and `test` splits with `source` and `target` columns."""
    if args.dataset_name == "sword":
        if (args.source_lang, args.target_lang) not in (("en", "es"), ("es", "en")):
            raise ValueError(f"the SWORD corpus is en<->es, got {args.source_lang}->{args.target_lang}")
        data = load_sword_parallel_dataset(test_size=args.num_test, seed=args.seed)
        if args.source_lang == "es":
            data = data.rename_columns({"source": "target", "target": "source"})
        carved = data["train"].train_test_split(test_size=args.num_validation, seed=args.seed)
        data = DatasetDict(train=carved["train"], validation=carved["test"], test=data["test"])
    else:
        raw = load_dataset(args.dataset_name, args.dataset_config_name)
        if "train" not in raw:
            raise ValueError(f"dataset {args.dataset_name!r} has no train split, only {list(raw)}")
        held_out = [split for split in ("validation", "test") if split in raw]
        if not held_out:
            raise ValueError(f"dataset {args.dataset_name!r} has no validation or test split, only {list(raw)}")
        # Without a test split the validation split is also the one reported (the card says so).
        args.eval_split = "test" if "test" in raw else "validation"

        def to_pairs(batch):
            pairs = batch["translation"]
            return {"source": [p[args.source_lang] for p in pairs], "target": [p[args.target_lang] for p in pairs]}

        def pairs_of(split: str):
            return raw[split].map(to_pairs, batched=True, remove_columns=raw[split].column_names)

        data = DatasetDict(train=pairs_of("train"), validation=pairs_of(held_out[0]), test=pairs_of(args.eval_split))
    if args.max_train_samples:
        data["train"] = data["train"].select(range(min(args.max_train_samples, data["train"].num_rows)))
    return drop_training_overlap(data)


def drop_training_overlap(data: DatasetDict) -> DatasetDict:
    """Remove held-out pairs whose source or target occurs verbatim among the training pairs. Only the held-out
    strings are kept in memory; the training pairs are streamed (WMT14 EN-DE has 4.5M of them)."""
    held_out = {side: set(data["validation"][side]) | set(data["test"][side]) for side in ("source", "target")}
    in_train: dict[str, set[str]] = {"source": set(), "target": set()}
    for batch in data["train"].select_columns(["source", "target"]).iter(batch_size=10_000):
        for side in ("source", "target"):
            in_train[side].update(text for text in batch[side] if text in held_out[side])
    for split in ("validation", "test"):
        before = data[split].num_rows
        data[split] = data[split].filter(
            lambda pair: pair["source"] not in in_train["source"] and pair["target"] not in in_train["target"]
        )
        if data[split].num_rows < before:
            logger.info("%s: dropped %d pairs also found in train", split, before - data[split].num_rows)
    return data


def checkpoint_steps(folder: Path) -> list[int]:
    return [int(path.name.split("-")[1]) for path in last_checkpoints(folder, 10**9)] if folder.is_dir() else []


class StopAfter(TrainerCallback):
    """Stop training after a wall-clock budget, evaluating and saving a checkpoint at the step it stops on."""

    def __init__(self, seconds: float | None):
        self.seconds, self.start = seconds, time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.seconds is not None and time.perf_counter() - self.start > self.seconds:
            control.should_training_stop = True
            control.should_save = True
            control.should_evaluate = args.eval_strategy != "no"
        return control


@torch.no_grad()
def translate(model, tokenizer, sources: list[str], args: argparse.Namespace) -> list[str]:
    """Beam search as in the paper: maximum output length = input length + 50."""
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[str] = [""] * len(sources)
    for start in range(0, len(order), args.eval_batch_size):
        index = order[start : start + args.eval_batch_size]
        batch = tokenizer(
            [sources[i] for i in index],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=args.max_source_length,
        )
        generated = model.generate(
            **batch,
            num_beams=args.num_beams,
            length_penalty=args.length_penalty,
            max_new_tokens=batch["input_ids"].shape[1] + 50,
        )
        for i, text in zip(index, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            outputs[i] = text.strip()
    return outputs


def write_translation_card(model_dir: Path, config, args: argparse.Namespace, results: dict, log_history) -> Path:
    """The model card of the saved folder: the held-out BLEU / chrF in the model-index, the recipe, the curves."""
    figures = []
    if any("loss" in entry or "eval_bleu" in entry for entry in log_history):
        figures.append(plot_training_curves(log_history, model_dir / "training_curves.png"))
    # the Hub id of the data where it has one (the model-index names it); SWORD's modules and local folders have none
    if args.dataset_name == "sword":
        dataset, dataset_id = "SWORD modules KJV and RV1909 (Debian's sword-text-kjv, sword-text-spavnt)", None
    else:
        dataset_id = hub_dataset_id(args.dataset_name)
        dataset = args.dataset_name if dataset_id else Path(args.dataset_name).name
    prefix = "eval" if results["eval_split"] == "validation" else "test"  # the card's split
    languages = [lang for lang in (args.source_lang, args.target_lang) if lang.isalpha() and len(lang) in (2, 3)]
    return write_model_card(
        model_dir,
        family="seq2seq",
        model_config=config,
        training_args={
            "direction": results["direction"],
            "train_pairs": results["train_pairs"],
            "train_steps": results["train_steps"],
            "train_epochs": results["train_epochs"],
            "train_minutes": results["train_minutes"],
            "batch_size": args.batch_size,
            "optimizer": "Adam(0.9, 0.98, eps 1e-9), Noam schedule",
            "warmup_steps": args.warmup_steps,
            "lr_factor": args.lr_factor,
            "label_smoothing": args.label_smoothing_factor,
            "bpe_vocab_size": args.vocab_size,
            "weights": results["weights"],
            "decoding": f"beam {args.num_beams}, length penalty {args.length_penalty}, max input length + 50",
            "bleu_signature": results["bleu_signature"],
            "chrf_signature": results["chrf_signature"],
        },
        eval_results={f"{prefix}_bleu": results["bleu"], f"{prefix}_chrf": results["chrf"]},
        dataset_name=dataset,
        dataset_id=dataset_id,
        dataset_config=args.dataset_config_name,
        figures=figures,
        language=languages or None,
    )


def resolve_resume(resume: str | None, checkpoints_dir: Path) -> str | None:
    """The checkpoint to resume from; a fresh run refuses a folder that already holds checkpoints, so that an old
    run's checkpoints never enter the average."""
    existing = checkpoint_steps(checkpoints_dir)
    if resume is None:
        if existing:
            raise ValueError(
                f"{str(checkpoints_dir)!r} already holds checkpoints {existing}: pass --resume_from_checkpoint latest "
                "to continue that run, or choose an empty --output_dir"
            )
        return None
    if resume == "latest":
        if not existing:
            raise ValueError(
                f"--resume_from_checkpoint latest: no checkpoint-<step> folder in {str(checkpoints_dir)!r}"
            )
        return str(checkpoints_dir / f"checkpoint-{existing[-1]}")
    if not (Path(resume) / "trainer_state.json").is_file():
        raise ValueError(f"--resume_from_checkpoint {resume!r} is not a Trainer checkpoint (no trainer_state.json)")
    return resume


def build_tokenizer(args: argparse.Namespace, data: DatasetDict, folder: Path, resuming: bool):
    """The shared BPE of this run: learned from the training pairs, or reloaded from `folder` when resuming."""
    if resuming:
        if not (folder / "tokenizer.json").is_file():
            raise ValueError(f"cannot resume: the run's tokenizer {str(folder / 'tokenizer.json')!r} is missing")
        return PreTrainedTokenizerFast.from_pretrained(folder)
    bpe_data = data["train"].select(range(min(args.tokenizer_train_pairs, data["train"].num_rows)))
    tokenizer = train_bpe_tokenizer(list(bpe_data["source"]) + list(bpe_data["target"]), vocab_size=args.vocab_size)
    tokenizer.save_pretrained(folder)
    return tokenizer


def build_config(args: argparse.Namespace, tokenizer) -> Seq2SeqTransformerConfig:
    special = dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
        label_smoothing=args.label_smoothing_factor,
        max_position_embeddings=max(args.max_source_length, args.max_target_length) + 64,
    )
    if args.preset:
        return Seq2SeqTransformerConfig.from_preset(args.preset, **special)
    return Seq2SeqTransformerConfig(
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim,
        dropout=args.dropout,
        **special,
    )


def bleu_metrics(tokenizer, metric):
    """`compute_metrics` for Seq2SeqTrainer with `predict_with_generate`: corpus BLEU and chrF."""

    def compute(prediction):
        predictions, labels = (np.where(ids == -100, tokenizer.pad_token_id, ids) for ids in prediction)
        hypotheses = [t.strip() for t in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [t.strip() for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        scores = metric.compute(predictions=hypotheses, references=references)
        return {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2)}

    return compute


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    set_seed(args.seed)
    output_dir = Path(args.output_dir)
    checkpoints_dir = output_dir / "trainer"
    data = load_pairs(args)
    resume = resolve_resume(args.resume_from_checkpoint, checkpoints_dir)
    logger.info(
        "%d training pairs, %d validation, %d test",
        data["train"].num_rows, data["validation"].num_rows, data["test"].num_rows,
    )  # fmt: skip

    tokenizer = build_tokenizer(args, data, output_dir / "tokenizer", resuming=resume is not None)
    config = build_config(args, tokenizer)
    model = Seq2SeqTransformerForConditionalGeneration(config)
    generation_config = Seq2SeqTransformerForConditionalGeneration.paper_generation_config(
        config, num_beams=args.num_beams, length_penalty=args.length_penalty, max_new_tokens=args.max_target_length
    )
    model.generation_config = copy.deepcopy(generation_config)
    logger.info("model: %.1fM parameters, %s", model.num_parameters() / 1e6, config.to_diff_dict())

    def encode(batch):
        return tokenizer(
            batch["source"],
            text_target=batch["target"],
            truncation=True,
            max_length=args.max_source_length,
        )

    train_set = data["train"].map(encode, batched=True, remove_columns=["source", "target"])
    validation = data["validation"].select(range(min(args.max_validation_samples, data["validation"].num_rows)))
    validation_set = validation.map(encode, batched=True, remove_columns=["source", "target"])
    metric = load_translation_metric()
    optimizer = paper_adam(model.parameters(), lr=args.lr_factor)
    scheduler = get_noam_schedule(optimizer, d_model=config.d_model, warmup_steps=args.warmup_steps)
    periodic = "steps" if args.eval_steps > 0 else "no"
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(checkpoints_dir),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.eval_batch_size,
        max_steps=args.max_steps,
        use_cpu=not torch.cuda.is_available(),
        report_to="none",
        eval_strategy=periodic,
        eval_steps=args.eval_steps if args.eval_steps > 0 else None,
        save_strategy=periodic,
        save_steps=args.eval_steps if args.eval_steps > 0 else None,
        save_total_limit=max(args.average_last, 1),
        predict_with_generate=True,
        generation_num_beams=1,  # the curve during training is greedy; the final scores use the paper's beam
        logging_steps=args.logging_steps,
        sortish_sampler=True,  # batches of similar lengths: less padding
        seed=args.seed,
        dataloader_num_workers=0,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=validation_set,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
        compute_metrics=bleu_metrics(tokenizer, metric),
        callbacks=[StopAfter(args.max_train_minutes * 60 if args.max_train_minutes else None)],
    )
    start = time.perf_counter()
    train_result = trainer.train(resume_from_checkpoint=resume)
    train_seconds = time.perf_counter() - start
    if not math.isfinite(train_result.training_loss):
        raise SystemExit("training diverged (non-finite loss)")

    # Seq2SeqTrainer's predict_with_generate evaluation fills model.generation_config in place with transformers'
    # legacy defaults (max_length=20, top_k=50, ...); saved, they would make every later generate() warn that
    # max_length and max_new_tokens are both set. Back to the configuration this run chose.
    trainer.model.generation_config = copy.deepcopy(generation_config)

    # Sec. 6.1: the average of the last checkpoints; kept only if it decodes the validation pairs better.
    candidates = {"last": trainer.model}
    averaged_from = last_checkpoints(checkpoints_dir, args.average_last) if args.average_last > 1 else []
    if len(averaged_from) >= 2:
        candidates["average"] = average_checkpoints(copy.deepcopy(trainer.model), averaged_from)

    def score(model, split) -> tuple[dict, list[str], float]:
        begin = time.perf_counter()
        predictions = translate(model, tokenizer, list(split["source"]), args)
        scores = metric.compute(predictions=predictions, references=list(split["target"]))
        return scores, predictions, time.perf_counter() - begin

    test = data["test"]
    if args.max_eval_samples:
        test = test.select(range(min(args.max_eval_samples, test.num_rows)))
    report = {}
    for name, candidate in candidates.items():
        valid_bleu = round(score(candidate, validation)[0]["bleu"], 2) if len(candidates) > 1 else None
        test_scores, predictions, decode_seconds = score(candidate, test)
        report[name] = dict(
            validation_bleu=valid_bleu,
            scores=test_scores,
            predictions=predictions,
            decode_seconds=round(decode_seconds, 1),
        )
    chosen = "last"
    if len(candidates) > 1:  # ties keep the last checkpoint
        chosen = max(report, key=lambda name: (report[name]["validation_bleu"], name == "last"))
    scores, predictions = report[chosen]["scores"], report[chosen]["predictions"]
    results = {
        "dataset": args.dataset_name if args.dataset_name != "sword" else "sword KJV->RV1909",
        "direction": f"{args.source_lang}->{args.target_lang}",
        "bleu": round(scores["bleu"], 2),
        "chrf": round(scores["chrf"], 2),
        "bleu_signature": scores["bleu_signature"],
        "chrf_signature": scores["chrf_signature"],
        "eval_split": getattr(args, "eval_split", "test"),
        "eval_sentences": test.num_rows,
        "weights": chosen if chosen == "last" else f"average of {[p.name for p in averaged_from]}",
        "candidates": {
            name: {
                "validation_bleu_beam": entry["validation_bleu"],
                "test_bleu": round(entry["scores"]["bleu"], 2),
                "test_chrf": round(entry["scores"]["chrf"], 2),
                "decode_seconds": entry["decode_seconds"],
            }
            for name, entry in report.items()
        },
        "validation_curve": [
            {"step": e["step"], "bleu_greedy": e["eval_bleu"], "chrf_greedy": e["eval_chrf"], "loss": e["eval_loss"]}
            for e in trainer.state.log_history
            if "eval_bleu" in e
        ],
        "train_pairs": data["train"].num_rows,
        "train_steps": trainer.state.global_step,
        "train_epochs": round(trainer.state.epoch or 0.0, 3),
        "train_loss": round(train_result.training_loss, 4),
        "train_minutes": round(train_seconds / 60, 2),
        "resumed_from": resume,
        "parameters_m": round(model.num_parameters() / 1e6, 2),
        "num_beams": args.num_beams,
        "length_penalty": args.length_penalty,
        "examples": [
            {"source": s, "reference": r, "prediction": p}
            for s, r, p in zip(test["source"][:8], test["target"][:8], predictions[:8])
        ],
    }
    model_dir = save_text2text_pipeline(candidates[chosen], tokenizer, output_dir / "model")
    (output_dir / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False))
    write_translation_card(model_dir, config, args, results, trainer.state.log_history)
    print(json.dumps({k: v for k, v in results.items() if k != "examples"}, indent=2))
    for example in results["examples"]:
        print(f"\nSRC  {example['source']}\nREF  {example['reference']}\nHYP  {example['prediction']}")
    return results


if __name__ == "__main__":
    main()
