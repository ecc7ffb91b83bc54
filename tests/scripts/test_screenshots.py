"""scripts/docs/screenshots.py: the page URLs it captures, its refusal of bad input, and the committed screenshots
(real PNG files of the configured window width, one per default page). Taking new ones needs Chromium and mkdocs:
`make screenshots`."""

from __future__ import annotations

import struct

import pytest

from tests.utils import load_script

screenshots = load_script("scripts/docs/screenshots.py")


@pytest.mark.parametrize(
    ("page", "url"),
    [
        ("index.md", ""),
        ("families/vit.md", "families/vit/"),
        ("guides/index.md", "guides/"),
        ("results.md", "results/"),
        ("results.md#sparse-attention", "results/#sparse-attention"),
        ("images/results/fast_decoding.png", "images/results/fast_decoding.png"),
    ],
)
def test_page_url_follows_mkdocs_directory_urls(page, url):
    assert screenshots.page_url(page) == url


def test_screenshot_names_are_flat_file_names():
    assert screenshots.screenshot_name("families/vit.md") == "families-vit.png"
    assert screenshots.screenshot_name("results.md#sparse-attention") == "results-sparse-attention.png"
    assert screenshots.screenshot_name("images/results/x.png") == "images-results-x.png"


def test_page_url_refuses_a_non_markdown_page():
    with pytest.raises(ValueError, match="'families/vit.html'"):
        screenshots.page_url("families/vit.html")


def test_too_small_a_window_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit_info:
        screenshots.main(["--width", "10", "--chromium", "/nonexistent/chromium"])
    assert exit_info.value.code == 2
    assert "--width 10" in capsys.readouterr().err


@pytest.mark.parametrize("page", screenshots.PAGES)
def test_committed_screenshot_is_a_png_of_the_default_width(page):
    path = screenshots.OUTPUT / screenshots.screenshot_name(page)
    assert path.is_file(), f"{path} missing: run make screenshots"
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (1280, 900)
