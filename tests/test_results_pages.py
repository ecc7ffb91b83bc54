"""The Results page is generated from the committed result files (scripts/docs/results_pages.py): it is up to date
with them, it shows every file under results/, and the plots it names exist."""

from __future__ import annotations

import re

from tests.utils import REPO_ROOT, load_script


def _pages():
    return load_script("scripts/docs/results_pages.py")


def test_the_results_page_is_what_the_result_files_give():
    pages = _pages()
    assert pages.main(["--check"]) == 0, "run `make results` and commit docs/results.md and its plots"


def test_every_result_file_is_on_the_page_and_every_plot_exists():
    text = (REPO_ROOT / "docs" / "results.md").read_text()
    for path in (REPO_ROOT / "results").glob("*.csv"):
        assert f"`results/{path.name}`" in text, path.name
    plots = re.findall(r"!\[[^\]]*\]\((images/results/[^)]+)\)", text)
    assert len(plots) >= 4
    assert "images/results/small_data.png" in plots  # the small-data accuracy against minutes
    for plot in plots:
        assert (REPO_ROOT / "docs" / plot).stat().st_size > 5000, plot


def test_a_changed_row_makes_the_page_out_of_date(tmp_path, monkeypatch):
    pages = _pages()
    results = tmp_path / "results"
    results.mkdir()
    for path in (REPO_ROOT / "results").glob("*.csv"):
        (results / path.name).write_text(path.read_text())
    import_time = results / "import_time.csv"
    import_time.write_text(import_time.read_text().replace("0.549", "0.551", 1))
    monkeypatch.setattr(pages, "RESULTS", results)
    assert pages.main(["--check"]) == 1
