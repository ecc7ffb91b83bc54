"""The package's metadata says what is tested: pyproject's lower bounds are the releases the oldest pass installs."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

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


def _installed_from_this_checkout() -> bool:
    """Whether the installed hf_vit_plus distribution is this checkout (an editable install of it)."""
    import json
    from urllib.parse import unquote, urlparse

    try:
        direct = importlib.metadata.distribution("hf_vit_plus").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return False
    url = json.loads(direct or "{}").get("url", "")
    return url.startswith("file:") and Path(unquote(urlparse(url).path)).resolve() == REPO_ROOT.resolve()


def test_the_version_is_written_once_and_the_release_files_agree():
    """`__version__` is the one place; CHANGELOG's sections follow it: a development version (`0.4.0.dev0`) is the
    `[Unreleased]` section above the latest release, which it comes after; a release is the first section. CITATION.cff
    cites the latest release, with its date."""
    import hf_vit_plus

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hf_vit_plus.__version__"}
    version = Version(hf_vit_plus.__version__)
    if _installed_from_this_checkout():  # (another checkout's install has its own metadata)
        assert importlib.metadata.version("hf_vit_plus") == str(version)
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\]", changelog, re.MULTILINE)
    releases = re.findall(r"^## \[(\d[^\]]*)\] - (\d{4}-\d{2}-\d{2})$", changelog, re.MULTILINE)
    latest, released_on = releases[0]
    if version.is_devrelease:
        assert sections[0] == "Unreleased" and sections[1] == latest, sections[:2]
        assert Version(version.base_version) > Version(latest), (str(version), latest)
    else:
        assert sections[0] == latest == str(version), (sections[:1], str(version))
    citation = (REPO_ROOT / "CITATION.cff").read_text()
    assert re.search(rf"^version: {re.escape(latest)}$", citation, re.MULTILINE)
    assert re.search(rf'^date-released: "?{released_on}"?$', citation, re.MULTILINE)
    license_text = (REPO_ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert project["project"]["license"] == "Apache-2.0"


def test_the_authors_are_real_and_no_address_is_invented():
    """CITATION.cff and pyproject name the project's author (the author of its commits), not a placeholder; neither
    gives an address the project does not have yet (`project.urls`, `repository-code`)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    citation = (REPO_ROOT / "CITATION.cff").read_text()
    authors = [author["name"] for author in project["authors"]]
    assert authors and all("developers" not in name.lower() for name in authors)
    for name in authors:
        assert f"- name: {name}" in citation
    assert "urls" not in project and "repository-code" not in citation


def test_the_build_requirements_and_the_metadata_users_search():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    setuptools = next(Requirement(r) for r in project["build-system"]["requires"] if r.startswith("setuptools"))
    # 77 reads the SPDX licence expression: setuptools 70 failed ("project.license must be valid exactly by one
    # definition")
    assert setuptools.specifier.contains("77.0.0") and not setuptools.specifier.contains("76.9")
    classifiers = project["project"]["classifiers"]
    assert "Typing :: Typed" in classifiers and any(c.startswith("Topic :: ") for c in classifiers)
    assert not any(c.startswith("License :: ") for c in classifiers)  # PEP 639: the SPDX expression replaces them
    floor = Version(re.search(r">=\s*([\d.]+)", project["project"]["requires-python"]).group(1))
    versions = (re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c) for c in classifiers)
    pythons = [match.group(1) for match in versions if match]
    assert pythons and min(Version(v) for v in pythons) == floor
    assert len(project["project"]["keywords"]) >= 5
    assert (REPO_ROOT / "hf_vit_plus" / "py.typed").is_file()
    assert not (REPO_ROOT / "_hf_vit_plus_cli.py").exists()  # no private module at the top of site-packages


def test_the_wheel_installs_one_package_its_typing_marker_and_the_command(tmp_path):
    """The wheel setuptools builds from this checkout (PEP 517, the installed setuptools, no network): only
    `hf_vit_plus/` and its dist-info at the top, `py.typed` inside, the SPDX licence and its file, classifiers,
    keywords, and the command pointing into the package."""
    import shutil
    import subprocess
    import sys
    import zipfile

    setuptools_version = Version(importlib.metadata.version("setuptools"))
    if setuptools_version < Version("77"):
        pytest.skip(f"setuptools {setuptools_version} cannot build this pyproject (77 or newer)")
    source = tmp_path / "source"  # a copy: a build writes build/ and *.egg-info next to the sources
    shutil.copytree(REPO_ROOT / "hf_vit_plus", source / "hf_vit_plus",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO_ROOT / name, source / name)
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    built = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=source, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = tmp_path / "dist" / built.stdout.strip().splitlines()[-1]
    import hf_vit_plus

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"hf_vit_plus-{hf_vit_plus.__version__}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert {name.split("/")[0] for name in names} == {"hf_vit_plus", info}, sorted({n.split("/")[0] for n in names})
    assert "hf_vit_plus/py.typed" in names and "hf_vit_plus/models/fast_kernels.cpp" in names
    assert f"{info}/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in metadata and "Classifier: Typing :: Typed" in metadata
    assert "Keywords: " in metadata
    assert "hf-vit-plus = hf_vit_plus.cli:main" in entry_points
