"""The training input pipeline, measured without a model (issue 58): what the loaders deliver per second, and what a
streamed run holds in memory.

1. Images (`--parts images`): a folder of JPEG files (Fashion-MNIST's training images, written once at their native
   28 x 28 from Debian's dataset-fashion-mnist package, one sub-folder per class: at least 20,000), read with the DeiT
   recipe's augmentations at 224 px (the values `--recipe deit` takes at 224 px over DeiT's 300 epochs: random
   resized crop of (0.08, 1) of the area, horizontal flip, RandAugment of 2 operations at magnitude 27 of 30 on every
   image, random erasing with probability 0.25; Mixup / CutMix run in the training step, in neither loader). Ours:
   the ViT's loader as a run builds it (`ResumableLoader` over the folder read whole and as a stream; each image
   opened, cropped, flipped and augmented alone in the workers, the uint8 batch normalised and erased by
   `PixelNormalizer` in the main process, where a run does it on its device). timm's `create_loader` on the same
   folder with the same augmentations (`rand-m9-n2-p1.0`: torchvision's RandAugment applies both operations to every
   image; erasing with zeros), its prefetcher normalising and erasing in the main process. At 1 and 2 workers, the
   loaders' rounds interleaved so that the machine's load falls on all of them; each round times `--batches` batches
   of `--batch_size` after `--warmup` batches (the workers' start: "startup_s" is the time to the first batch).
2. Text (`--parts text`): seq2seq on SWORD's English-Spanish verse pairs (Debian's sword-text-kjv and
   sword-text-sparv), a byte-level BPE trained on them: the token-budget loader (`--max_tokens_per_batch`,
   `ResumableLoader` over pools of pairs) against the fixed-size batches of a data set read whole (the loop's
   DataLoader), the same worker, tokens per second (source and target, padding not counted) and the padding
   fraction (the padded tokens' share of each batch's tokens), over one epoch.
3. The cost of an exact resume (`--parts resume`): a loader started half-way through an epoch reads the epoch's
   raw examples again up to there without making them (`data.pipeline`): the seconds to its first batch, against
   the seconds to the first batch at the epoch's start and the seconds that making the skipped batches takes (at the
   rate measured in the same run), for the JPEG folder streamed, the same JPEGs in parquet shards streamed, and the
   verse pairs in token-budget pools (a resume inside a pool tokenizes the pool again), with 1 worker.
4. Memory (`--parts memory`): the peak resident memory (the run's process and its loader's workers, summed, sampled
   every 0.1 s) of `hf-vit-plus train seq2seq --streaming` reading a stream once through, for the pairs and for 10
   times as many (the pairs repeated), with the default shuffle buffer: what a stream holds does not grow with it.

    python scripts/benchmarks/bench_input_pipeline.py --output results/input_pipeline.csv
    python scripts/benchmarks/bench_input_pipeline.py --parts images --images 2000 --rounds 1   # a quick look

Measure on a quiet machine (`uptime`: the load average is written in each row); the image loaders' rounds are
interleaved, so that load that comes and goes falls on each of them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from hf_vit_plus.cli_utils import CommandParser

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
PARTS = ("images", "text", "resume", "memory")
IMAGE_SIZE = 224


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts to run: {', '.join(PARTS)}")
    parser.add_argument("--work_dir", type=Path, default=ROOT / ".cache" / "bench_input_pipeline",
                        help="where the JPEG folder and the shards are written (kept between runs)")  # fmt: skip
    parser.add_argument("--images", type=int, default=20_000, help="JPEG files in the folder")
    parser.add_argument("--workers", default="1,2", help="comma-separated DataLoader worker counts")
    parser.add_argument("--batch_size", type=int, default=64, help="images per batch")
    parser.add_argument("--batches", type=int, default=30, help="batches timed per round")
    parser.add_argument("--warmup", type=int, default=4, help="batches before the timing of a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each image loader (the median is written)")
    parser.add_argument("--pairs", type=int, default=20_000, help="SWORD verse pairs of the text and memory parts")
    parser.add_argument("--max_tokens", type=int, default=4096, help="the token budget of a batch (text part)")
    parser.add_argument("--pairs_batch", type=int, default=64, help="pairs per fixed-size batch (text, memory parts)")
    parser.add_argument("--output", type=Path, default=None, help="write the rows to this CSV (results/)")
    args = parser.parse_args(argv)
    args.part_list = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in args.part_list if part not in PARTS]
    if unknown or not args.part_list:
        parser.error(f"--parts must name some of {', '.join(PARTS)}, got {args.parts!r}")
    try:
        args.worker_counts = [int(n) for n in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers must be comma-separated integers, got {args.workers!r}")
    if min(args.worker_counts) < 1:
        parser.error(
            f"--workers must be >= 1 each (the loaders are measured with worker processes), got {args.workers!r}"
        )
    for name in ("images", "batch_size", "batches", "rounds", "pairs", "max_tokens", "pairs_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    return args


def load_average() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def row(part: str, case: str, **values) -> dict:
    """One row of the result file: every column, empty where the part has no value."""
    columns = dict.fromkeys(("workers", "images_per_s", "startup_s", "tokens_per_s", "padding_fraction", "examples",
                             "skipped_per_s", "peak_rss_mb", "vs_reference", "reference"), "")  # fmt: skip
    columns.update({key: value for key, value in values.items() if value is not None})
    return {"part": part, "case": case, **columns, "load_average": load_average()}


# ------------------------------------------------------------------------------------------------------- images
def write_jpeg_folder(folder: Path, count: int) -> Path:
    """Fashion-MNIST's first `count` training images as JPEG files (quality 90, 28 x 28 grey), one sub-folder per
    class; a folder written before with as many files is reused."""
    from PIL import Image

    from hf_vit_plus.data.fashion_mnist import FASHION_MNIST_CLASSES, load_fashion_mnist_arrays

    done = folder / f".complete-{count}"
    if done.is_file():
        return folder
    images, labels = load_fashion_mnist_arrays("train")
    if count > len(images):
        raise SystemExit(f"--images {count}: Fashion-MNIST has {len(images)} training images.")
    for index in range(count):
        target = folder / FASHION_MNIST_CLASSES[labels[index]].replace("/", "-")
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[index]).save(target / f"{index:05d}.jpg", quality=90)
    done.touch()
    return folder


def deit_values() -> SimpleNamespace:
    """What `--recipe deit` sets for a 224 px model trained for DeiT's 300 epochs."""
    from hf_vit_plus.training.recipes import DEIT_EPOCHS, RecipeContext, run_recipe_values

    context = RecipeContext(family="vit", image_size=(IMAGE_SIZE, IMAGE_SIZE), global_batch=1024, total_steps=375_000,
                            epochs=DEIT_EPOCHS, mirror_symmetric=True)  # fmt: skip
    return SimpleNamespace(**run_recipe_values("deit", context))


