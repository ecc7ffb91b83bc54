"""The docs read as a newcomer follows them: every block that pushes to the Hub comes after the page's sign-in step
and the placeholder it names, no paragraph or bullet is a wall of text, and every `hf_vit_plus` name a code block
calls has an entry in the API reference. Page text only: fast, no mkdocs, no network."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

from tests.utils import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
MAX_WORDS = 120
_FENCE = re.compile(r"^\s*(```|~~~)\s*(\w*)")
_ITEM = re.compile(r"^\s*([-*+]|\d+\.)\s+")
# a block pushes when it calls push_to_hub, asks Trainer or the CLI to push, or runs `hf-vit-plus push`
_PUSHES = re.compile(r"push_to_hub|push_checkpoint\(|hf-vit-plus push\b")
_SIGN_IN = re.compile(r"hf auth login|HF_TOKEN=")
# a placeholder namespace in a repository id, which the page must tell the reader to replace before the block
_PLACEHOLDER = "my-user"


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


def _blocks(text: str) -> list[tuple[int, str, str]]:
    """(line of the opening fence, language, code) of each fenced block."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next((i for i in range(index + 1, len(lines)) if _FENCE.match(lines[i])), len(lines))
        blocks.append((index + 1, fence.group(2), "\n".join(lines[index + 1 : end])))
        index = end + 1
    return blocks


def _prose_before(text: str, line: int) -> str:
    """The page's text outside code blocks above `line`."""
    kept, fenced = [], False
    for number, current in enumerate(text.splitlines(), 1):
        if number >= line:
            break
        if _FENCE.match(current):
            fenced = not fenced
        elif not fenced:
            kept.append(current)
    return "\n".join(kept)


def test_every_block_that_pushes_comes_after_the_sign_in_step():
    """A copied script that pushes stops at once where the reader has not signed in (`Trainer` creates the repository
    when it is built): every code block that pushes has a sign-in block (`hf auth login` or `HF_TOKEN=...`) above it
    on its page, and where it pushes to `my-user/...` the text above it tells the reader to replace `my-user`."""
    missing = []
    for page in PAGES:
        if page.name == "cli.md":  # the generated command-line reference: the parsers' help, no runnable steps
            continue
        text = page.read_text(encoding="utf-8")
        signed_in = False
        for line, _, code in _blocks(text):
            if _SIGN_IN.search(code):
                signed_in = True
            if not _PUSHES.search(code):
                continue
            if not signed_in:
                missing.append(f"{_rel(page)}:{line}: pushes with no sign-in block (`hf auth login`) above it")
            prose = _prose_before(text, line)
            if _PLACEHOLDER in code and not re.search(rf"replace `{_PLACEHOLDER}`", prose, re.IGNORECASE):
                missing.append(f"{_rel(page)}:{line}: pushes to `{_PLACEHOLDER}/...` that no text above names")
    assert not missing, "pushing blocks a copied script cannot run:\n" + "\n".join(missing)


def _units(text: str):
    """(line, words) of each paragraph and each bullet of a page, code blocks, tables and headings left out."""
    fenced, current, start = False, [], 0
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            if current:
                yield start, current
            current = []
            continue
        stripped = line.strip()
        if fenced:
            continue
        item = _ITEM.match(line)
        if not stripped or item or stripped.startswith(("#", "|", "<!--", "!!!", "???", "![")):
            if current:
                yield start, current
            current, start = ([line[item.end() :]], number) if item else ([], number)
            continue
        if not current:
            start = number
        current.append(stripped)
    if current:
        yield start, current


def test_no_paragraph_or_bullet_is_a_wall_of_text():
    """A paragraph or bullet over 120 words is split: by its steps, its cases or its sentences. The generated pages
    count too (the command-line reference is the parsers' help; the Results page, its generator's text)."""
    walls = []
    for page in PAGES:
        for line, lines in _units(page.read_text(encoding="utf-8")):
            words = len(" ".join(lines).split())
            if words > MAX_WORDS:
                walls.append(f"{_rel(page)}:{line} ({words} words)")
    assert not walls, f"paragraphs or bullets over {MAX_WORDS} words: {walls}"


def _documented() -> set[int]:
    """The ids of the objects the site's `::: path` directives document: each named object, and for a module its
    public members (its `__all__`, or the public names defined in it)."""
    objects = set()
    for page in (REPO_ROOT / "docs").rglob("*.md"):
        for path in re.findall(r"^::: ([\w.]+)$", page.read_text(encoding="utf-8"), flags=re.M):
            target = _resolve(path)
            objects.add(id(target))
            if inspect.ismodule(target):
                names = getattr(target, "__all__", None) or [
                    name
                    for name, value in vars(target).items()
                    if not name.startswith("_") and getattr(value, "__module__", None) == target.__name__
                ]
                objects.update(id(getattr(target, name)) for name in names)
    return objects


def _resolve(path: str):
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            target = getattr(target, part)
        return target
    raise ImportError(path)


def _names_called(code: str) -> set[str]:
    """The `hf_vit_plus` names a Python block imports or spells out (`hf_vit_plus.a.b`)."""
    names = set()
    try:
        tree = ast.parse(code)
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hf_vit_plus":
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    names.update(re.findall(r"\bhf_vit_plus(?:\.[A-Za-z_]\w*){2,}(?=\()", code))
    return names


# a call the text spells out in full: `hf_vit_plus.metrics.load_translation_metric()`
_CALL_IN_TEXT = re.compile(r"`(hf_vit_plus(?:\.[A-Za-z_]\w*){2,})\([^`]*\)`")


def test_every_hf_vit_plus_name_a_code_block_calls_has_an_api_entry():
    """What the guides and the README tell the reader to call (in a Python block, or a full `hf_vit_plus.x.f()` in the
    text) is in the API reference (docs/reference/api.md, the model pages or the contributing pages)."""
    documented = _documented()
    missing = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        calls = [(0, "python", " ".join(f"{name}()" for name in _CALL_IN_TEXT.findall(text)))]
        for line, language, code in [*_blocks(text), *calls]:
            if language != "python":
                continue
            for name in _names_called(code):
                target = _resolve(name)
                if inspect.ismodule(target) or id(target) in documented:
                    continue
                missing.add(f"{name} ({_rel(page)}:{line or 'text'})")
    assert not missing, "names the docs call with no API reference entry:\n" + "\n".join(sorted(missing))
