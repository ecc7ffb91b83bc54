"""The package's metadata says what is tested: pyproject's lower bounds are the releases the oldest pass installs."""

from __future__ import annotations

import importlib.metadata
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


# import name -> distribution, where the import name differs (and the distributions an extra pins only for another)
_IMPORT_NAMES = {"scikit-learn": "sklearn"}


def test_the_extras_in_pyproject_are_those_the_package_names_in_its_install_hints():
    """`hf_vit_plus.utils.extras.EXTRAS` (what a missing extra's one-line hint names) lists, by import name, exactly
    the distributions of each extra in pyproject; `all` is every extra."""
    from hf_vit_plus.utils.extras import EXTRAS

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, modules in EXTRAS.items():
        distributions = [Requirement(spec).name for spec in extras[name]]
        assert sorted(_IMPORT_NAMES.get(d, d) for d in distributions) == sorted(modules), name
    assert Requirement(extras["all"][0]).extras == set(EXTRAS)
    core = {_normalise(Requirement(spec).name) for spec in tomllib.loads(
        (REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}  # fmt: skip
    assert core.isdisjoint({"matplotlib", "tensorboard", "scikit-learn", "sacrebleu", "ninja", "torchao", "onnx"})


def test_the_version_is_written_once_and_the_release_files_agree():
    import hf_vit_plus

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hf_vit_plus.__version__"}
    version = hf_vit_plus.__version__
    assert importlib.metadata.version("hf_vit_plus") == version
    citation = (REPO_ROOT / "CITATION.cff").read_text()
    assert re.search(rf"^version: {re.escape(version)}$", citation, re.MULTILINE)
    assert f"## [{version}] - " in (REPO_ROOT / "CHANGELOG.md").read_text()
    license_text = (REPO_ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert project["project"]["license"] == "Apache-2.0"
