"""The lists of test files that the Makefile and the conftest name: a file renamed or removed would drop out of them
without a word (the distributed tests would run on the xdist workers, a long file would be handed out last)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import LONGEST_FILES, pytest_collection_modifyitems

REPO = Path(__file__).resolve().parents[1]


def _makefile_list(name: str) -> list[str]:
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(rf"^{name} := (.+)$", text, flags=re.MULTILINE)
    assert match, name
    return match.group(1).split()


def test_every_file_that_the_makefile_and_the_conftest_name_exists():
    named = {
        "LONGEST_FILES": list(LONGEST_FILES),
        "DISTRIBUTED_TESTS": _makefile_list("DISTRIBUTED_TESTS"),
        "GENERIC_TESTS": [entry.split("::")[0] for entry in _makefile_list("GENERIC_TESTS")],
        "NEWEST_ONLY_TESTS": _makefile_list("NEWEST_ONLY_TESTS"),
    }
    missing = {list_: [path for path in paths if not (REPO / path).is_file()] for list_, paths in named.items()}
    assert all(len(paths) >= 4 for paths in named.values()), named
    assert not any(missing.values()), missing


def test_the_longest_files_are_collected_first_and_the_rest_keep_their_order():
    ids = ["tests/a.py::t1", f"{LONGEST_FILES[1]}::t1", "tests/b.py::t1", f"{LONGEST_FILES[0]}::t2",
           "tests/a.py::t2", f"{LONGEST_FILES[0]}::t1"]  # fmt: skip
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == [
        f"{LONGEST_FILES[0]}::t2", f"{LONGEST_FILES[0]}::t1", f"{LONGEST_FILES[1]}::t1",
        "tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2",
    ]  # fmt: skip
