"""Training on data that does not fit in memory (issue 58), on one process: the loader whose batches depend on the
seed and the epoch alone (whatever its workers) and that resumes at any batch; every family trained from local shards
with --streaming; a streamed run, a token-budget run and an image-folder run stopped mid-epoch and resumed, bitwise
equal to the uninterrupted run (CPU, fp32); the token budget kept; the one-line errors. Two processes:
test_streaming_distributed.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from datasets import Dataset, load_dataset
from safetensors.torch import load_file
from torch.utils.data import get_worker_info

from hf_vit_plus.cli import main
from hf_vit_plus.data.pipeline import (
    IndexSource,
    ResumableLoader,
    StreamSource,
    example_fingerprint,
    token_budget_batches,
)
from hf_vit_plus.training.args import family_arguments
from hf_vit_plus.training.loop import train
from tests.training.shards import (
    digit_rows,
    fashion_rows,
    pair_rows,
    text_rows,
    write_image_folder,
    write_jsonl,
    write_parquet,
    write_webdataset,
)
from tests.utils import TINY_VIT_OVERRIDES, run_report

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py

TINY_SEQ2SEQ = ("d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
                "encoder_ffn_dim=64,decoder_ffn_dim=64")  # fmt: skip
TINY_LM = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,sparse_stride=8"
TINY_IMAGE_LM = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64"
QUIET = dict(report_to="none", write_card=False, logging_steps=1)


# ------------------------------------------------------------------------------------------------------ the loader
def _ids_stream(tmp_path, count=90, shards=4):
    """jsonl shards of ids (`datasets` 5.2 waits 5 s for Arrow's threads at the end of each pass over parquet shards:
    the tests that need no parquet read jsonl)."""
    folder = write_jsonl([{"id": i, "label": i % 10} for i in range(count)], tmp_path / "ids", shards)
    return load_dataset("json", data_files={"train": sorted(str(p) for p in folder.glob("*.jsonl"))},
                        streaming=True)["train"]  # fmt: skip


def _batches_of_ids(columns, rng):
    ids = torch.tensor(columns["id"])
    return [{"id": ids, "noise": torch.rand(len(ids))}]  # the unit's own random state


def _run(loader, epoch=0, state=None, stop=None):
    loader.set_epoch(epoch)
    if state is not None:
        loader.load_state_dict(state)
    seen = []
    for batch in loader:
        seen.append((batch["id"].tolist(), batch["noise"].tolist()))
        if stop is not None and len(seen) == stop:
            break
    return seen, loader.state_dict()


def test_the_loader_gives_the_same_batches_with_any_workers_and_resumes_at_any_batch(tmp_path):
    """A stream (4 parquet shards, seeded shuffle buffer) and a data set read whole: the batches of an epoch (their
    examples and their random numbers) are the same with 0, 1 and 3 workers, differ from one epoch to the next, and a
    loader started from the state after batch k gives the rest of the epoch."""
    stream = _ids_stream(tmp_path)
    sources = {
        "stream": lambda: StreamSource(stream, seed=1, buffer_size=16, rank=0, world_size=1, unit_size=8,
                                       drop_last=True),
        "whole": lambda: IndexSource(Dataset.from_dict({"id": list(range(90))}), seed=1, rank=0, world_size=1,
                                     unit_size=8, whole_batches=True),
    }  # fmt: skip
    for name, source in sources.items():
        epoch = [_run(ResumableLoader(source(), _batches_of_ids, seed=3, num_workers=n), epoch=1)[0] for n in (0, 2)]
        assert epoch[0] == epoch[1], name
        assert len(epoch[0]) == 11, name  # 90 // 8 whole batches
        ids = sorted(i for batch, _ in epoch[0] for i in batch)
        assert len(ids) == len(set(ids)) == 88, name
        assert _run(ResumableLoader(source(), _batches_of_ids, seed=3), epoch=2)[0] != epoch[0], name
        for k, (before, after) in {1: (0, 2), 6: (2, 0), 10: (0, 0)}.items():
            head, state = _run(ResumableLoader(source(), _batches_of_ids, seed=3, num_workers=before), epoch=1, stop=k)
            rest, _ = _run(ResumableLoader(source(), _batches_of_ids, seed=3, num_workers=after), epoch=1, state=state)
            assert head + rest == epoch[0], (name, k, state)


def test_workers_read_each_epoch_of_a_stream_in_that_epochs_order(tmp_path, monkeypatch):
    """One loader over three epochs with 2 workers (kept between epochs or not) gives each epoch the batches of a
    loader without workers. `datasets` keeps a stream's epoch in shared memory and sets it by adding the difference:
    two workers setting it at once left it one ahead (an epoch read in the next epoch's order), so the main process
    sets it before the workers start and a worker never writes it."""
    from datasets import IterableDataset

    real_set_epoch = IterableDataset.set_epoch

    def set_epoch(self, epoch):
        assert get_worker_info() is None, f"a DataLoader worker set the stream's epoch to {epoch}"
        real_set_epoch(self, epoch)

    monkeypatch.setattr(IterableDataset, "set_epoch", set_epoch)
    stream = _ids_stream(tmp_path, count=64)

    def loader(workers, persistent=False):
        source = StreamSource(stream, seed=2, buffer_size=16, rank=0, world_size=1, unit_size=4, drop_last=True)
        return ResumableLoader(source, _batches_of_ids, seed=3, num_workers=workers, persistent_workers=persistent)

    expected = [_run(loader(0), epoch=epoch)[0] for epoch in range(3)]
    assert expected[0] != expected[1] != expected[2]
    for persistent in (False, True):
        for _ in range(3):  # the race it guards against showed in about 2 runs in 5
            two = loader(2, persistent)
            assert [_run(two, epoch=epoch)[0] for epoch in range(3)] == expected, persistent


def test_pools_cut_by_a_token_budget_resume_inside_a_pool(tmp_path):
    stream = _ids_stream(tmp_path)

    def pools(columns, rng):
        groups = token_budget_batches([1 + i % 7 for i in columns["id"]], 12, rng)
        return [{"id": torch.tensor([columns["id"][i] for i in g]), "noise": torch.rand(1)} for g in groups]

    def loader(workers=0):
        source = StreamSource(stream, seed=0, buffer_size=8, rank=0, world_size=1, unit_size=30, drop_last=False)
        return ResumableLoader(source, pools, seed=5, num_workers=workers)

    whole, _ = _run(loader(2))
    assert sorted(i for batch, _ in whole for i in batch) == list(range(90))  # pools keep every example
    assert whole == _run(loader())[0]
    for k in (2, 9, len(whole) - 1):
        head, state = _run(loader(), stop=k)
        rest, _ = _run(loader(), state=state)
        assert head + rest == whole, (k, state)
    assert 0 < state["batch"] or state["unit"] > 0


def test_token_budget_batches_hold_every_example_once_within_the_budget_and_pad_less():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=2000)
    batches = token_budget_batches(lengths, 512, np.random.default_rng(1))
    assert sorted(i for batch in batches for i in batch) == list(range(2000))
    assert all(len(batch) * lengths[batch].max() <= 512 for batch in batches)

    def padding(groups):
        padded = sum(len(group) * lengths[group].max() for group in groups)
        return 1 - lengths.sum() / padded

    fixed = [list(range(i, min(i + 16, 2000))) for i in range(0, 2000, 16)]  # 16 examples a batch, as they come
    assert padding(batches) < 0.05 < 0.3 < padding(fixed)
    assert token_budget_batches(lengths, 512, np.random.default_rng(1)) == batches  # the generator decides
    with pytest.raises(ValueError, match="has 70 tokens, more than the budget of 64"):
        token_budget_batches([3, 70], 64, np.random.default_rng(0))


def test_a_data_set_read_whole_is_split_as_one_process_with_the_global_batch():
    data = Dataset.from_dict({"id": list(range(100))})
    one = list(IndexSource(data, seed=4, rank=0, world_size=1, unit_size=16, whole_batches=True).refs(3))
    two = [list(IndexSource(data, seed=4, rank=r, world_size=2, unit_size=8, whole_batches=True).refs(3))
           for r in (0, 1)]  # fmt: skip
    assert len(one) == 6 and [a + b for a, b in zip(*two)] == one


# ------------------------------------------------------------------------------------------------- every family
def _family_run(tmp_path, family: str) -> dict:
    """A tiny --streaming run of `family` from shards written for it (options of `family_arguments`)."""
    common = dict(streaming=True, max_steps=4, save_steps="none", output_dir=str(tmp_path / "run"), **QUIET)
    if family == "vit":
        data = write_parquet(digit_rows(240), tmp_path / "parquet", 4)
        return dict(common, train_dir=str(data), config_overrides=TINY_VIT_OVERRIDES + ",image_size=8,patch_size=2",
                    per_device_train_batch_size=16, max_eval_samples=40, dataloader_num_workers=2)  # fmt: skip
    if family == "vit-mpp":
        data = write_webdataset(fashion_rows(200), tmp_path / "wds", 2)
        return dict(common, train_dir=str(data), config_overrides=TINY_VIT_OVERRIDES + ",image_size=28,patch_size=7",
                    per_device_train_batch_size=16, max_eval_samples=32, dataloader_num_workers=1)  # fmt: skip
    if family == "seq2seq":
        data = write_parquet(pair_rows(400), tmp_path / "pairs", 3, image_column=None)
        return dict(common, train_file=str(data / "*.parquet"), config_overrides=TINY_SEQ2SEQ, max_eval_samples=40,
                    per_device_train_batch_size=16, vocab_size=300)  # fmt: skip
    if family == "sparse-lm":
        data = write_jsonl(text_rows(120), tmp_path / "texts", 3)
        return dict(common, train_file=str(data / "*.jsonl"), config_overrides=TINY_LM, block_size=64,
                    max_eval_samples=10, per_device_train_batch_size=8)  # fmt: skip
    data = write_image_folder(digit_rows(200), tmp_path / "folder")
    return dict(common, train_dir=str(data), config_overrides=TINY_IMAGE_LM, per_device_train_batch_size=16,
                max_eval_samples=32)  # fmt: skip


@pytest.mark.parametrize("family", ["vit", "vit-mpp", "seq2seq", "sparse-lm", "image-lm"])
def test_each_family_trains_from_local_shards_as_a_stream(tmp_path, family):
    """Parquet shards of the digits (vit), WebDataset tars of Fashion-MNIST (vit-mpp), parquet shards of the
    number-words pairs (seq2seq), jsonl shards of text (sparse-lm), an image folder of the digits (image-lm): each
    trains as a stream, evaluates on the examples held out of its head, and says so in its first lines."""
    options = _family_run(tmp_path, family)
    with run_report() as report:
        result = train(family_arguments(family, **options))
    assert result.global_step == 4
    if family != "sparse-lm":  # the language model is evaluated on the blocks of its held-out texts
        assert result.eval_metrics["samples"] == options["max_eval_samples"]
    lines = report.getvalue().splitlines()
    assert any(line.startswith("Data: a stream of ") and "shuffled in a buffer of 10000 examples" in line
               for line in lines), lines  # fmt: skip
    assert f"Evaluation: the first {options['max_eval_samples']} examples of the stream, held out of training" in lines
    assert "parameters, a training stream / " in report.getvalue()
    if family in ("seq2seq", "sparse-lm"):
        fractions = [entry["padding_fraction"] for entry in result.log_history if "padding_fraction" in entry]
        assert len(fractions) == 4 and all(0 <= f < 1 for f in fractions)
        assert (family == "sparse-lm") == (max(fractions) == 0.0)  # blocks are never padded
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_the_evaluation_split_comes_from_a_validation_file_and_the_first_lines_say_so(tmp_path):
    pairs = pair_rows(300)
    train_files = write_jsonl(pairs[:250], tmp_path / "train", 2)
    write_jsonl(pairs[250:], tmp_path / "valid", 1)
    validation = str(tmp_path / "valid" / "train-00000.jsonl")
    options = dict(streaming=True, max_steps=2, save_steps="none", output_dir=str(tmp_path / "run"),
                   train_file=str(train_files / "*.jsonl"), validation_file=validation, config_overrides=TINY_SEQ2SEQ,
                   per_device_train_batch_size=16, vocab_size=300, **QUIET)  # fmt: skip
    with run_report() as report:
        result = train(family_arguments("seq2seq", **options))
    assert result.eval_metrics["samples"] == 50
    assert f"Evaluation: --validation_file {validation}" in report.getvalue()


def test_held_out_examples_and_their_copies_are_never_trained_on(tmp_path):
    """The first --max_eval_samples examples of a stream are its evaluation split: the training stream leaves them
    out (by their fingerprint, so their duplicates further on too)."""
    from hf_vit_plus.training.tasks import get_task

    rows = pair_rows(120)
    rows.append(dict(rows[3], id=rows[3]["id"]))  # a copy of a held-out example at the end
    data_dir = write_jsonl(rows, tmp_path / "pairs", 2)
    args = family_arguments("seq2seq", streaming=True, max_steps=1, train_file=str(data_dir / "*.jsonl"),
                            max_eval_samples=10, output_dir=str(tmp_path / "run"), source_column="source")  # fmt: skip
    data = get_task("seq2seq").load_data(args)
    held = {row["source"] for row in data.raw["validation"]}
    assert len(held) == 10 and len(data.stream.held_out) == 10
    source = StreamSource(data.stream.dataset, seed=0, buffer_size=0, rank=0, world_size=1, unit_size=7,
                          drop_last=False, held_out=data.stream.held_out)  # fmt: skip
    trained = [s for unit in source.refs(0) for s in unit["source"]]
    assert len(trained) == 121 - 10 - 1 and not held & set(trained)  # the copy of a held-out example is left out
    assert example_fingerprint({"source": "1", "target": "one"}) != example_fingerprint({"source": "1", "target": "o"})


# ----------------------------------------------------------------------------------------------- exact resume
def _same_weights(first, second) -> None:
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    differ = [key for key in a if not torch.equal(a[key], b[key])]
    assert not differ, differ


def _stop_and_resume(tmp_path, family: str, options: dict, stop: int, workers=(2, 1, 0)) -> tuple:
    """The run uninterrupted, and stopped after update `stop` then resumed from 'latest', with the loader's workers
    changed at each start; returns the two training results and the stop's training state."""
    full = train(family_arguments(family, output_dir=str(tmp_path / "full"), dataloader_num_workers=workers[0],
                                  **options))  # fmt: skip
    stopped = train(family_arguments(family, output_dir=str(tmp_path / "split"), stop_after_steps=stop,
                                     dataloader_num_workers=workers[1], **options))  # fmt: skip
    assert stopped.interrupted and stopped.global_step == stop
    state = json.loads((stopped.last_checkpoint / "training_state.json").read_text())
    resumed = train(family_arguments(family, output_dir=str(tmp_path / "split"), resume_from_checkpoint="latest",
                                     dataloader_num_workers=workers[2], **options))  # fmt: skip
    assert resumed.global_step == full.global_step
    _same_weights(tmp_path / "full", tmp_path / "split")
    losses = [entry["loss"] for entry in full.log_history if "loss" in entry]
    assert losses == [entry["loss"] for entry in resumed.log_history if "loss" in entry]
    return full, resumed, state


def test_a_streamed_run_stopped_mid_epoch_and_resumed_equals_the_uninterrupted_run_bitwise(tmp_path):
    """The ViT on a stream of WebDataset shards with DeiT's recipe (per-image crops and RandAugment in the workers,
    Mixup / CutMix, erasing, the weights' average), dropout and gradient accumulation over 2 epochs: stopped after
    update 7 (mid-epoch), resumed with another number of workers, bitwise the run that never stopped."""
    data = write_webdataset(digit_rows(200, "PNG"), tmp_path / "wds", 4, extension="png")
    options = dict(streaming=True, train_dir=str(data), max_eval_samples=40, shuffle_buffer_size=64,
                   config_overrides=TINY_VIT_OVERRIDES + ",image_size=8,patch_size=2,hidden_dropout_prob=0.1",
                   per_device_train_batch_size=16, gradient_accumulation_steps=2, max_steps=14, recipe="deit",
                   mixed_precision="no", learning_rate=1e-3, save_steps="100", **QUIET)  # fmt: skip
    _, _, state = _stop_and_resume(tmp_path, "vit", options, stop=7)
    # 160 examples in 10 batches of 16 = 5 updates an epoch: update 7 is within the second epoch
    assert state["epoch"] == 1 and state["data_positions"] == [{"epoch": 1, "unit": 4, "batch": 0}]


def test_token_budget_batches_stay_within_the_budget_and_resume_exactly(tmp_path, monkeypatch):
    """seq2seq with --max_tokens_per_batch on the pairs read whole and streamed: no batch holds more than the
    budget (examples x the longest source or target), and a run stopped inside a pool resumes bitwise."""
    from hf_vit_plus.training.tasks.seq2seq import Seq2SeqTask

    sizes = []
    real_loss = Seq2SeqTask.training_loss

    def training_loss(self, model, batch, extras):
        sizes.append(batch["input_ids"].shape[0] * max(batch["input_ids"].shape[1], batch["labels"].shape[1]))
        return real_loss(self, model, batch, extras)

    monkeypatch.setattr(Seq2SeqTask, "training_loss", training_loss)
    pairs = write_jsonl(pair_rows(600), tmp_path / "pairs", 3)
    for streaming in (False, True):
        root = tmp_path / ("stream" if streaming else "whole")
        options = dict(train_file=str(pairs / "*.jsonl"), max_tokens_per_batch=96, max_steps=12, streaming=streaming,
                       config_overrides=TINY_SEQ2SEQ, vocab_size=300, max_eval_samples=32, save_steps="100",
                       **QUIET)  # fmt: skip
        if not streaming:
            options["validation_split_percentage"] = 5.0
        sizes.clear()
        full, _, state = _stop_and_resume(root, "seq2seq", options, stop=5, workers=(0, 2, 1))
        assert sizes and max(sizes) <= 96 and len(sizes) == 12 + 5 + 7
        assert state["data_positions"][0]["batch"] > 0  # stopped inside a pool of pairs
        padding = [entry["padding_fraction"] for entry in full.log_history if "padding_fraction" in entry]
        assert len(padding) == 12 and max(padding) < 0.5


def test_an_image_folder_is_read_per_image_in_the_workers_and_resumes_exactly(tmp_path):
    """An image folder read whole: each JPEG decoded and cropped alone in the workers (the recipe's crops at the
    model's size), the batches normalised on the device; stopped mid-epoch and resumed with other workers: bitwise."""
    folder = write_image_folder(digit_rows(120, "JPEG"), tmp_path / "folder", extension="jpg")
    options = dict(train_dir=str(folder), config_overrides=TINY_VIT_OVERRIDES + ",image_size=16,patch_size=4",
                   per_device_train_batch_size=16, max_steps=9, random_resized_crop_scale=0.5, horizontal_flip=True,
                   random_erasing_prob=0.5, save_steps="100", validation_split_percentage=10.0, **QUIET)  # fmt: skip
    full, _, state = _stop_and_resume(tmp_path, "vit", options, stop=4)
    assert state["data_positions"] == [{"epoch": 0, "unit": 4, "batch": 0}] and full.eval_metrics["samples"] == 12


# --------------------------------------------------------------------------------------------- what is refused
def run_cli(argv, capsys):
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "family, flags, message",
    [
        ("seq2seq", ["--streaming", "--train_file", "DATA"], "--streaming needs --max_steps: the length of a stream"),
        ("vit", ["--streaming", "--max_steps", "3"], "--streaming reads --dataset_name, --train_dir or --train_file"),
        (
            "seq2seq",
            ["--shuffle_buffer_size", "100", "--train_file", "DATA"],
            "--shuffle_buffer_size is the shuffle buffer of a stream: it needs --streaming",
        ),
        (
            "seq2seq",
            ["--streaming", "--train_file", "DATA", "--max_steps", "3", "--max_train_samples", "10"],
            "--max_train_samples cuts a data set read whole",
        ),
        (
            "seq2seq",
            ["--max_tokens_per_batch", "500", "--train_file", "DATA"],
            "--max_tokens_per_batch needs --max_steps",
        ),
        (
            "seq2seq",
            ["--max_tokens_per_batch", "500", "--max_steps", "3", "--per_device_train_batch_size", "4"],
            "Give either --max_tokens_per_batch",
        ),
        (
            "vit",
            ["--dataloader_prefetch_factor", "4"],
            "--dataloader_prefetch_factor sets the loader's worker processes: it needs --dataloader_num_workers >= 1",
        ),
        (
            "image-lm",
            ["--dataset", "digits", "--train_dir", "DIR"],
            "Give either --dataset (built-in images) or your own data (--train_dir), not both",
        ),
        (
            "seq2seq",
            ["--max_tokens_per_batch", "0", "--max_steps", "3"],
            "--max_tokens_per_batch must be a positive integer, got 0",
        ),
    ],
)
def test_what_streaming_and_token_budgets_refuse_is_one_line_and_exit_2(tmp_path, capsys, family, flags, message):
    write_jsonl(pair_rows(20), tmp_path / "data", 1)
    values = {"DATA": str(tmp_path / "data" / "train-00000.jsonl"), "DIR": str(tmp_path)}
    argv = ["train", family, *[values.get(flag, flag) for flag in flags], "--output_dir", str(tmp_path / "out")]
    code, lines = run_cli(argv, capsys)
    assert code == 2 and len(lines) == 1 and message in lines[0], lines