def our_image_loader(folder: Path, streaming: bool, workers: int, batch_size: int):
    """The ViT's loader of a run on `folder` (read whole, or as a stream) and its per-batch finish, on the CPU."""
    import torch
    from datasets import load_dataset

    from hf_vit_plus.data.image_files import undecoded
    from hf_vit_plus.data.pipeline import IndexSource, ResumableLoader, StreamSource
    from hf_vit_plus.training.augment import PixelNormalizer, erasing, example_augmentation
    from hf_vit_plus.training.tasks.vit import ImageBatches

    recipe = deit_values()
    data = load_dataset("imagefolder", data_files={"train": str(folder / "**")}, streaming=streaming)["train"]
    names = data.features["label"].names
    make = ImageBatches(example_augmentation(recipe, (IMAGE_SIZE, IMAGE_SIZE)), 3, names)
    if streaming:
        source = StreamSource(undecoded(data), seed=0, buffer_size=10_000, rank=0, world_size=1, unit_size=batch_size,
                              drop_last=True)  # fmt: skip
    else:
        source = IndexSource(undecoded(data), seed=0, rank=0, world_size=1, unit_size=batch_size, whole_batches=True)
    loader = ResumableLoader(source, make, seed=0, num_workers=workers, persistent_workers=True, prefetch_factor=2)
    half = torch.full((3, 1, 1), 0.5)
    finish = PixelNormalizer(half, half, erasing(recipe))
    return loader, lambda batch: finish(batch["pixel_values"])


def timm_image_loader(folder: Path, workers: int, batch_size: int):
    """timm's `create_loader` on `folder` with the same augmentations, its prefetcher on the CPU."""
    import torch
    from timm.data import ImageDataset, create_loader

    dataset = ImageDataset(str(folder))
    loader = create_loader(dataset, input_size=(3, IMAGE_SIZE, IMAGE_SIZE), batch_size=batch_size, is_training=True,
                           scale=(0.08, 1.0), hflip=0.5, auto_augment="rand-m9-n2-p1.0", re_prob=0.25, re_mode="const",
                           mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), num_workers=workers,
                           device=torch.device("cpu"), use_prefetcher=True, persistent_workers=True)  # fmt: skip
    return loader, lambda batch: batch[0]


