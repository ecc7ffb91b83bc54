"""The docs site (mkdocs.yml, docs/) is whole: every page the navigation names exists, the links between pages and to
images resolve, and the command-line reference is the one the parsers give today. The strict build itself is
`make docs` (CI runs it); these checks are fast and need neither mkdocs nor the network."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.utils import REPO_ROOT

yaml = pytest.importorskip("yaml")

DOCS = REPO_ROOT / "docs"
CLI_PAGE = DOCS / "reference" / "cli.md"


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in _nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    return []


def _config() -> dict:
    return yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())


def test_every_page_in_the_navigation_exists_and_every_page_is_in_it():
    config = _config()
    assert config["docs_dir"] == "docs"
    pages = _nav_pages(config["nav"])
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
    unlisted = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if str(p.relative_to(DOCS)) not in pages)
    assert not unlisted, f"pages not in mkdocs.yml's nav: {unlisted}"


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_relative_links_and_images_resolve():
    broken = []
    for page in DOCS.rglob("*.md"):
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links in code blocks are not links
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if not (page.parent / path).resolve().exists():
                broken.append(f"{page.relative_to(DOCS)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_cli_reference_is_what_the_parsers_give(tmp_path):
    """docs/reference/cli.md is generated (scripts/docs/cli_reference.py, run by `make docs`): a flag added, removed
    or reworded without regenerating it fails here."""
    output = tmp_path / "cli.md"
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "docs" / "cli_reference.py"), "--output", str(output)],
        check=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": path},
        timeout=120,
    )
    assert output.read_text() == CLI_PAGE.read_text(), (
        "docs/reference/cli.md is out of date: run `make docs` (or python scripts/docs/cli_reference.py) and commit it"
    )


def test_the_api_reference_names_the_public_subpackages():
    text = (DOCS / "reference" / "api.md").read_text()
    for module in ("hf_vit_plus", "hf_vit_plus.hub", "hf_vit_plus.training", "hf_vit_plus.interpret",
                   "hf_vit_plus.conversion", "hf_vit_plus.serving", "hf_vit_plus.models.decoding_rules"):  # fmt: skip
        assert f"::: {module}\n" in text, module