def test_a_token_budget_smaller_than_an_example_is_refused_before_training(tmp_path, capsys):
    write_jsonl(pair_rows(40), tmp_path / "data", 1)
    code, lines = run_cli(["train", "seq2seq", "--train_file", str(tmp_path / "data" / "train-00000.jsonl"),
                           "--max_tokens_per_batch", "32", "--max_steps", "2", "--output_dir", str(tmp_path / "out")],
                          capsys)  # fmt: skip
    assert code == 2 and "--max_tokens_per_batch 32 is smaller than the longest example can be" in lines[-1], lines


# ------------------------------------------------------------------------------------------- the image pipeline
def test_images_open_from_what_datasets_gives_and_augment_alone_to_the_model_size(tmp_path):
    from hf_vit_plus.data.image_files import decode_image, open_image
    from hf_vit_plus.training.augment import ExampleAugmentation

    row = digit_rows(1, "JPEG")[0]
    path = tmp_path / "a.jpg"
    path.write_bytes(row["image"])
    grey = decode_image({"bytes": row["image"], "path": None}, 1)
    assert grey.shape == (1, 8, 8) and grey.dtype == torch.uint8
    assert torch.equal(decode_image({"bytes": None, "path": str(path)}, 1), grey)
    assert torch.equal(decode_image(str(path), 3), grey.expand(3, -1, -1))
    assert decode_image(np.zeros((5, 7), dtype=np.uint8), 3).shape == (3, 5, 7)
    with pytest.raises(ValueError, match="Not an image: int"):
        open_image(3, 1)
    augment = ExampleAugmentation((24, 20), crop_scale=0.3, horizontal_flip=True, auto_augment="randaugment",
                                  auto_augment_magnitude=20)  # fmt: skip
    torch.manual_seed(0)
    first = augment(open_image(str(path), 3))
    torch.manual_seed(0)
    assert torch.equal(augment(grey.expand(3, -1, -1).contiguous()), first)  # a tensor or a PIL image, alike
    assert first.shape == (3, 24, 20) and first.dtype == torch.uint8