def time_loader(make, workers: int, args) -> tuple[float, float]:
    """(images per second over `args.batches` batches after `args.warmup`, seconds to the first batch) of the loader
    `make(workers)` builds."""
    start = time.perf_counter()
    loader, finish = make(workers)
    iterator = iter(loader)
    finish(next(iterator))
    startup = time.perf_counter() - start
    for _ in range(args.warmup):
        finish(next(iterator))
    start = time.perf_counter()
    images = 0
    for _ in range(args.batches):
        images += finish(next(iterator)).shape[0]
    rate = images / (time.perf_counter() - start)
    del iterator, loader
    return rate, startup


def image_rows(args) -> list[dict]:
    folder = write_jpeg_folder(args.work_dir / "fashion-mnist-jpeg", args.images)
    files = sum(1 for _ in folder.rglob("*.jpg"))
    cases = {
        "timm create_loader": lambda workers: timm_image_loader(folder, workers, args.batch_size),
        "ours, read whole": lambda workers: our_image_loader(folder, False, workers, args.batch_size),
        "ours, streamed": lambda workers: our_image_loader(folder, True, workers, args.batch_size),
    }
    rows = []
    for workers in args.worker_counts:
        rates: dict[str, list[float]] = {name: [] for name in cases}
        startups: dict[str, list[float]] = {name: [] for name in cases}
        for round_ in range(args.rounds):
            order = list(cases) if round_ % 2 == 0 else list(reversed(cases))
            for name in order:
                rate, startup = time_loader(cases[name], workers, args)
                rates[name].append(rate)
                startups[name].append(startup)
                print(f"images, {workers} worker(s), {name}: {rate:.0f} images/s (startup {startup:.1f} s)",
                      flush=True)  # fmt: skip
        timm = statistics.median(rates["timm create_loader"])
        for name in cases:
            median = statistics.median(rates[name])
            rows.append(row("images", name, workers=workers, images_per_s=round(median, 1),
                            startup_s=round(statistics.median(startups[name]), 2), examples=files,
                            vs_reference=round(median / timm, 3), reference="timm create_loader"))  # fmt: skip
    return rows


# --------------------------------------------------------------------------------------------------------- text
def sword_pairs(count: int):
    """The first `count` English-Spanish verse pairs (source, target) of the SWORD Bibles."""
    from hf_vit_plus.data.sword import load_sword_parallel_dataset

    try:
        pairs = load_sword_parallel_dataset()
    except FileNotFoundError as error:
        raise SystemExit(f"The text and memory parts read SWORD's Bibles: {error}") from error
    train = pairs["train"] if "train" in pairs else pairs[next(iter(pairs))]
    return train.select(range(min(count, len(train))))


def text_rows(args) -> list[dict]:
    import torch
    from datasets import DatasetDict

    from hf_vit_plus.data.pipeline import IndexSource, ResumableLoader
    from hf_vit_plus.tokenization import train_bpe_tokenizer
    from hf_vit_plus.training.tasks.seq2seq import TOKEN_POOL_EXAMPLES, PairBatches, PairCollator

    pairs = sword_pairs(args.pairs)
    tokenizer = train_bpe_tokenizer(list(pairs["source"]) + list(pairs["target"]), vocab_size=4000)
    length = 128

    def tokenize(examples):
        inputs = tokenizer(examples["source"], truncation=True, max_length=length)
        labels = tokenizer(text_target=examples["target"], truncation=True, max_length=length)
        return {"input_ids": inputs["input_ids"], "labels": labels["input_ids"]}

    workers = args.worker_counts[0]
    loaders = {
        f"fixed batches of {args.pairs_batch} pairs": lambda: torch.utils.data.DataLoader(
            DatasetDict(train=pairs)["train"].with_transform(tokenize), batch_size=args.pairs_batch, shuffle=True,
            drop_last=True, collate_fn=PairCollator(tokenizer.pad_token_id), num_workers=workers,
            generator=torch.Generator().manual_seed(0)),
        f"token budget of {args.max_tokens}": lambda: ResumableLoader(
            IndexSource(pairs, seed=0, rank=0, world_size=1, unit_size=TOKEN_POOL_EXAMPLES, whole_batches=False),
            PairBatches(tokenizer, length, length, args.max_tokens), seed=0, num_workers=workers),
    }  # fmt: skip
    rows, reference = [], None
    for name, make in loaders.items():
        start = time.perf_counter()
        real = padded = batches = 0
        for batch in make():
            real += int(batch["attention_mask"].sum()) + int((batch["labels"] != -100).sum())
            padded += batch["input_ids"].numel() + batch["labels"].numel()
            batches += 1
        rate = real / (time.perf_counter() - start)
        reference = reference or rate
        print(f"text, {name}: {rate:.0f} tokens/s, padding {1 - real / padded:.3f}, {batches} batches", flush=True)
        rows.append(row("text", name, workers=workers, tokens_per_s=round(rate, 1),
                        padding_fraction=round(1 - real / padded, 4), examples=len(pairs),
                        vs_reference=round(rate / reference, 3), reference=next(iter(loaders))))  # fmt: skip
    return rows


