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


def _summary_tables() -> list[list[str]]:
    """The summary section's tables, each as its lines."""
    lines = (REPO_ROOT / "docs" / "results.md").read_text().split("## Summary\n", 1)[1].split("\n## ", 1)[0]
    tables: list[list[str]] = []
    previous = ""
    for line in lines.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        previous = line
    return tables


def test_the_summary_fits_one_screen_and_names_where_each_row_was_measured():
    """At most 12 headline rows and one grid of the CTranslate2 cells, which names its instruction set; every row has
    a "measured on"; ratios say which way is better."""
    headline, *grids = _summary_tables()
    assert len(headline) - 2 <= 12, f"{len(headline) - 2} summary rows"
    assert len(grids) == 1 and grids[0][0].startswith("| case |"), grids
    page = (REPO_ROOT / "docs" / "results.md").read_text()
    grid_caption = page.split(grids[0][0])[0].rsplit("\n\n", 2)[-2]
    assert "AVX" in grid_caption or "instruction set not recorded" in grid_caption, grid_caption
    for row in headline[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[4], f"no 'measured on': {row}"
        if cells[3]:
            assert re.search(r"x (faster|the \w+)|points|BLEU", cells[3]), f"a ratio without its sense: {row}"
        assert "(paired)" not in row and not re.search(r"\d\.\d{5,}", row), row
    assert "are not compared" in page.split("## Summary", 1)[1].split("\n## ", 1)[0]


def test_no_two_html_ids_on_the_results_page_are_the_same():
    page = (REPO_ROOT / "docs" / "results.md").read_text()
    ids = re.findall(r'<a id="([\w-]+)"></a>', page)
    headings = [re.sub(r"[^\w\s-]", "", line[3:].lower()).strip().replace(" ", "-") for line in page.splitlines()
                if line.startswith("## ")]  # fmt: skip
    repeated = sorted({anchor for anchor in ids + headings if (ids + headings).count(anchor) > 1})
    assert not repeated, f"ids used twice: {repeated}"


def test_the_readme_headlines_are_the_summarys_figures():
    """The README quotes the summary: its headline block is the generator's, and each figure in it is in the
    summary (or the section) of the Results page, from the same rows."""
    pages = _pages()
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme[readme.index(pages.README_START) : readme.index(pages.README_END) + len(pages.README_END)]
    assert block == pages.readme_headlines(), "README's headlines are stale: run scripts/docs/results_pages.py"
    page = (REPO_ROOT / "docs" / "results.md").read_text()
    for figure in re.findall(r": ([\d,.]+(?:%| / [\d,.]+)?) against", block):
        assert figure in page, f"README figure {figure} is not on the Results page"
    assert re.findall(r"\d+\.\d\dx faster", block), block