def test_the_device_normalises_as_the_processor_and_erases_in_place_as_the_batch_erasing():
    from hf_vit_plus.training.augment import BatchErasing, PixelNormalizer

    pixels = torch.randint(0, 256, (6, 3, 10, 12), dtype=torch.uint8)
    mean, std = torch.tensor([0.5, 0.4, 0.3]).view(-1, 1, 1), torch.tensor([0.5, 0.2, 0.25]).view(-1, 1, 1)
    torch.testing.assert_close(PixelNormalizer(mean, std)(pixels), (pixels.float() / 255 - mean) / std)
    erase = BatchErasing(0.7)
    values = torch.randn(6, 3, 10, 12)
    torch.manual_seed(1)
    masked = erase(values)
    torch.manual_seed(1)
    in_place = erase.erase_(values.clone())
    assert torch.equal(masked, in_place) and (masked == 0).any()


@pytest.fixture
def built_loaders(monkeypatch):
    """The settings of every DataLoader built while the test runs, read from the loader once built (whoever built it:
    the loop, `ResumableLoader`, Accelerate's `prepare`)."""
    built = []
    real = torch.utils.data.DataLoader.__init__

    def recorded(self, *args, **kwargs):
        real(self, *args, **kwargs)
        built.append((self.num_workers, self.persistent_workers, self.prefetch_factor, self.pin_memory))

    monkeypatch.setattr(torch.utils.data.DataLoader, "__init__", recorded)
    return built