# ------------------------------------------------------------------------------------------------------- resume
def write_jpeg_parquet(folder: Path, images: Path) -> Path:
    """The JPEG folder's files (bytes and class) as 8 parquet shards, written once."""
    from datasets import load_dataset

    done = folder / ".complete"
    if not done.is_file():
        data = load_dataset("imagefolder", data_files={"train": str(images / "**")})["train"]
        for index in range(8):
            data.shard(8, index, contiguous=True).to_parquet(folder / f"train-{index:05d}-of-00008.parquet")
        done.touch()
    return folder


def _to_position(make, state: dict | None) -> float:
    """Seconds from building the loader `make()` to the batch at `state` ({"epoch", "unit", "batch"}): read from the
    epoch's start batch by batch (state None: the first batch), or started there with `load_state_dict`."""
    start = time.perf_counter()
    loader = make()
    iterator = iter(loader)
    next(iterator)
    return time.perf_counter() - start


def _read_to(make, state: dict) -> float:
    """Seconds from building the loader `make()` to its batch at `state`, reading every batch before it."""
    start = time.perf_counter()
    loader = make()
    for _ in loader:
        if loader.state_dict() == state:  # the next batch is the one at `state`
            break
    return time.perf_counter() - start


def _resumed_at(make, state: dict) -> float:
    """Seconds from building the loader `make()` started at `state` to its first batch."""
    start = time.perf_counter()
    loader = make()
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def resume_rows(args) -> list[dict]:
    from datasets import load_dataset

    from hf_vit_plus.data.image_files import undecoded
    from hf_vit_plus.data.pipeline import IndexSource, ResumableLoader, StreamSource
    from hf_vit_plus.training.augment import example_augmentation
    from hf_vit_plus.training.tasks.seq2seq import TOKEN_POOL_EXAMPLES, PairBatches
    from hf_vit_plus.training.tasks.vit import ImageBatches

    images = write_jpeg_folder(args.work_dir / "fashion-mnist-jpeg", args.images)
    shards = write_jpeg_parquet(args.work_dir / "fashion-mnist-parquet", images)
    make_images = ImageBatches(example_augmentation(deit_values(), (IMAGE_SIZE, IMAGE_SIZE)), 3, None)

    def image_loader(builder, files):
        def make():
            stream = load_dataset(builder, data_files={"train": files}, streaming=True)["train"].remove_columns(
                "label"
            )
            source = StreamSource(undecoded(stream), seed=0, buffer_size=10_000, rank=0, world_size=1,
                                  unit_size=args.batch_size, drop_last=True)  # fmt: skip
            return ResumableLoader(source, make_images, seed=0, num_workers=1)

        return make

    half = args.images // 2 // args.batch_size  # half the epoch's batches
    middle = {"epoch": 0, "unit": half, "batch": 0}
    parquet = sorted(str(path) for path in shards.glob("*.parquet"))
    cases = [
        ("image folder streamed", image_loader("imagefolder", str(images / "**")), middle, half * args.batch_size),
        ("JPEGs in parquet shards streamed", image_loader("parquet", parquet), middle, half * args.batch_size),
    ]
    if sword_available():
        from hf_vit_plus.tokenization import train_bpe_tokenizer

        pairs = sword_pairs(args.pairs)
        tokenizer = train_bpe_tokenizer(list(pairs["source"]) + list(pairs["target"]), vocab_size=4000)

        def pools():
            source = IndexSource(
                pairs, seed=0, rank=0, world_size=1, unit_size=TOKEN_POOL_EXAMPLES, whole_batches=False
            )
            return ResumableLoader(source, PairBatches(tokenizer, 128, 128, args.max_tokens), seed=0, num_workers=1)

        if len(pairs) > TOKEN_POOL_EXAMPLES:  # inside the second pool: the first skipped, the second tokenized again
            inside = {"epoch": 0, "unit": 1, "batch": 5}
            cases.append(("verse pairs in token-budget pools, inside a pool", pools, inside, TOKEN_POOL_EXAMPLES))
    rows = []
    for name, make, state, skipped in cases:
        start_s = _to_position(make, None)
        read_s = _read_to(make, state)
        resume_s = _resumed_at(make, state)
        print(f"resume, {name}: first batch at {state} after {resume_s:.2f} s started there, {read_s:.2f} s read to "
              f"(the epoch's first batch: {start_s:.2f} s)", flush=True)  # fmt: skip
        rows.append(row("resume", name, workers=1, startup_s=round(resume_s, 2), examples=skipped,
                        skipped_per_s=round(skipped / max(resume_s - start_s, 1e-3), 1),
                        vs_reference=round(resume_s / read_s, 4),
                        reference="reading the batches before it"))  # fmt: skip
    return rows


