"""The package's metadata says what is tested: pyproject's lower bounds are the releases the oldest pass installs."""

from __future__ import annotations

import re

import pytest
from packaging.requirements import Requirement

from tests.utils import REPO_ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PINNED = ("torch", "torchvision", "transformers", "accelerate", "huggingface_hub", "datasets", "evaluate",
          "tokenizers", "safetensors")  # fmt: skip


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _oldest_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / ".ci" / "constraints-oldest.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[_normalise(name)] = version.strip()
    return pins


def _lower_bounds() -> dict[str, str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    bounds = {}
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        for clause in requirement.specifier:
            if clause.operator == ">=":
                bounds[_normalise(requirement.name)] = clause.version
    return bounds


def test_the_lower_bounds_are_exactly_what_the_oldest_pass_installs():
    pins, bounds = _oldest_pins(), _lower_bounds()
    assert set(pins) == {_normalise(name) for name in PINNED}
    assert {name: bounds.get(name) for name in pins} == pins


def test_the_readme_states_the_tested_range():
    readme = (REPO_ROOT / "README.md").read_text()
    pins = _oldest_pins()
    section = readme[readme.index("## Supported releases") :]
    for name in ("transformers", "torch", "accelerate", "datasets", "huggingface-hub"):
        assert pins[name] in section.split("##")[1], f"README's 'Supported releases' does not name {name} {pins[name]}"
