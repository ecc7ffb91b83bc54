"""A ViT on small data (issue 26): the rows of the comparison, each trained by `hf-vit-plus train` on Fashion-MNIST
(60,000 training images) for the same training time, each evaluated on the full 10,000-image test set.

Rows, in the order they are trained (the CNN first: it is the teacher of the distilled row):

- `cnn`: a small ResNet (transformers' `ResNetForImageClassification`, `--model_type resnet`, about 0.7M
  parameters) with the DeiT recipe: the inductive-bias baseline and the teacher;
- `vit-plain`: the ViTPlus from scratch, `--recipe none` (no augmentation, no EMA, the model's own loss);
- `vit-deit`: the same ViT with `--recipe deit`;
- `vit-deit-distilled`: `--recipe deit --teacher <cnn>` (DeiT's distillation token, hard labels from the CNN);
- `vit-mpp-then-deit`: masked patch prediction (`train vit-mpp`) for `--mpp_share` of the row's time, then
  `train vit --recipe deit --model_name_or_path <the pre-trained encoder>` for the rest (equal total time);
- `transformers-vit-deit`: transformers' `ViTForImageClassification` of the same shape (`--model_type vit`) with
  the recipe.

Equal time, not equal updates: each run is first timed for `--calibration_steps` updates (three times: the last two
have the full run's recipe and 1 and 3 times the updates, which separates an update's time from a compilation's,
`calibrated_steps`), and then trained for as many updates as fit `--minutes_per_row`
(the schedule, the recipe's scaling and the EMA's horizon follow that length), with `--max_train_minutes` set to the
row's minutes: where the machine runs slower than in the probes (a shared machine's speed can vary within
minutes), the run ends when its minutes are spent, its schedule following the clock, with fewer updates than
calibrated. "minutes" in the table is the measured training time of the final run(s), evaluation excluded. The
machine's load moves the timing; run it on an otherwise idle machine for numbers to compare.

    python scripts/benchmarks/bench_small_data.py --minutes_per_row 45 --output_dir runs/small-data   # the issue's
    python scripts/benchmarks/bench_small_data.py --minutes_per_row 2 --output_dir /tmp/small-data    # a quick look
    python scripts/benchmarks/bench_small_data.py --time_augmentation   # the recipe's augmentation per batch, timed
    python scripts/benchmarks/bench_small_data.py --time_precision --threads 2   # fp32 against bf16 autocast
    python scripts/benchmarks/bench_small_data.py --rows vit-deit --threads 2 --vit_flags torch_compile=True \
        --vit_config_overrides patch_size=4,hidden_size=128,intermediate_size=256   # one row, compiled
    python scripts/benchmarks/bench_small_data.py --plot_only --output_dir runs/small-data \
        --output runs/small-data/rows.csv   # a finished run's rows as a result file

`--time_augmentation` trains nothing: it times the recipe's augmentation of a batch of Fashion-MNIST-sized images on
one thread, torchvision's transforms image by image against the batched `ImageAugmentation`,
`BatchErasing` and `BatchAutoAugment`, and prints the table. `--time_precision` trains nothing either: it times a
training update of the ViT (and two wider ones) in fp32 and under bf16 autocast, which `--recipe deit` takes where
the CPU multiplies bf16 natively. With `--output`, each writes its rows as well, with the columns of
`results/small_data_augmentation.csv` and `results/small_data_update_time.csv`.

Each row runs in its own process (`hf_vit_plus.training.train` keeps Accelerate's process-wide state); every model
folder stays in `--output_dir/ROW`, with its card, `results.json` holds the table and `curves.png` the training loss of
every row against its training minutes (`--plot_only` redraws both from `results.json`). `--output PATH` writes the
table's rows to a result file (`result_rows.write_rows`: one row per trained row, with the command, the date, the
versions, the device and the threads), the columns of `results/small_data.csv`; the file is replaced, so append
its rows to the committed file, which keeps the rows of many runs.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hf_vit_plus.cli_utils import CommandParser

ROWS = ("cnn", "vit-plain", "vit-deit", "vit-deit-distilled", "vit-mpp-then-deit", "transformers-vit-deit")


def row_runs(
    row: str, output_dir: Path, vit_config_overrides: str | None = None, vit_flags: dict | None = None
) -> list[tuple[str, dict]]:
    """(family, train flags) of each run of a row, in order; the last one is the classifier the row reports.
    `vit_config_overrides` (e.g. "patch_size=7") shapes every fresh ViT of the row (not the CNN, nor a model loaded
    from the row's pre-training); `vit_flags` (e.g. {"auto_augment": "none"}) are `train` flags of the row's
    classifier run (not the CNN's)."""
    runs = _row_runs(row, output_dir)
    if row == "cnn":
        return runs
    for _, flags in runs:
        if vit_config_overrides and "model_name_or_path" not in flags:
            flags["config_overrides"] = vit_config_overrides
    if vit_flags:
        runs[-1][1].update(vit_flags)
    return runs


def row_label(row: str, args) -> str:
    """The row's name in the table, with what `--vit_config_overrides` / `--vit_flags` changed."""
    changes = [args.vit_config_overrides] if getattr(args, "vit_config_overrides", None) else []
    changes += [f"{k}={v}" for k, v in (getattr(args, "vit_flags", None) or {}).items()]
    return f"{row} ({', '.join(changes)})" if changes and row != "cnn" else row


def parse_flags(items: list[str] | None) -> dict:
    """["auto_augment=none", "mixup_alpha=0", ...] -> {"auto_augment": "none", "mixup_alpha": 0, ...}: numbers and
    booleans as Python values (`family_arguments` takes typed values, as the command line gives them)."""
    flags = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--vit_flags takes KEY=VALUE items, got {item!r}")
        try:
            flags[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            flags[key] = value
    return flags


def _row_runs(row: str, output_dir: Path) -> list[tuple[str, dict]]:
    cnn = str(output_dir / "cnn")
    if row == "cnn":
        return [("vit", dict(model_type="resnet", recipe="deit"))]
    if row == "vit-plain":
        return [("vit", dict(recipe="none"))]
    if row == "vit-deit":
        return [("vit", dict(recipe="deit"))]
    if row == "vit-deit-distilled":
        return [("vit", dict(recipe="deit", teacher=cnn))]
    if row == "vit-mpp-then-deit":
        encoder = str(output_dir / "vit-mpp-then-deit-pretrain")
        return [
            ("vit-mpp", dict(recipe="deit", output_dir=encoder)),
            ("vit", dict(recipe="deit", model_name_or_path=encoder)),
        ]
    if row == "transformers-vit-deit":
        return [("vit", dict(model_type="vit", recipe="deit"))]
    raise ValueError(f"Unknown row {row!r}; expected one of {ROWS}.")


def run_once(family: str, flags: dict, threads: int) -> dict:
    """One `train` call in a fresh process; its result as a dict."""
    code = (
        "import json, sys, torch\n"
        "from hf_vit_plus.training.args import family_arguments\n"
        "from hf_vit_plus.training.loop import train\n"
        f"torch.set_num_threads({threads})\n"
        "family, flags = json.loads(sys.argv[1])\n"
        "result = train(family_arguments(family, **flags))\n"
        "print('RESULT ' + json.dumps({'seconds': result.train_seconds, 'updates': result.global_step,\n"
        "      'metrics': result.eval_metrics}))\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TQDM_DISABLE="1")
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps([family, flags])], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{family} {flags} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def common_flags(args, output: Path, steps: int, eval_samples: int | None) -> dict:
    return dict(
        output_dir=str(output),
        dataset_name="fashion-mnist",
        per_device_train_batch_size=args.batch_size,
        max_steps=steps,
        eval_steps=steps + 1,  # evaluate once, at the end
        max_eval_samples=eval_samples,
        save_steps="none",
        report_to="none",
        logging_steps=max(1, steps // 20),
        seed=args.seed,
    )


def calibrated_steps(family: str, flags: dict, args, output_dir: Path, seconds: float) -> int:
    """The updates of `family`'s run with `flags` that fit `seconds` on the machine it runs on, from three short timed
    runs (a handful of test images). The first is a run of `--calibration_steps` updates; the next two are the first's
    estimate of the full run, stopped after `--calibration_steps` and after three times as many
    (`--stop_after_steps`), so that the recipe scales its augmentation to the full run's length as in the final run:
    RandAugment on t = epochs / 300 of the images (0.1% of them in a 0.3-epoch probe, 27% in an 82-epoch run), so a
    short probe alone under-estimates a long run's time per update. A line through the last two separates the time of
    an update from the time every run spends once (`--torch_compile`'s compilation), which a probe's mean time per
    update would count once per update."""
    steps = args.calibration_steps
    probe = dict(common_flags(args, output_dir / ".calibration", steps, 64), **flags, write_card=False)
    timed = run_once(family, probe, args.threads)
    steps = max(steps, int(seconds / (timed["seconds"] / max(1, timed["updates"]))))
    points = []
    for stop in (args.calibration_steps, 3 * args.calibration_steps):  # the estimated full run, stopped early
        probe = dict(common_flags(args, output_dir / ".calibration", steps, 64), **flags, write_card=False)
        timed = run_once(family, dict(probe, stop_after_steps=stop), args.threads)
        points.append((timed["updates"], timed["seconds"]))
    (short, short_seconds), (long, long_seconds) = points
    per_update = (long_seconds - short_seconds) / max(1, long - short)
    if per_update <= 0:  # the machine's load moved more than the extra updates took: the longer probe's mean
        per_update = long_seconds / max(1, long)
    once = min(max(0.0, short_seconds - short * per_update), seconds / 2)
    return max(args.calibration_steps, int((seconds - once) / per_update))


def train_row(row: str, args, output_dir: Path) -> dict:
    runs = row_runs(row, output_dir, args.vit_config_overrides, args.vit_flags)
    budget = args.minutes_per_row * 60
    shares = [args.mpp_share, 1 - args.mpp_share] if len(runs) == 2 else [1.0]
    updates, metrics, outputs, seconds = [], {}, [], []
    for (family, flags), share in zip(runs, shares):
        output = Path(flags.pop("output_dir", output_dir / row))
        steps = calibrated_steps(family, flags, args, output_dir, budget * share)
        # the calibrated updates, or the row's minutes where the machine runs slower than the probes did
        final = dict(common_flags(args, output, steps, None), **flags, max_train_minutes=budget * share / 60)
        result = run_once(family, final, args.threads)
        seconds.append(result["seconds"])
        outputs.append(str(output))
        updates.append(result["updates"])
        metrics = result["metrics"]
        print(f"  {row} ({family}): {result['updates']} updates in {result['seconds'] / 60:.1f} min", flush=True)
    return {
        "row": row_label(row, args),
        "name": row,
        "model": row_model(row, args.vit_config_overrides),
        "config_overrides": args.vit_config_overrides if row != "cnn" else None,
        "recipe": runs[-1][1].get("recipe", "none"),
        "flags": " ".join(f"{k}={v}" for k, v in (args.vit_flags or {}).items()) if row != "cnn" else "",
        "budget_minutes": args.minutes_per_row,
        "test_accuracy": metrics.get("accuracy"),
        "minutes": sum(seconds) / 60,
        "updates": updates,
        "epochs": [u * args.batch_size / 60000 for u in updates],
        "metrics": metrics,
        "outputs": outputs,
        "seconds": seconds,
    }


def row_model(row: str, vit_config_overrides: str | None = None) -> str:
    """What a row trains: "ResNet", "transformers ViT", "ViTPlus", or "ViTPlus hybrid" where the overrides give the
    ViT a convolutional stem (`conv_stem_layers`)."""
    if row == "cnn":
        return "ResNet"
    model = "transformers ViT" if row == "transformers-vit-deit" else "ViTPlus"
    fields = dict(item.partition("=")[::2] for item in (vit_config_overrides or "").split(",") if item)
    return model + " hybrid" if fields.get("conv_stem_layers", "0").strip() not in ("", "0") else model


RESULT_COLUMNS = (
    "row", "model", "config_overrides", "recipe", "flags", "budget_minutes", "minutes", "updates", "epochs",
    "test_accuracy_pct", "ema_last_accuracy_pct", "cls_head_accuracy_pct", "distillation_head_accuracy_pct", "note",
)  # fmt: skip


def result_rows(results: list[dict], args) -> list[dict]:
    """The table's rows as result-file rows (the columns of `RESULT_COLUMNS`; `result_rows.write_rows` adds the run's
    context): accuracies in percent, minutes of training, updates and epochs of each run of the row joined by " + ".
    A results.json written before the rows kept their name and settings gives them from `args`."""
    rows = []
    for r in results:
        name = r.get("name") or r["row"].split(" (")[0]
        overrides = r.get("config_overrides", None if name == "cnn" else args.vit_config_overrides)
        flags = r.get("flags")
        if flags is None:
            flags = "" if name == "cnn" else " ".join(f"{k}={v}" for k, v in (args.vit_flags or {}).items())
        metrics = r.get("metrics") or {}

        def percent(key, metrics=metrics):
            return f"{100 * metrics[key]:.2f}" if metrics.get(key) is not None else ""

        rows.append({
            "row": name,
            "model": r.get("model") or row_model(name, overrides),
            "config_overrides": overrides or "",
            "recipe": r.get("recipe") or "",
            "flags": flags,
            "budget_minutes": f"{r.get('budget_minutes', args.minutes_per_row):g}",
            "minutes": f"{r['minutes']:.2f}",
            "updates": " + ".join(str(u) for u in r["updates"]),
            "epochs": " + ".join(f"{e:.2f}" for e in r["epochs"]),
            "test_accuracy_pct": f"{100 * r['test_accuracy']:.2f}",
            "ema_last_accuracy_pct": percent("online_accuracy"),
            "cls_head_accuracy_pct": percent("cls_head_accuracy"),
            "distillation_head_accuracy_pct": percent("distillation_head_accuracy"),
            "note": "",
        })  # fmt: skip
    return rows


def write_result_rows(results: list[dict], args) -> Path:
    """`result_rows` written to `args.output` by `result_rows.write_rows`, with `args.threads` as the threads."""
    return _write_rows(args.output, result_rows(results, args), threads=args.threads)


def _write_rows(path: Path, rows: list[dict], threads: int | None) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from result_rows import write_rows

    return write_rows(path, rows, threads=threads)


def loss_curve(result: dict, output_dir: Path) -> tuple[list[float], list[float]]:
    """(training minutes, training loss) of a row's classifier run, from its `log_history.json`; a pre-training run
    before it (the MPP row) shifts it by its minutes. Minutes are the run's mean time per update times the update."""
    outputs = result.get("outputs") or [str(output_dir / result["row"])]
    seconds = result.get("seconds") or [result["minutes"] * 60]
    history = json.loads((Path(outputs[-1]) / "log_history.json").read_text())
    per_update = seconds[-1] / max(1, result["updates"][-1])
    offset = sum(seconds[:-1])
    points = [(e["step"], e["loss"]) for e in history if "loss" in e and "step" in e]
    return [(offset + step * per_update) / 60 for step, _ in points], [loss for _, loss in points]


def plot_curves(results: list[dict], output_dir: Path, path: Path) -> Path:
    """Training loss against training minutes, one line per row (each point the mean loss of a twentieth of the run,
    the rows' `logging_steps`), each labelled with its test accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.8))
    colours = plt.get_cmap("tab10" if len(results) <= 10 else "tab20")
    for i, r in enumerate(results):
        minutes, losses = loss_curve(r, output_dir)
        ax.plot(minutes, losses, color=colours(i), label=f"{r['row']} ({100 * r['test_accuracy']:.2f}% test)")
    ax.set_xlabel("training minutes")
    ax.set_ylabel("training loss (mean of each logging window)")
    ax.set_yscale("log")
    ax.set_title("Fashion-MNIST: training loss against training time")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot: the lines stay visible
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def augmentation_timing(batch: int = 128, repeats: int = 20, size: int = 28) -> list[dict]:
    """Rows (the columns of `results/small_data_augmentation.csv`: step, images, ms_per_batch, x_batched, note): the
    milliseconds per batch of `batch` grey `size` x `size` uint8 images on one thread, for the recipe's crop (scale
    0.83, its value at 18 epochs), flip and erasing (0.06), image by image with torchvision against batched, and
    RandAugment (2 operations, magnitude 6) image by image against batched (`BatchAutoAugment`), on every image and on
    the share of them that the recipe gives a 90-epoch run. `augmentation_table` prints them."""
    return _on_threads(1, _augmentation_rows, batch, repeats, size)


def augmentation_table(rows: list[dict], batch: int = 128, repeats: int = 20, size: int = 28) -> str:
    """`augmentation_timing`'s rows as a markdown table, each time also as a multiple of the batched crop's."""
    lines = [f"Augmentation of a batch of {batch} uint8 {size} x {size} images, one thread, mean of {repeats}", "",
             "| step | ms per batch | x batched |", "|---|---|---|"]  # fmt: skip
    for row in rows:
        share = f", on {row['images']} of the images" if row["images"] != str(batch) else ""
        lines.append(f"| {row['step']}{share} | {row['ms_per_batch']} | {row['x_batched']} |")
    return "\n".join(lines)


def _on_threads(threads: int | None, function, *args):
    """`function(*args)` on `threads` torch threads (None: the caller's), the caller's setting restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        return function(*args)
    finally:
        torch.set_num_threads(before)


def _mean_ms(step, repeats: int, warmup: int = 1) -> float:
    """Milliseconds per call of `step`, the mean of `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats * 1000


def _augmentation_rows(batch: int, repeats: int, size: int) -> list[dict]:
    import torch
    from torchvision.transforms import v2

    from hf_vit_plus.training.augment import BatchAutoAugment, BatchErasing, ImageAugmentation

    torch.manual_seed(0)
    pixels = torch.randint(0, 256, (batch, 1, size, size), dtype=torch.uint8)
    crop_flip = v2.Compose([v2.RandomResizedCrop((size, size), scale=(0.83, 1.0), antialias=True),
                            v2.RandomHorizontalFlip()])  # fmt: skip
    erase = v2.RandomErasing(p=0.06, value=0.0)
    batched, batched_erase = ImageAugmentation((size, size), crop_scale=0.83, horizontal_flip=True), BatchErasing(0.06)
    randaugment = v2.RandAugment(num_ops=2, magnitude=6)
    batched_randaugment = BatchAutoAugment(randaugment)

    def per_image():
        images = torch.stack([crop_flip(image) for image in pixels]).float()
        return torch.stack([erase(image) for image in images])

    def whole_batch():
        return batched_erase(batched(pixels).float())

    share = round(0.3 * batch)  # the recipe's t at 90 epochs
    timed = [
        ("crop + flip + erasing, torchvision image by image", batch, _mean_ms(per_image, repeats)),
        ("crop + flip + erasing, batched (ImageAugmentation, BatchErasing)", batch, _mean_ms(whole_batch, repeats)),
        ("RandAugment (2 ops, magnitude 6), torchvision image by image", batch,
         _mean_ms(lambda: [*map(randaugment, pixels)], repeats)),
        ("RandAugment (2 ops, magnitude 6), batched (BatchAutoAugment)", batch,
         _mean_ms(lambda: batched_randaugment(pixels), repeats)),
        ("RandAugment (2 ops, magnitude 6), batched (BatchAutoAugment)", share,
         _mean_ms(lambda: batched_randaugment(pixels[:share]), repeats)),
        ("RandAugment (2 ops, magnitude 6), torchvision image by image", share,
         _mean_ms(lambda: [*map(randaugment, pixels[:share])], repeats)),
    ]  # fmt: skip
    unit = timed[1][2]  # the batched crop, flip and erasing
    note = f"mean of {repeats} batches of {size} x {size} uint8 images"
    return [dict(step=step, images=str(images), ms_per_batch=f"{ms:.1f}", x_batched=f"{ms / unit:.1f}", note=note)
            for step, images, ms in timed]  # fmt: skip


UPDATE = "bare training update (forward, backward, AdamW)"  # what `--time_precision` times
# (name, config fields over the built-in Fashion-MNIST ViT) of the shapes `--time_precision` measures
PRECISION_SHAPES = (
    ("width 96 (the built-in shape, 456k parameters)", {}),
    ("width 128, MLP 256 (805k)", dict(hidden_size=128, intermediate_size=256)),
    ("width 192, MLP 384 (1.8M)", dict(hidden_size=192, intermediate_size=384)),
)


def precision_timing(batch: int = 128, repeats: int = 20, threads: int | None = None) -> tuple[str, list[dict]]:
    """A table and its rows: milliseconds per training update (forward, backward, AdamW step; random pixels) of the
    built-in Fashion-MNIST ViT and wider ones, fp32 against bf16 autocast (what `--recipe deit` trains in where the
    CPU's bf16 products are native, `recipes.recipe_mixed_precision`), side by side on the CPU it runs on. The rows
    have the columns of `results/small_data_update_time.csv`, one per shape and precision."""
    return _on_threads(threads, _precision_table, batch, repeats)


def _precision_table(batch: int, repeats: int) -> tuple[str, list[dict]]:
    import torch

    from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification
    from hf_vit_plus.models.compat import cpu_has_native_bf16_products
    from hf_vit_plus.training.tasks.vit import FASHION_VIT_CONFIG

    torch.manual_seed(0)
    pixels, labels = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def per_update(model, dtype) -> float:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                loss = model(pixel_values=pixels, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        return _mean_ms(step, repeats, warmup=3)

    lines = [
        f"Training update of a batch of {batch} Fashion-MNIST-sized images, {torch.get_num_threads()} thread(s), "
        f"mean of {repeats}; CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16 products: "
        f"{cpu_has_native_bf16_products()}",
        "",
        "| ViT (7 x 7 patches, 6 blocks) | fp32 ms | bf16 autocast ms | fp32 / bf16 |",
        "|---|---|---|---|",
    ]
    rows = []
    for name, fields in PRECISION_SHAPES:
        config = ViTPlusConfig(**{**FASHION_VIT_CONFIG, **fields}, num_labels=10)
        models = [ViTPlusForImageClassification(config) for _ in range(2)]
        fp32, bf16 = (per_update(model, dtype) for model, dtype in zip(models, ("fp32", "bf16")))
        lines.append(f"| {name} | {fp32:.1f} | {bf16:.1f} | {fp32 / bf16:.2f} |")
        common = dict(model="ViTPlus", config_overrides=",".join(f"{k}={v}" for k, v in fields.items()),
                      parameters=str(models[0].num_parameters()), what=UPDATE)  # fmt: skip
        note = f"batch {batch}, mean of {repeats}, CPU capability {torch.backends.cpu.get_cpu_capability()}"
        rows += [dict(common, precision="fp32", ms=f"{fp32:.1f}", fp32_over_bf16="", note=note),
                 dict(common, precision="bf16 autocast", ms=f"{bf16:.1f}", fp32_over_bf16=f"{fp32 / bf16:.2f}",
                      note=note)]  # fmt: skip
    return "\n".join(lines), rows


def table(results: list[dict], args) -> str:
    lines = [
        f"Fashion-MNIST, full test set (10,000 images); {args.minutes_per_row:g} training minutes per row, batch "
        f"{args.batch_size}, {args.threads} thread(s)",
        "",
        "| row | test accuracy | training minutes | updates | epochs |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        updates = " + ".join(str(u) for u in r["updates"])
        epochs = " + ".join(f"{e:.2f}" for e in r["epochs"])
        lines.append(f"| {r['row']} | {100 * r['test_accuracy']:.2f}% | {r['minutes']:.1f} | {updates} | {epochs} |")
    for r in results:
        extra = {k: v for k, v in r["metrics"].items() if "head_accuracy" in k or k == "online_accuracy"}
        if extra:
            lines.append(f"- {r['row']}: " + ", ".join(f"{k} {100 * v:.2f}%" for k, v in extra.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes_per_row", type=float, default=45.0, help="training time of each row")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="rows to train (cnn first)")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/small-data"), help="models and results")
    parser.add_argument("--batch_size", type=int, default=128, help="training batch")
    parser.add_argument("--mpp_share", type=float, default=0.5, help="share of the MPP row's time spent pre-training")
    parser.add_argument("--calibration_steps", type=int, default=15, help="updates timed before each run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run (1: cores shared)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run")
    parser.add_argument(
        "--vit_config_overrides",
        help="config fields of every fresh ViT of the rows, e.g. 'patch_size=7' (7 x 7 patches: 16 tokens, not 49)",
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="write the table's rows to this CSV (results/small_data*.csv)"
    )
    parser.add_argument(
        "--plot_only", action="store_true", help="train nothing: print the table and curves of OUTPUT_DIR/results.json"
    )
    parser.add_argument(
        "--vit_flags", nargs="+", metavar="KEY=VALUE", help="train flags of the ViT rows, e.g. auto_augment=none"
    )
    parser.add_argument(
        "--time_augmentation", action="store_true", help="train nothing: time the augmentation of a batch and exit"
    )
    parser.add_argument(
        "--time_precision",
        action="store_true",
        help="train nothing: time a training update of the ViT in fp32 and bf16 autocast (--threads) and exit",
    )
    args = parser.parse_args(argv)
    if args.time_augmentation:
        rows = augmentation_timing(args.batch_size)
        print(augmentation_table(rows, args.batch_size))
        if args.output:
            print(f"wrote {_write_rows(args.output, rows, threads=1)}")
        return
    if args.time_precision:
        text, rows = precision_timing(args.batch_size, threads=args.threads)
        print(text)
        if args.output:
            print(f"wrote {_write_rows(args.output, rows, threads=args.threads)}")
        return
    try:
        args.vit_flags = parse_flags(args.vit_flags)
    except ValueError as error:
        parser.error(str(error))
    if args.plot_only:
        results = json.loads((args.output_dir / "results.json").read_text())
        print(table(results, args))
        print(f"curves: {plot_curves(results, args.output_dir, args.output_dir / 'curves.png')}")
        if args.output:
            print(f"wrote {write_result_rows(results, args)}")
        return
    if "vit-deit-distilled" in args.rows and "cnn" not in args.rows and not (args.output_dir / "cnn").is_dir():
        parser.error("the distilled row needs the CNN teacher: add the 'cnn' row (or train it into OUTPUT_DIR/cnn)")
    if not 0 < args.mpp_share < 1:
        parser.error(f"--mpp_share must be in (0, 1), got {args.mpp_share}")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    order = sorted(args.rows, key=ROWS.index)
    results = []
    start = time.time()
    for row in order:
        print(f"{row} ...", flush=True)
        results.append(train_row(row, args, args.output_dir))
        (args.output_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results, args))
    print(f"curves: {plot_curves(results, args.output_dir, args.output_dir / 'curves.png')}")
    print(f"(wall time {(time.time() - start) / 60:.1f} min, calibration and evaluation included)")
    if args.output:
        print(f"wrote {write_result_rows(results, args)}")


if __name__ == "__main__":
    main()