LOADER_FLAGS = ["--dataloader_num_workers", "2", "--dataloader_persistent_workers", "true",
                "--dataloader_prefetch_factor", "3"]  # fmt: skip


def test_every_loader_with_workers_gets_the_plans_settings(tmp_path, built_loaders):
    """The training and evaluation loaders of a run, on each data path (a data set read whole through a DataLoader;
    a stream through `ResumableLoader`, as a token budget and images from files are), with the --dataloader_*
    settings the plan decided (the plan printed them while the evaluation loaders kept torch's defaults)."""
    argv = ["train", "vit", "--output_dir", str(tmp_path / "vit"), "--config_overrides", TINY_VIT_OVERRIDES,
            "--max_train_samples", "32", "--max_eval_samples", "16", "--per_device_train_batch_size", "16",
            "--max_steps", "1", "--save_steps", "none", "--report_to", "none", "--write_card", "false", "--use_cpu",
            *LOADER_FLAGS]  # fmt: skip
    assert main(argv) == 0
    pairs = write_parquet(pair_rows(60), tmp_path / "pairs", 2, image_column=None)
    argv = ["train", "seq2seq", "--output_dir", str(tmp_path / "stream"), "--train_file", str(pairs / "*.parquet"),
            "--streaming", "--config_overrides", TINY_SEQ2SEQ, "--vocab_size", "300", "--max_eval_samples", "8",
            "--per_device_train_batch_size", "8", "--max_steps", "1", "--save_steps", "none", "--report_to", "none",
            "--write_card", "false", "--use_cpu", *LOADER_FLAGS]  # fmt: skip
    assert main(argv) == 0
    with_workers = [loader for loader in built_loaders if loader[0]]
    # per run: the training and the evaluation loader, and Accelerate's copies of those it prepares
    assert len(with_workers) >= 4, built_loaders
    assert set(with_workers) == {(2, True, 3, False)}, built_loaders


