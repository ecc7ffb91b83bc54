"""Screenshots of the built docs site, taken with headless Chromium, for a person to check the pages by eye.

Builds the site into a temporary folder, serves it on the loopback interface and captures the pages below into
docs/assets/screenshots/ (committed: look at them after a change to the theme, the navigation or a page's top).

    python scripts/docs/screenshots.py                       # the default pages, 1280 x 900
    python scripts/docs/screenshots.py --width 390 --height 844 --pages index.md families/vit.md

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
PAGES = ("index.md", "families/vit.md")


def page_url(page: str) -> str:
    """The site-relative URL mkdocs (directory URLs) gives a page of docs/.

    Args:
        page: A page's path under docs/, such as `families/vit.md`.

    Returns:
        The URL path, such as `families/vit/` (`""` for `index.md`).

    Raises:
        ValueError: `page` is not a Markdown file.
    """
    if not page.endswith(".md"):
        raise ValueError(f"page {page!r}: expected a Markdown file under docs/, such as 'families/vit.md'")
    stem = page.removesuffix(".md")
    if stem == "index":
        return ""
    return stem.removesuffix("/index") + "/"


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
        mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(REPO_ROOT / "mkdocs.yml")]
        quiet = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        subprocess.run([*mkdocs, "-d", site], check=True, cwd=REPO_ROOT, env=quiet)
        handler = functools.partial(_QuietHandler, directory=site)
        with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
            threading.Thread(target=server.serve_forever, daemon=True).start()
            args.output_dir.mkdir(parents=True, exist_ok=True)
            for page, url in urls.items():
                name = page.removesuffix(".md").replace("/", "-") + ".png"
                target = args.output_dir / name
                with tempfile.TemporaryDirectory() as profile:
                    subprocess.run(
                        [
                            chromium,
                            "--headless",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--hide-scrollbars",
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
