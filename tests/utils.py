"""Helpers shared by the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_without_package(
    code: str, cwd: Path, env: dict | None = None, timeout: int = 300, python: str | None = None
) -> dict:
    """Run `code` in a fresh Python process where `hf_vit_plus` is NOT importable (a user without the package),
    offline, with a fresh modules cache. The code must print one JSON line last; it is returned parsed.
    `python`: another interpreter (another environment's releases) instead of this one.

    The package is installed editable into the venv, so the process blocks it explicitly: an import of
    `hf_vit_plus` raises ModuleNotFoundError, as on a machine without it.
    """
    prelude = textwrap.dedent(
        """
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name == "hf_vit_plus" or name.startswith("hf_vit_plus."):
                    raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
                return None
        sys.meta_path.insert(0, _Block())
        sys.path = [p for p in sys.path if p not in ("", ".") and "hf_vit_plus" not in p]
        """
    )
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    full_env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "HF_MODULES_CACHE": str(Path(cwd) / "modules_cache"),
            "HF_HOME": str(Path(cwd) / "hf_home"),
            "PYTHONPATH": "",
            "OMP_NUM_THREADS": "1",
        }
    )
    full_env.update(env or {})
    proc = subprocess.run(
        [python or sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    last = [line for line in proc.stdout.splitlines() if line.strip()][-1]
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        raise AssertionError(f"the subprocess's last line is not JSON:\n{proc.stdout[-3000:]}") from None