def test_the_loader_settings_are_decided_where_not_given(tmp_path):
    from hf_vit_plus.training.plan import preview_plan
    from hf_vit_plus.training.tasks import get_task

    folder = write_parquet(pair_rows(60), tmp_path / "pairs", 2, image_column=None)
    common = dict(train_file=str(folder / "*.parquet"), streaming=True, max_steps=3, max_eval_samples=10,
                  output_dir=str(tmp_path / "run"))  # fmt: skip
    plan = preview_plan(family_arguments("seq2seq", **common), get_task("seq2seq"))
    data = plan.data
    assert (data.streaming, data.shards, data.split, data.num_workers, data.prefetch_factor) == (True, 2, "shards", 0,
                                                                                                 None)  # fmt: skip
    assert plan.updates_per_epoch is None and plan.num_epochs is None
    plan = preview_plan(family_arguments("seq2seq", dataloader_num_workers=2, **common), get_task("seq2seq"))
    assert (plan.data.persistent_workers, plan.data.prefetch_factor, plan.data.pin_memory) == (True, 2, False)
    plan = preview_plan(family_arguments("seq2seq", dataloader_num_workers=2, dataloader_persistent_workers=False,
                                         dataloader_prefetch_factor=4, **common), get_task("seq2seq"))  # fmt: skip
    assert (plan.data.persistent_workers, plan.data.prefetch_factor) == (False, 4)
    plan = preview_plan(family_arguments("sparse-lm", max_tokens_per_batch=200, block_size=64, max_steps=2,
                                         output_dir=str(tmp_path / "lm")), get_task("sparse-lm"))  # fmt: skip
    assert plan.optimization.per_device_train_batch_size == 3 and plan.chosen_by["per_device_train_batch_size"] == (
        "--max_tokens_per_batch"
    )
    assert plan.updates_per_epoch is not None  # blocks of one length: an epoch's batches are known
