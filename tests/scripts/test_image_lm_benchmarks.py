"""The image-model experiments run end to end on digits: the dense/strided/fixed comparison writes its curves, plot
and models, and the depth script measures that recomputation keeps fewer activations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "benchmarks"))

import bench_image_lm  # noqa: E402
import bench_image_lm_depth  # noqa: E402


def test_pattern_comparison_writes_curves_plot_and_models(tmp_path, capsys):
    results = bench_image_lm.main(
        ["--dataset", "digits", "--steps", "6", "--eval_every", "3", "--eval_images", "20", "--final_eval_images",
         "40", "--hidden_size", "16", "--layers", "1", "--heads", "2", "--output_dir", str(tmp_path)]
    )  # fmt: skip
    saved = json.loads((tmp_path / "curves.json").read_text())
    assert set(saved["curves"]) == {"dense", "strided", "fixed"}
    assert [point["step"] for point in saved["curves"]["strided"]] == [0, 3, 6]
    floors = saved["floors"]
    assert floors["uniform_bits_per_dim"] == 8.0 and 0 < floors["pixel_histogram_bits_per_dim"] < 8
    assert all(0 < value < 9 for value in results["final_bits_per_dim"].values())
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert (tmp_path / "fixed" / "model.safetensors").is_file()
    table = capsys.readouterr().out
    assert "| strided |" in table and "vs dense" in table


def test_recomputation_keeps_fewer_activations(monkeypatch):
    common = ["--dataset", "digits", "--layers", "4", "--hidden_size", "16", "--heads", "2", "--batch_size", "4"]
    plain = bench_image_lm_depth.measure_step(bench_image_lm_depth.parse_args([*common, "--measure", "plain"]))
    recompute = bench_image_lm_depth.measure_step(bench_image_lm_depth.parse_args([*common, "--measure", "recompute"]))
    assert recompute["saved_for_backward_bytes"] < 0.5 * plain["saved_for_backward_bytes"]
    assert recompute["parameter_bytes"] == plain["parameter_bytes"]