def sword_available() -> bool:
    from hf_vit_plus.data.sword import DEFAULT_SWORD_ROOTS

    return any(Path(root, "mods.d").is_dir() for root in DEFAULT_SWORD_ROOTS)


# ------------------------------------------------------------------------------------------------------- memory
def _peak_rss(command: list[str], env: dict) -> tuple[float, int]:
    """(the peak of the summed resident memory of the process and its children, in MiB; its exit status)."""
    import psutil

    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        watched = psutil.Process(process.pid)
        while not done.is_set():
            try:
                total = watched.memory_info().rss + sum(child.memory_info().rss
                                                        for child in watched.children(recursive=True))  # fmt: skip
                peak = max(peak, total)
            except psutil.Error:
                pass
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = process.communicate()
    done.set()
    sampler.join()
    if process.returncode != 0:
        print(err[-3000:], file=sys.stderr)
    return peak / 2**20, process.returncode


def memory_rows(args) -> list[dict]:
    pairs = sword_pairs(args.pairs)
    rows, reference = [], None
    for times in (1, 10):
        folder = args.work_dir / f"pairs-x{times}"
        if not (folder / ".complete").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            for copy in range(times):  # one shard per copy of the pairs
                pairs.to_json(folder / f"train-{copy:05d}.jsonl")
            (folder / ".complete").touch()
        examples = len(pairs) * times
        # one pass through the stream: the held-out pairs (the first 500) and their copies are not trained on
        steps = times * (len(pairs) - 500) // args.pairs_batch
        command = [sys.executable, "-m", "hf_vit_plus.cli", "train", "seq2seq", "--streaming",
                   "--train_file", str(folder / "*.jsonl"), "--max_eval_samples", "500", "--max_steps", str(steps),
                   "--per_device_train_batch_size", str(args.pairs_batch), "--dataloader_num_workers", "1",
                   "--config_overrides", "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,"
                   "decoder_attention_heads=2,encoder_ffn_dim=64,decoder_ffn_dim=64",
                   "--max_source_length", "64", "--max_target_length", "64", "--vocab_size", "1000",
                   "--save_steps", "none", "--report_to", "none", "--write_card", "false", "--logging_steps", "500",
                   "--output_dir", str(args.work_dir / f"run-x{times}"), "--overwrite_output_dir"]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
        start = time.perf_counter()
        peak, code = _peak_rss(command, env)
        if code != 0:
            raise SystemExit(f"the streamed run over {examples} pairs failed ({code})")
        reference = reference or peak
        seconds = time.perf_counter() - start
        print(f"memory, {examples} pairs, {steps} updates: peak RSS {peak:.0f} MiB ({seconds:.0f} s)", flush=True)
        rows.append(row("memory", f"seq2seq stream read once, {times}x the pairs", workers=1, examples=examples,
                        peak_rss_mb=round(peak, 1), vs_reference=round(peak / reference, 3),
                        reference="1x the pairs"))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start: {load_average()}", flush=True)
    rows = []
    for part, run in (("images", image_rows), ("text", text_rows), ("resume", resume_rows), ("memory", memory_rows)):
        if part in args.part_list:
            rows += run(args)
    print(json.dumps(rows, indent=1))
    if args.output is not None:
        import torch
        from result_rows import write_rows

        write_rows(args.output, rows, threads=torch.get_num_threads())
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
