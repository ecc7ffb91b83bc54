"""The suite's own helpers (tests/utils.py) do what their tests rely on, wherever the checkout lies."""

from __future__ import annotations

import importlib.util
import shutil
import sys

from tests.utils import REPO_ROOT


def test_the_package_block_hides_the_package_and_nothing_else_in_a_checkout_named_hf_vit_plus(tmp_path):
    """A checkout cloned as the README says (`git clone ... hf_vit_plus`) holds its venv's site-packages under a path
    that contains the package's name: the block of `run_without_package` (and of the Space tests) hides the package,
    by name and by its own folders, and leaves such a site-packages importable."""
    checkout = tmp_path / "hf_vit_plus"
    (checkout / "tests").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "tests" / "utils.py", checkout / "tests" / "utils.py")  # the helper, run from there
    (checkout / "hf_vit_plus").mkdir()
    (checkout / "hf_vit_plus" / "__init__.py").write_text("")
    (checkout / "hf_vit_plus" / "sibling_of_the_modules.py").write_text("")
    site_packages = checkout / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = site_packages / "site-packages"
    site_packages.mkdir(parents=True)
    (site_packages / "dependency_of_the_checkout.py").write_text("VALUE = 7\n")

    spec = importlib.util.spec_from_file_location("checkout_test_utils", checkout / "tests" / "utils.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    assert helper.REPO_ROOT == checkout.resolve()

    code = """
        import json, sys
        import dependency_of_the_checkout, packaging.version
        blocked = []
        for name in ("hf_vit_plus", "hf_vit_plus.models", "sibling_of_the_modules"):
            try:
                __import__(name)
            except ModuleNotFoundError:
                blocked.append(name)
        print(json.dumps({"value": dependency_of_the_checkout.VALUE, "file": dependency_of_the_checkout.__file__,
                          "blocked": blocked, "path": sys.path}))
    """
    # The checkout's site-packages, the checkout itself and its package folder are all on the path.
    pythonpath = f"{site_packages}:{checkout}:{checkout / 'hf_vit_plus'}"
    result = helper.run_without_package(code, cwd=tmp_path, env={"PYTHONPATH": pythonpath}, timeout=120)
    assert result["value"] == 7 and result["file"].startswith(str(site_packages)), result
    assert result["blocked"] == ["hf_vit_plus", "hf_vit_plus.models", "sibling_of_the_modules"], result
    assert str(site_packages) in result["path"] and str(checkout) not in result["path"], result["path"]
