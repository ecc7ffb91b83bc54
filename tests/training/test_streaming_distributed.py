"""Streams on two processes (issue 58): each example read by exactly one process in an epoch, whether the shards
divide between the processes or not; every family trains from local shards; a streamed run with token budgets
stopped mid-epoch and resumed (each process at its own place in its own part) equals the run that never stopped.

Two processes are forked by `accelerate.debug_launcher` (tests/utils.py: `launch_processes`), as in
test_training_distributed.py; like it, this file runs in the Makefile's first, distributed pass (no autograd in the
parent process before the fork)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.training.shards import digit_rows, pair_rows, text_rows, write_image_folder, write_jsonl, write_parquet
from tests.utils import TINY_VIT_OVERRIDES, launch_processes

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")  # tests/conftest.py

TINY = {
    "vit": TINY_VIT_OVERRIDES + ",image_size=8,patch_size=2",
    "vit-mpp": TINY_VIT_OVERRIDES + ",image_size=8,patch_size=2",
    "seq2seq": "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64",
    "sparse-lm": "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,sparse_stride=8",
    "image-lm": "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64",
}
QUIET = dict(report_to="none", write_card=False, logging_steps=1)


def _read_an_epoch(folder: str, shards: int) -> None:
    """This process's part of an epoch of the stream of `shards` parquet shards, through the loader the run uses
    (2 workers): the ids it read, written to rank<N>.json."""
    from datasets import load_dataset

    from hf_vit_plus.data.pipeline import ResumableLoader, StreamSource

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()  # the launcher's group
    files = sorted(str(path) for path in Path(folder, f"shards{shards}").glob("*.parquet"))
    stream = load_dataset("parquet", data_files={"train": files}, streaming=True)["train"]
    source = StreamSource(stream, seed=7, buffer_size=32, rank=rank, world_size=world, unit_size=10, drop_last=False)
    loader = ResumableLoader(source, lambda columns, rng: [{"id": torch.tensor(columns["id"])}], seed=7,
                             num_workers=2)  # fmt: skip
    read = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        read[epoch] = [i for batch in loader for i in batch["id"].tolist()]
    Path(folder, f"rank{rank}-{shards}.json").write_text(json.dumps({"split": source.split, **read}))


@pytest.mark.parametrize("shards", [4, 3])
def test_two_processes_read_each_example_exactly_once_an_epoch(tmp_path, shards):
    """4 shards: 2 whole shards a process; 3 shards: every other example of the shuffled stream. Either way the two
    processes' ids of an epoch are all the ids, each once, and the next epoch is another order."""
    write_parquet([{"id": i, "label": i % 10} for i in range(150)], tmp_path / f"shards{shards}", shards,
                  image_column=None)  # fmt: skip
    launch_processes(_read_an_epoch, (str(tmp_path), shards), tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}-{shards}.json").read_text()) for r in (0, 1)]
    assert {rank["split"] for rank in ranks} == {"shards" if shards == 4 else "examples"}
    for epoch in ("0", "1"):
        ids = ranks[0][epoch] + ranks[1][epoch]
        assert sorted(ids) == list(range(150)), epoch
    assert ranks[0]["0"] != ranks[0]["1"]


def _train_on_each_rank(output_dir: str, family: str, options: dict) -> None:
    from accelerate import PartialState

    from hf_vit_plus.training.args import family_arguments
    from hf_vit_plus.training.loop import train

    result = train(family_arguments(family, output_dir=output_dir, **options))
    rank = PartialState().process_index
    Path(output_dir, f"rank{rank}.json").write_text(
        json.dumps({"step": result.global_step, "samples": result.eval_metrics.get("samples"),
                    "stop": result.stop_reason, "eval": result.eval_metrics,
                    "losses": [entry["loss"] for entry in result.log_history if "loss" in entry]})
    )  # fmt: skip


def _stream_options(tmp_path: Path, family: str) -> dict:
    common = dict(streaming=True, max_steps=3, save_steps="none", config_overrides=TINY[family], **QUIET)
    if family in ("vit", "vit-mpp"):
        data = write_parquet(digit_rows(200), tmp_path / "data", 4)
        return dict(common, train_dir=str(data), per_device_train_batch_size=8, max_eval_samples=30,
                    dataloader_num_workers=1)  # fmt: skip
    if family == "seq2seq":
        data = write_parquet(pair_rows(300), tmp_path / "data", 3, image_column=None)
        return dict(common, train_file=str(data / "*.parquet"), per_device_train_batch_size=8, vocab_size=300,
                    max_eval_samples=30)  # fmt: skip
    if family == "sparse-lm":
        data = write_jsonl(text_rows(120), tmp_path / "data", 2)
        return dict(common, train_file=str(data / "*.jsonl"), block_size=64, per_device_train_batch_size=4,
                    max_eval_samples=10)  # fmt: skip
    data = write_image_folder(digit_rows(160), tmp_path / "data")
    return dict(common, train_dir=str(data), per_device_train_batch_size=8, max_eval_samples=30)


@pytest.mark.parametrize("family", ["vit", "vit-mpp", "seq2seq", "sparse-lm", "image-lm"])
def test_each_family_trains_from_local_shards_as_a_stream_on_two_processes(tmp_path, family):
    options = _stream_options(tmp_path, family)
    launch_processes(_train_on_each_rank, (str(tmp_path / "run"), family, options), tmp_path / "run")
    ranks = [json.loads((tmp_path / "run" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["stop"] == ranks[1]["stop"] == "finished", ranks
    assert ranks[0]["step"] == ranks[1]["step"] == 3
    assert ranks[0]["samples"] == ranks[1]["samples"], ranks  # every example once
    if family != "sparse-lm":  # the language model is evaluated on the blocks of its held-out texts
        assert ranks[0]["samples"] == options["max_eval_samples"]
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the mean over the processes
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_a_streamed_token_budget_run_on_two_processes_resumes_bitwise(tmp_path):
    """seq2seq streamed from 3 jsonl shards (every other example a process) with --max_tokens_per_batch: each process
    cuts its own pools into batches, so they stop at different places of their parts; stopped after update 4 and
    resumed, the weights equal those of the run that never stopped."""
    data = write_jsonl(pair_rows(500), tmp_path / "data", 3)
    options = dict(streaming=True, train_file=str(data / "*.jsonl"), max_tokens_per_batch=96, max_steps=8,
                   config_overrides=TINY["seq2seq"], vocab_size=300, max_eval_samples=20, save_steps="100",
                   shuffle_buffer_size=50, **QUIET)  # fmt: skip
    launch_processes(_train_on_each_rank, (str(tmp_path / "full"), "seq2seq", options), tmp_path / "full")
    launch_processes(_train_on_each_rank, (str(tmp_path / "split"), "seq2seq", dict(options, stop_after_steps=4)),
                     tmp_path / "split")  # fmt: skip
    state = json.loads((tmp_path / "split" / "checkpoints" / "checkpoint-4" / "training_state.json").read_text())
    assert len(state["data_positions"]) == 2
    resume = dict(options, resume_from_checkpoint="latest")
    launch_processes(_train_on_each_rank, (str(tmp_path / "split"), "seq2seq", resume), tmp_path / "split")
    full, resumed = (load_file(tmp_path / name / "model.safetensors") for name in ("full", "split"))
    assert [key for key in full if not torch.equal(full[key], resumed[key])] == []
    losses = json.loads((tmp_path / "full" / "rank0.json").read_text())["losses"]
    assert len(losses) == 8 and losses == json.loads((tmp_path / "split" / "rank0.json").read_text())["losses"]
