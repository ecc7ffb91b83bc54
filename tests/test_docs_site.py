"""The docs site read as a new user reads it: code that fits the column, long pages cut by subheadings, no
cross-reference left unresolved in the built HTML, Results plots whose text can be read at the column's width, and
a Results page whose every section has a row in its summary table.

The page-text checks read README.md and docs/; the HTML check builds the site with mkdocs into a temporary folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils import REPO_ROOT, load_script

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
MAX_CODE_LINE = 100  # characters: the content column at 1280 px shows about 100 of the code font
MAX_LINES_WITHOUT_HEADING = 60
# A plot's text must be at least this size where the page shows it: its size in points times the column's width over
# the figure's width in pixels, when the figure is wider than the column (the browser scales the image down).
MIN_PLOT_FONT_PT = 9.0
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^#{1,6} ")


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


def _prose_lines(lines: list[str]):
    """(line number, line, is_code) for each line, fenced code marked."""
    fenced = False
    for number, line in enumerate(lines, 1):
        if _FENCE.match(line):
            fenced = not fenced
            yield number, line, True
            continue
        yield number, line, fenced


def test_code_lines_fit_the_column():
    """A code line over 100 characters scrolls sideways under the copy button: wrap it (`\\` in shell, brackets in
    Python) or shorten its comment."""
    long = []
    for page in PAGES:
        for number, line, code in _prose_lines(page.read_text(encoding="utf-8").splitlines()):
            if code and not _FENCE.match(line) and len(line) > MAX_CODE_LINE:
                long.append(f"{_rel(page)}:{number} ({len(line)} characters)")
    assert not long, f"code lines over {MAX_CODE_LINE} characters: {long}"


def test_long_pages_have_subheadings():
    """A page over 60 lines has `##` subheadings, and no stretch of more than 60 lines of text (code blocks, table
    rows and the indented body of a collapsed block not counted) goes without a heading."""
    walls = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        if len(lines) > MAX_LINES_WITHOUT_HEADING and not any(line.startswith("## ") for line in lines):
            walls.append(f"{_rel(page)}: {len(lines)} lines, no subheading")
            continue
        since, start = 0, 1
        for number, line, code in _prose_lines(lines):
            if not code and _HEADING.match(line):
                since, start = 0, number
            elif not (code or line.startswith(("|", "    ")) or not line.strip()):
                since += 1
                if since == MAX_LINES_WITHOUT_HEADING + 1:
                    walls.append(f"{_rel(page)}:{start}: over {MAX_LINES_WITHOUT_HEADING} lines of text unheaded")
    assert not walls, f"walls of text: {walls}"


SITE_URL = "https://docs.example.invalid/hf_vit_plus/"  # where a publisher would put it (mkdocs.yml's site_url)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built strictly by mkdocs into a temporary folder (about 10 s): a warning (a broken link or anchor, a
    docstring mkdocstrings cannot read) fails it."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    target = tmp_path_factory.mktemp("site")
    # not -q: mkdocs counts the warnings that --strict turns into a failure only at the levels it logs
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO_ROOT / "mkdocs.yml")]
    result = subprocess.run(
        [*command, "-d", str(target)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_VIT_PLUS_SITE_URL": SITE_URL},
        timeout=300,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-4000:]}"
    return target


def test_built_pages_have_no_literal_cross_references(site: Path):
    """`[`Name`]` in a docstring or page is a cross-reference only when it resolves; otherwise the reader sees the
    brackets. Write `[`Name`][hf_vit_plus.Name]` or a plain `Name`."""
    literal = re.compile(r"\[\s*<code>[\w.]+</code>\s*\]")
    found = []
    for html in sorted(site.rglob("*.html")):
        for match in literal.finditer(html.read_text(encoding="utf-8")):
            found.append(f"{html.relative_to(site)}: {match.group(0)}")
    assert not found, f"unresolved cross-references shown as text: {found}"


def test_the_sitemap_lists_every_page_at_the_published_address(site: Path):
    """With the site's address in HF_VIT_PLUS_SITE_URL (mkdocs.yml's site_url) the sitemap names each page there."""
    sitemap = (site / "sitemap.xml").read_text(encoding="utf-8")
    addresses = re.findall(r"<loc>([^<]+)</loc>", sitemap)
    pages = sum(1 for _ in (REPO_ROOT / "docs").rglob("*.md"))
    assert len(addresses) == pages and all(address.startswith(SITE_URL) for address in addresses), addresses[:3]


MAX_SIGNATURE_LINE = 100  # characters: as the code blocks (the signature is a code block of the same font)


def test_built_signatures_fit_the_column(site: Path):
    """mkdocstrings prints a signature on one line unless a formatter (ruff, in the `docs` extra) wraps it: no line of
    a rendered signature is over 100 characters."""
    import html

    long = []
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r'<div class="doc-signature[^>]*>\s*<pre>(.*?)</pre>', text, flags=re.S):
            for line in html.unescape(re.sub(r"<[^>]+>", "", match.group(1))).splitlines():
                if len(line) > MAX_SIGNATURE_LINE:
                    long.append(f"{page.relative_to(site)}: {line[:60]}... ({len(line)} characters)")
    assert not long, f"signature lines over {MAX_SIGNATURE_LINE} characters (is ruff installed?): {long}"


def _results_module():
    return load_script("scripts/docs/results_pages.py")


def _look(handle) -> tuple:
    """How a legend entry is drawn: colour, marker, hatch and line style (two series must differ in one of them)."""
    from matplotlib.colors import to_hex

    colour = handle.get_facecolor() if hasattr(handle, "get_hatch") else None
    if colour is None and hasattr(handle, "get_color"):
        colour = handle.get_color()
    if colour is not None and not isinstance(colour, str):
        colour = to_hex(colour[0] if getattr(colour, "ndim", 1) == 2 else colour)
    marker = handle.get_marker() if hasattr(handle, "get_marker") else str(getattr(handle, "get_paths", lambda: "")())
    hatch = handle.get_hatch() if hasattr(handle, "get_hatch") else None
    style = handle.get_linestyle() if hasattr(handle, "get_linestyle") else None
    return (colour, str(marker), hatch, str(style))


def test_results_plots_text_is_readable_at_the_column_width(tmp_path, monkeypatch):
    """Every Results plot's legend, tick labels and axis titles are at least 9 pt at the width the page shows it, every
    axis has a title, and no two series of a legend are drawn alike."""
    pytest.importorskip("matplotlib")
    module = _results_module()
    style = module.PLOT_STYLE
    small = []

    def check(plt, figure, path):
        width_px = figure.get_figwidth() * figure.dpi
        scale = min(1.0, style.rendered_width_px / width_px)
        for axis in figure.axes:
            texts = [*axis.get_xticklabels(), *axis.get_yticklabels(), axis.xaxis.label, axis.yaxis.label]
            legends = [axis.get_legend()] if axis.get_legend() is not None else []
            for legend in legends:
                texts += legend.get_texts()
            for text in texts:
                if text.get_text() and text.get_fontsize() * scale < MIN_PLOT_FONT_PT:
                    small.append(f"{path.name}: {text.get_text()!r} at {text.get_fontsize() * scale:.1f} pt")
            for label in (axis.xaxis.label, axis.yaxis.label):
                if not label.get_text() and label.axes.get_visible():
                    small.append(f"{path.name}: an axis without a title")
            legends += [legend for legend in figure.legends if legend not in legends]
            for legend in legends:
                for text in legend.get_texts():
                    if text.get_fontsize() * scale < MIN_PLOT_FONT_PT:
                        small.append(
                            f"{path.name}: legend {text.get_text()!r} at {text.get_fontsize() * scale:.1f} pt"
                        )
                looks = [_look(handle) for handle in legend.legend_handles]
                if len(set(looks)) != len(looks):
                    alike = [text.get_text() for text, look in zip(legend.get_texts(), looks) if looks.count(look) > 1]
                    small.append(f"{path.name}: series drawn alike: {alike}")
        plt.close(figure)

    monkeypatch.setattr(module, "_save", check)
    drawn = 0
    for topic in module.TOPICS:
        for plot in topic.plots:
            if not (module.RESULTS / plot.file).is_file():
                continue
            plot.draw(module.read_rows(module.RESULTS / plot.file), tmp_path / f"{plot.name}.png")
            drawn += 1
    assert drawn, "no plots drawn"
    assert not small, (
        f"plots below the standard (text at least {MIN_PLOT_FONT_PT} pt, titled axes, series told apart): {small}"
    )


def test_every_results_section_has_a_summary_row():
    """The Results page opens with a summary table; every topic section below it is named by one of its rows."""
    page = (REPO_ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert page == _results_module().render(plots=False), "docs/results.md is stale: run scripts/docs/results_pages.py"
    lines = page.splitlines()
    summary_start = lines.index("## Summary")
    table = []
    for line in lines[summary_start + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            table.append(line)
    assert len(table) > 2, "the summary table has no rows"
    linked = set(re.findall(r"\]\(#([\w-]+)\)", "\n".join(table)))
    sections = [line[3:] for line in lines[summary_start + 1 :] if line.startswith("## ")]
    anchors = {section: re.sub(r"[^\w\s-]", "", section.lower()).strip().replace(" ", "-") for section in sections}
    missing = [section for section, anchor in anchors.items() if anchor not in linked and section != "Other files"]
    assert not missing, f"Results sections without a row in the summary table: {missing}"


def test_the_presets_tables_are_what_the_configs_give():
    """The model pages' presets tables (layers, width, heads, parameters counted on the meta device) are generated
    by scripts/docs/preset_tables.py: a changed preset without regenerating them fails here."""
    assert load_script("scripts/docs/preset_tables.py").main(["--check"]) == 0, (
        "run python scripts/docs/preset_tables.py and commit the family pages"
    )
