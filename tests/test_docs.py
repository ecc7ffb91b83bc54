"""The docs site (mkdocs.yml, docs/) is whole: every page the navigation names exists, the links between pages and to
images resolve, and the command-line reference is the one the parsers give today. The strict build itself is
`make docs` (CI runs it); these checks are fast and need neither mkdocs nor the network."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize

import pytest

from tests.utils import REPO_ROOT

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
    yaml = pytest.importorskip("yaml")  # only this check needs it: the others run without

    class Loader(yaml.SafeLoader):  # mkdocs' `!ENV [NAME, default]`: the default
        pass

    Loader.add_constructor("!ENV", lambda loader, node: loader.construct_sequence(node)[-1])
    return yaml.load((REPO_ROOT / "mkdocs.yml").read_text(), Loader=Loader)


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
    """The API page documents the public subpackages; each family's classes are on its model page; the decoding
    rules (helpers for engine authors) are on the contributing pages."""
    text = (DOCS / "reference" / "api.md").read_text()
    for module in ("hf_vit_plus.hub", "hf_vit_plus.training", "hf_vit_plus.interpret", "hf_vit_plus.conversion",
                   "hf_vit_plus.serving", "hf_vit_plus.register_auto_classes"):  # fmt: skip
        assert f"::: {module}\n" in text, module
    import hf_vit_plus

    pages = {page: (DOCS / "families" / f"{page}.md").read_text() for page in ("vit", "seq2seq", "sparse")}
    classes = [name for name in hf_vit_plus.__all__ if name[0].isupper()]
    for name in classes:
        family = "vit" if name.startswith("ViT") else "seq2seq" if name.startswith("Seq2Seq") else "sparse"
        assert f"::: hf_vit_plus.{name}\n" in pages[family], f"{name} is not on families/{family}.md"
    assert "::: hf_vit_plus.models.decoding_rules\n" in (DOCS / "contributing" / "layout.md").read_text()


# Machine details belong in the result files' fields and release history in CHANGELOG.md: the docs, the docstrings
# and the comments say how to measure and what is, not what one machine measured or what an old release did.
_MACHINE_OR_HISTORY = re.compile(
    r"this (release|cpu|machine|box|host)|previous round|last round|release 0\.[0-9]", re.IGNORECASE
)


def _python_texts(path):
    """(line, text) of every comment and docstring of a Python file."""
    source = path.read_text(encoding="utf-8")
    texts = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                texts.append((node.body[0].lineno, docstring))
    return texts


def test_no_machine_or_release_history_phrasing_in_the_docs_docstrings_or_comments():
    """No "this release / this CPU / this machine / this host / previous round / release 0.x" in README.md, the
    docs' pages (the generated CLI reference included: its text is the parsers' help, to be fixed there) or the
    comments and docstrings of the package and the scripts."""
    found = []
    for page in [REPO_ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if _MACHINE_OR_HISTORY.search(line):
                found.append(f"{page.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    for folder in ("hf_vit_plus", "scripts"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for start, text in _python_texts(path):
                for offset, line in enumerate(text.splitlines()):
                    if _MACHINE_OR_HISTORY.search(line):
                        found.append(f"{path.relative_to(REPO_ROOT)}:{start + offset}: {line.strip()}")
    assert not found, (
        "machine details or release history in the text (say how to measure; machine details go into the result "
        "files' fields, history into CHANGELOG.md):\n" + "\n".join(found)
    )
