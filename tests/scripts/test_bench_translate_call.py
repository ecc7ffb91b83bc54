"""scripts/benchmarks/bench_translate_call.py --quick: one warm call of a batch of short translations by our
Translator and by CTranslate2's translate_batch, side by side, with the check and the rows (speed is measured by the
script on a quiet machine, not asserted here; FastDecoding runs uncompiled to keep the check short)."""

from __future__ import annotations

import csv

import pytest

from tests.utils import load_script

pytest.importorskip("ctranslate2")


def test_quick_run_times_both_calls_and_writes_its_rows(tmp_path, capsys):
    bench = load_script("scripts/benchmarks/bench_translate_call.py")
    rows = bench.main(["--quick", "--output", str(tmp_path / "rows.csv")])
    out = capsys.readouterr().out
    [row] = rows
    assert (row["precision"], row["threads"], row["sentences"]) == ("float32", 1, 16)
    assert row["agrees"] is True  # the same float32 weights, greedy: CTranslate2's translations are ours
    assert row["ours_ms"] > 0 and row["ct2_ms"] > 0 and row["ct2_text_ms"] > 0
    assert row["ours_vs_ct2"] == pytest.approx(row["ours_ms"] / row["ct2_ms"], rel=0.01)
    assert "summary | float32 1 thread(s) | ours / CTranslate2" in out
    from hf_vit_plus.models.cpu_isa import isa_label

    with open(tmp_path / "rows.csv", newline="") as file:
        [written] = list(csv.DictReader(file))
    assert written["isa"] == isa_label() and written["threads"] == "1" and written["device"].startswith("CPU")


def test_bad_sizes_are_refused():
    bench = load_script("scripts/benchmarks/bench_translate_call.py")
    with pytest.raises(SystemExit):
        bench.parse_args(["--batch", "0"])
