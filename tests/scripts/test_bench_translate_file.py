"""scripts/benchmarks/bench_translate_file.py --quick: a file translated by our Translator and by CTranslate2, each
in a fresh process, with the checks and the rows (speed is measured by the script on a quiet machine, not asserted
here; FastDecoding runs uncompiled to keep the check short)."""

from __future__ import annotations

import csv

import pytest

from tests.utils import load_script

pytest.importorskip("ctranslate2")


def test_quick_run_checks_the_translations_and_writes_its_rows(tmp_path, capsys):
    bench = load_script("scripts/benchmarks/bench_translate_file.py")
    rows = bench.main(["--quick", "--output", str(tmp_path / "rows.csv")])
    out = capsys.readouterr().out
    assert [(row["engine"], row["case"]) for row in rows] == [("ours-fast", "greedy"), ("ct2", "greedy")]
    ours, ct2 = rows
    assert ours["alone_equal"] == 1.0  # each sentence of the sorted batches as it is translated alone
    assert ct2["agrees_with_ours"] == 1.0  # the same float32 weights, greedy: CTranslate2's tokens
    assert ours["sentences"] == len(ours["outputs"]) == 24 and ours["outputs"] == ct2["outputs"]
    assert ours["vs_ctranslate2_warm"] == pytest.approx(ct2["warm_s"] / ours["warm_s"], rel=0.01)
    assert "summary | number-words greedy float32 | ours-fast vs CTranslate2" in out
    from hf_vit_plus.models.cpu_isa import isa_label

    with open(tmp_path / "rows.csv", newline="") as file:
        written = list(csv.DictReader(file))
    assert [row["engine"] for row in written] == ["ours-fast", "ct2"] and "outputs" not in written[0]
    assert all(row["isa"] == isa_label() and row["cpu"] and row["threads"] == "1" for row in written)
    assert all(float(row["cold_s"]) > float(row["warm_s"]) > 0 for row in written)


def test_bad_sizes_are_refused():
    bench = load_script("scripts/benchmarks/bench_translate_file.py")
    with pytest.raises(SystemExit):
        bench.parse_args(["--batch_size", "0"])
