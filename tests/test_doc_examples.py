"""Every ```python and ```bash block in README.md and docs/ is a test case (id: file:line), so that the examples
the pages show keep running.

A python block runs as written (cwd a temporary folder, no Hub traffic, the repository on PYTHONPATH) and fails when
it raises: in a child forked from an interpreter that has imported torch, transformers and hf_vit_plus
(tests/preloaded_python.py: seconds of imports per block saved), or, for a block that pushes, a fresh interpreter.
The `python` and `hf-vit-plus` lines of a bash block run the same way. An HTML comment on the line before a block
changes that:
  <!-- example: skip (REASON) -->   the block is reported skipped with REASON (needs a GPU, downloads, trains long)
  <!-- example: continue -->        the block runs after the page's previous block of its language, in the same
                                    interpreter (a sign-in bash block may stand between two python steps)
                                    (a chain of such blocks, a guide's steps, runs once: as its last block's case;
                                    the earlier blocks' cases are reported skipped, naming it)
  <!-- example: run -->             a bash block runs: its `hf-vit-plus`, `python` and `make` lines, in order
A bash block without a marker fails: most are installs or long trainings, and each must say which it is.

A block that pushes (`push_to_hub`, `hf-vit-plus push`) runs against the loopback Hub server of the tests
(tests/hub_server.py): HF_ENDPOINT points at it and HF_TOKEN holds a placeholder, so the page's repository ids
(`my-user/...`) are created there and read back from there.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.utils import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
TIMEOUT_S = 300  # room for the guides' compiling blocks on a loaded machine
_FENCE = re.compile(r"^```(python|bash)\s*$")
_MARKER = re.compile(r"^<!-- example: (skip \((?P<reason>.+)\)|continue|run) -->$")
_RUNNABLE_COMMANDS = ("hf-vit-plus", "python", "make")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: str | None  # "skip", "continue", "run" or None
    reason: str | None = None
    previous: Block | None = None  # the page's block of the same language before this one, for "continue"

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        marker = _MARKER.match(lines[index - 1].strip()) if index else None
        kind = marker.group(1).split()[0] if marker else None
        block = Block(
            page,
            index + 1,
            fence.group(1),
            "\n".join(lines[index + 1 : end]) + "\n",
            kind,
            marker.group("reason") if marker else None,
            next((previous for previous in reversed(blocks) if previous.language == fence.group(1)), None),
        )
        blocks.append(block)
        index = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in _blocks(page)]
# the block that continues each block, where one does: that block's case runs this one's code too
_CONTINUED_BY = {id(block.previous): block for block in BLOCKS if block.marker == "continue" and block.previous}


def _python_source(block: Block) -> str:
    """The block's code, after the code of the blocks it continues."""
    chain = [block]
    while chain[-1].marker == "continue":
        assert chain[-1].previous is not None, f"{chain[-1].id}: 'continue' on a page's first block"
        chain.append(chain[-1].previous)
    return "\n".join(part.code for part in reversed(chain))


_PUSHES = ("push_to_hub", "push_checkpoint", "hf-vit-plus push")


def _hub_env(code: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """The loopback Hub's environment for a block that pushes (the server starts on the first such block)."""
    if not any(marker in code for marker in _PUSHES):
        return {}
    server = request.getfixturevalue("hub_server")
    return {**server.env(), "HF_TOKEN": "hf_docs_example"}


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )


@pytest.fixture(scope="module")
def preloaded():
    """The interpreter the blocks fork from (tests/preloaded_python.py): torch, transformers and hf_vit_plus imported
    once per worker, not once per block and command."""
    from tests.preloaded_python import PreloadedPython

    server = PreloadedPython(_env())
    yield server
    server.close()


def _run(args: list[str], tmp_path: Path, extra_env: dict[str, str] | None, preloaded) -> subprocess.CompletedProcess:
    """`args` run in `tmp_path`: a Python program forked from the preloaded interpreter, or, where it needs an
    environment of its own (the loopback Hub's, read at import) or is not Python (`make`), a fresh process."""
    if not extra_env and args[0] == sys.executable:
        return preloaded.run(args[1:], tmp_path, TIMEOUT_S)
    env = {**_env(), **(extra_env or {})}
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_example_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest, preloaded):
    if block.marker == "skip":
        pytest.skip(f"{block.id}: {block.reason}")
    later = _CONTINUED_BY.get(id(block))
    if later is not None and later.marker == "continue" and block.language == later.language == "python":
        while id(later) in _CONTINUED_BY:
            later = _CONTINUED_BY[id(later)]
        pytest.skip(f"{block.id}: runs as part of {later.id}, which continues it")
    if block.language == "python":
        source = _python_source(block)
        result = _run([sys.executable, "-c", source], tmp_path, _hub_env(source, request), preloaded)
        assert result.returncode == 0, f"{block.id} raised:\n{result.stderr[-4000:]}"
        return
    assert block.marker == "run", f"{block.id}: a bash block needs <!-- example: run --> or a skip with a reason"
    commands = [
        line for line in block.code.replace("\\\n", " ").splitlines() if line.split(" ", 1)[0] in _RUNNABLE_COMMANDS
    ]
    assert commands, f"{block.id}: marked runnable but has no hf-vit-plus, python or make line"
    for command in commands:
        args = shlex.split(command, comments=True)
        if args[0] == "python":
            args[0] = sys.executable
        elif args[0] == "hf-vit-plus":
            args[:1] = [sys.executable, "-m", "hf_vit_plus.cli"]
        result = _run(args, tmp_path, _hub_env(block.code, request), preloaded)
        assert result.returncode == 0, f"{block.id}: `{command}` failed:\n{result.stderr[-4000:]}"


def test_markers_sit_before_a_block():
    """A marker anywhere but on the line before a fence would be ignored without a word."""
    stray = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if line.strip().startswith("<!-- example:"):
                following = lines[number] if number < len(lines) else ""
                if not _MARKER.match(line.strip()) or not _FENCE.match(following):
                    stray.append(f"{page.relative_to(REPO_ROOT)}:{number}")
    assert not stray, f"example markers not directly before a ```python or ```bash block, or malformed: {stray}"
