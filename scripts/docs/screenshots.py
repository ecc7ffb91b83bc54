"""Screenshots of the built docs site, taken with headless Chromium, for a person to check the pages by eye.

Builds the site into a temporary folder, serves it on the loopback interface and captures the pages below into
docs/assets/screenshots/ (committed: look at them after a change to the theme, the navigation or a page's top).

    python scripts/docs/screenshots.py                       # the default pages, 1280 x 900
    python scripts/docs/screenshots.py --width 390 --height 844 --pages index.md families/vit.md
    python scripts/docs/screenshots.py --pages images/results/sparse_attention.png   # a plot alone

Needs mkdocs (the `docs` extra) and a Chromium binary (Debian: `apt install chromium`; `--chromium PATH` or the
CHROMIUM environment variable pick another).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
OUTPUT = REPO_ROOT / "docs" / "assets" / "screenshots"
# Home, the quick tour, a task guide, the Hub guide, a model page, the top of the Results page and one of its plots, as
# the browser shows the image at its own size (headless Chromium draws a blank page when a URL's anchor scrolls it)
PAGES = (
    "index.md",
    "quick-tour.md",
    "tasks/image-classification.md",
    "guides/hub.md",
    "families/vit.md",
    "results.md",
    "images/results/fast_decoding.png",
)


def page_url(page: str) -> str:
    """The site-relative URL mkdocs (directory URLs) gives a page of docs/, with its anchor if it has one.

    Args:
        page: A page's path under docs/, such as `families/vit.md`, optionally with `#anchor`, or an image of the
            site, such as `images/results/fast_decoding.png`.

    Returns:
        The URL path, such as `families/vit/` (`""` for `index.md`; `results/#sparse-attention` for
        `results.md#sparse-attention`; an image's own path).

    Raises:
        ValueError: `page` is neither a Markdown file nor a PNG image.
    """
    path, _, anchor = page.partition("#")
    if path.endswith(".png"):
        return path
    if not path.endswith(".md"):
        raise ValueError(
            f"page {page!r}: expected a Markdown file under docs/, such as 'families/vit.md', or a PNG image"
        )
    stem = path.removesuffix(".md")
    url = "" if stem == "index" else stem.removesuffix("/index") + "/"
    return f"{url}#{anchor}" if anchor else url


def screenshot_name(page: str) -> str:
    """The PNG file a page's screenshot is written to: `families/vit.md` -> `families-vit.png`,
    `results.md#sparse-attention` -> `results-sparse-attention.png`, `images/results/x.png` ->
    `images-results-x.png`."""
    path, _, anchor = page.partition("#")
    stem = path.removesuffix(".md").removesuffix(".png").replace("/", "-")
    return "-".join(filter(None, [stem, anchor])) + ".png"


def find_chromium(explicit: str | None) -> str:
    """The Chromium binary: `explicit`, else $CHROMIUM, else `chromium` / `chromium-browser` on the PATH.

    Raises:
        FileNotFoundError: no Chromium was found.
    """
    for candidate in (explicit, os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise FileNotFoundError("no Chromium found: install Debian's chromium package or pass --chromium PATH")


def main(argv: list[str] | None = None) -> int:
    from hf_vit_plus.cli_utils import CommandParser

    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", nargs="+", default=list(PAGES), help="pages under docs/ to capture")
    parser.add_argument("--width", type=int, default=1280, help="window width in CSS pixels")
    parser.add_argument("--height", type=int, default=900, help="window height in CSS pixels")
    parser.add_argument("--chromium", help="the Chromium binary (default: $CHROMIUM, then the PATH)")
    parser.add_argument("--output_dir", type=Path, default=OUTPUT, help="where the PNG files go")
    args = parser.parse_args(argv)
    for value, name in ((args.width, "--width"), (args.height, "--height")):
        if value < 200:
            parser.error(f"{name} {value}: expected at least 200 pixels")
    urls = {page: page_url(page) for page in args.pages}
    chromium = find_chromium(args.chromium)

    with tempfile.TemporaryDirectory() as site:
        # not -q: with it mkdocs does not count the warnings --strict fails on
        mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO_ROOT / "mkdocs.yml")]
        quiet = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        built = subprocess.run([*mkdocs, "-d", site], cwd=REPO_ROOT, env=quiet, capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"mkdocs build --strict failed:\n{built.stderr[-4000:]}")
        handler = functools.partial(_QuietHandler, directory=site)
        with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
            threading.Thread(target=server.serve_forever, daemon=True).start()
            args.output_dir.mkdir(parents=True, exist_ok=True)
            for page, url in urls.items():
                target = args.output_dir / screenshot_name(page)
                with tempfile.TemporaryDirectory() as profile:
                    subprocess.run(
                        [
                            chromium,
                            "--headless",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--hide-scrollbars",
                            "--virtual-time-budget=5000",  # let the page load its images and scroll to an anchor
                            f"--user-data-dir={profile}",
                            f"--window-size={args.width},{args.height}",
                            f"--screenshot={target}",
                            f"http://127.0.0.1:{server.server_port}/{url}",
                        ],
                        check=True,
                        capture_output=True,
                        timeout=120,
                    )
                if not target.is_file() or target.stat().st_size == 0:
                    raise RuntimeError(f"Chromium wrote no screenshot of {page} to {target}")
                print(f"{page} -> {target.relative_to(REPO_ROOT) if target.is_relative_to(REPO_ROOT) else target}")
            server.shutdown()
    return 0


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


if __name__ == "__main__":
    sys.exit(main())
