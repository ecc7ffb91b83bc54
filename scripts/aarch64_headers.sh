#!/usr/bin/env bash
# What the aarch64 compile check of the C++ kernels needs (tests/models/test_fast_kernels.py,
# test_the_source_compiles_for_aarch64, which skips without them), best effort: Debian's cross compiler
# (g++-aarch64-linux-gnu, where apt-get runs as root) and the include/ folder of torch's aarch64 wheel of the installed
# torch's version, unpacked once into .cache/aarch64/torch-<version>/include. The wheel (~480 MB) is deleted once
# unpacked: a later run finds the folder and downloads nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! command -v aarch64-linux-gnu-g++ >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    { timeout 300 apt-get install -y -q g++-aarch64-linux-gnu \
        || { timeout 300 apt-get update -q && timeout 300 apt-get install -y -q g++-aarch64-linux-gnu; }; } \
        >/dev/null 2>&1 || echo "note: g++-aarch64-linux-gnu not installed; the aarch64 compile check will skip"
fi
version=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
target=.cache/aarch64/torch-$version
if [ ! -f "$target/include/torch/library.h" ]; then
    download=$(mktemp -d)
    # (--no-deps: the headers only; the machine's pip constraints are for installs, not for this download)
    if PIP_CONSTRAINT=/dev/null timeout 300 "$PY" -m pip download -q --disable-pip-version-check "torch==$version" \
        --platform manylinux_2_28_aarch64 --only-binary=:all: --no-deps -d "$download" >/dev/null 2>&1; then
        "$PY" - "$download" "$target" <<'PYTHON'
import shutil
import sys
import zipfile
from pathlib import Path

download, target = Path(sys.argv[1]), Path(sys.argv[2])
partial = target.with_name(target.name + ".partial")
shutil.rmtree(partial, ignore_errors=True)
with zipfile.ZipFile(next(download.glob("torch-*.whl"))) as wheel:
    wheel.extractall(partial, [name for name in wheel.namelist() if name.startswith("torch/include/")])
(partial / "torch" / "include").rename(partial / "include")
(partial / "torch").rmdir()
shutil.rmtree(target, ignore_errors=True)
partial.rename(target)
PYTHON
    else
        echo "note: torch $version's aarch64 wheel could not be downloaded; the aarch64 compile check will skip"
    fi
    rm -rf "$download"
fi
