#!/usr/bin/env bash
# `make gpu-rehearsal`: `make gpu-check` as the lent GPU machine runs it, rehearsed on this CPU machine.
#
#   1. a Python 3.12 venv standing in for the machine's image (IMAGE_VENV, .venv-image): the first block of
#      .ci/gpu-image.txt, the image's releases (torch 2.11.0, transformers 5.17.0, huggingface_hub 1.33.0, ...) and,
#      like the image, no datasets, evaluate, dill or multiprocess;
#   2. wheelhouse/ (`make gpu-wheelhouse`: the package's wheel and what the image lacks);
#   3. a fresh copy of this checkout (its tracked files and the untracked ones git does not ignore: what the device
#      tool sends), with wheelhouse/ beside them and no .venv;
#   4. there, `PIP_NO_INDEX=1 make gpu-check PYTHON=<the image venv's python>`: the check builds its venv over the
#      image's packages, installs offline from wheelhouse/, and runs the gpu tests' CPU cells and the benchmarks'
#      CPU fallbacks. It must exit 0, with tests run and none failed, and every benchmark part written.
#
# Needs the package registry (steps 1 and 2) and a Python 3.12 (PYTHON312, else python3.12 or pyenv's 3.12).
# Settings (environment): PYTHON312, IMAGE_VENV (.venv-image), KEEP_REHEARSAL (1: keep the copy, and say where).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
IMAGE_VENV="${IMAGE_VENV:-.venv-image}"
IMAGE_LIST=.ci/gpu-image.txt

find_python312() {
    local candidate
    for candidate in "${PYTHON312:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        [[ -n "$candidate" ]] || continue
        if "$candidate" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

if [[ ! -x "$IMAGE_VENV/bin/python" || ! "$IMAGE_VENV/.stamp-image" -nt "$IMAGE_LIST" ]]; then
    python312=$(find_python312) || {
        echo "gpu-rehearsal: needs a Python 3.12 (the image's): set PYTHON312, or install python3.12" >&2
        exit 1
    }
    echo "gpu-rehearsal: creating $IMAGE_VENV with $python312 and the image's releases ($IMAGE_LIST)"
    rm -rf "$IMAGE_VENV"
    "$python312" -m venv "$IMAGE_VENV"
    echo '*' >"$IMAGE_VENV/.gitignore"
    "$IMAGE_VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
    sed '/^# ---/q' "$IMAGE_LIST" | grep -v '^#' >"$IMAGE_VENV/image-requirements.txt"
    PIP_CONSTRAINT=/dev/null "$IMAGE_VENV/bin/python" -m pip install -q --disable-pip-version-check \
        -r "$IMAGE_VENV/image-requirements.txt" 2>&1 | { grep -v "is ignored: it is neither" || true; }
    [[ ${PIPESTATUS[0]} == 0 ]] || exit 1
    touch "$IMAGE_VENV/.stamp-image"
fi
if "$IMAGE_VENV/bin/python" -c 'import datasets' 2>/dev/null || "$IMAGE_VENV/bin/python" -c 'import evaluate' 2>/dev/null
then
    echo "gpu-rehearsal: $IMAGE_VENV holds datasets or evaluate, which the image does not: remove it and rerun" >&2
    exit 1
fi
"$IMAGE_VENV/bin/python" -c 'import torch, transformers, huggingface_hub as hub
print(f"gpu-rehearsal: the image stand-in: torch {torch.__version__}, transformers {transformers.__version__},",
      f"huggingface_hub {hub.__version__}")'

image_python="$(cd "$IMAGE_VENV" && pwd)/bin/python"
bash scripts/gpu_wheelhouse.sh

# A user's `pip install` of the package (all its extras) into such an environment keeps the releases it holds: the
# resolver, free to use the index, upgrades none of them.
wheel=$(ls wheelhouse/hf_vit_plus-*.whl)
PIP_CONSTRAINT=/dev/null "$image_python" -m pip install -q --disable-pip-version-check --dry-run \
    --report "$IMAGE_VENV/install-report.json" "$wheel[test]" 2>&1 | grep -v "is ignored: it is neither" || true
"$image_python" - "$IMAGE_VENV/install-report.json" <<'EOF'
import json, sys
kept = {"torch", "torchvision", "transformers", "huggingface-hub", "accelerate", "tokenizers", "safetensors"}
changed = sorted(f"{item['metadata']['name']} {item['metadata']['version']}"
                 for item in json.load(open(sys.argv[1]))["install"]
                 if item["metadata"]["name"].lower().replace("_", "-") in kept)
if changed:
    sys.exit(f"gpu-rehearsal: FAILED: pip install of the package would replace the image's {', '.join(changed)}")
print("gpu-rehearsal: pip install of the package with its test extras keeps the image's torch, torchvision, "
      "transformers, huggingface_hub, accelerate, tokenizers and safetensors")
EOF

copy=$(mktemp -d "${TMPDIR:-/tmp}/gpu-rehearsal.XXXXXX")
if [[ "${KEEP_REHEARSAL:-0}" == 1 ]]; then
    echo "gpu-rehearsal: the copy stays in $copy"
else
    trap 'rm -rf "$copy"' EXIT
fi
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' path; do
    [[ -e "$path" ]] && printf '%s\0' "$path"
done | tar --null -T - -cf - | tar -xf - -C "$copy"
cp -r wheelhouse "$copy/wheelhouse"
echo "gpu-rehearsal: a fresh copy of this checkout with wheelhouse/ in $copy; running make gpu-check there offline"

status=0
(
    cd "$copy"
    env -u VIRTUAL_ENV -u PYTHONPATH -u OUT PIP_NO_INDEX=1 PIP_CONSTRAINT=/dev/null HF_HOME="$copy/.cache/hf" \
        make --no-print-directory gpu-check PYTHON="$image_python"
) || status=$?
summary="$copy/results/gpu/cpu-fallback/gpu_check.json"
if [[ ! -f "$summary" ]]; then
    echo "gpu-rehearsal: FAILED: make gpu-check exited $status and wrote no gpu_check.json" >&2
    exit 1
fi
"$IMAGE_VENV/bin/python" - "$summary" "$status" <<'EOF'
import json, sys

summary, status = json.load(open(sys.argv[1])), int(sys.argv[2])
tests = summary.get("pytest", {})
parts = summary.get("benchmarks", {})
problems = []
if status != 0:
    problems.append(f"make gpu-check exited {status}")
if summary["gpu"]:
    problems.append("it ran as on a GPU")
if not tests.get("passed"):
    problems.append("no gpu test passed")
if tests.get("failed") or tests.get("errors"):
    problems.append(f"{tests.get('failed')} gpu test(s) failed, {tests.get('errors')} error(s)")
if sorted(parts) != ["decoding", "sparse", "vit"] or any(part["failed"] for part in parts.values()):
    problems.append(f"benchmark parts: {parts}")
install = next((step for step in summary["steps"] if step["name"] == "install"), None)
if install is None or install["exit_status"] != 0:
    problems.append("the offline install from wheelhouse/ did not run or failed")
print(f"gpu-rehearsal: install {summary['install_s']} s; tests: {tests.get('passed')} passed, "
      f"{tests.get('skipped')} skipped, {tests.get('failed')} failed; benchmarks: {', '.join(sorted(parts))}; "
      f"{summary['total_s']} s in all")
if problems:
    print("gpu-rehearsal: FAILED: " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
print("gpu-rehearsal: passed")
EOF
