#!/usr/bin/env bash
# The GPU check in one command (`make gpu-check`; docs/contributing/testing.md, "The GPU check"), on a fresh checkout:
#   1. the environment. With a CUDA GPU: .venv-gpu, a venv over $PYTHON's packages (the lent machine's image: its CUDA
#      torch, transformers, ...), into which the package and what the image lacks are installed offline from
#      wheelhouse/ (`make gpu-wheelhouse`, carried along with the checkout), or from the index where there is no
#      wheelhouse/. Without one: .venv when it is installed, else the same overlay venv where wheelhouse/ is here, else
#      a new .venv (`make venv-test`); the CPU needs no other command first;
#   2. runs the gpu-marked tests (`pytest -m gpu -p no:xdist tests/gpu`), with a JUnit XML report (on the CPU: their
#      CPU cells);
#   3. runs the GPU benchmarks (scripts/benchmarks/bench_gpu.py: vit, sparse, decoding), one time limit per part (on
#      the CPU: `bench_gpu.py --quick --device cpu`);
#   4. writes gpu_check.json (steps, times, test counts, what was skipped) next to the benchmarks' JSON files, in
#      $OUT, or results/gpu/ when $OUT is unset (results/gpu/cpu-fallback/ on the CPU, ignored by git), and prints
#      what it skipped.
# The whole check keeps to a time budget (GPU_CHECK_BUDGET: 390 s with a GPU, install included; 540 s without, install
# excluded: the CPU builds the fast decoding kernels' C++ extension on its first run): each step's limit is cut to what is left, and a step with no time left is not run (and reported).
# Exit status: 0 when every step passed, 1 otherwise (every step runs regardless), 2 for bad settings.
#
# Settings (environment): OUT, PYTHON (python3), VENV (.venv), GPU_VENV (.venv-gpu), WHEELHOUSE (wheelhouse), and
# the time limits in seconds GPU_CHECK_BUDGET, GPU_CHECK_INSTALL_TIMEOUT (240), GPU_CHECK_TESTS_TIMEOUT (200; 300 on
# the CPU) and GPU_CHECK_BENCH_TIMEOUT (60 per part; 200 for the CPU's quick run of all parts).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
START=$(date +%s)
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
GPU_VENV="${GPU_VENV:-.venv-gpu}"
WHEELHOUSE="${WHEELHOUSE:-wheelhouse}"
export HF_HOME="${HF_HOME:-$PWD/.cache/hf}" HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_HUB_DISABLE_TELEMETRY=1
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

fail_usage() {
    echo "gpu-check: $*" >&2
    exit 2
}

for name in GPU_CHECK_BUDGET GPU_CHECK_INSTALL_TIMEOUT GPU_CHECK_TESTS_TIMEOUT GPU_CHECK_BENCH_TIMEOUT; do
    value="${!name:-}"
    if [[ -n "$value" && ! "$value" =~ ^[1-9][0-9]*$ ]]; then
        fail_usage "$name must be a whole number of seconds (at least 1), got '$value'"
    fi
done
command -v timeout >/dev/null || fail_usage "needs the 'timeout' command (GNU coreutils)"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    GPU=1
    RESULTS="${OUT:-results/gpu}"
else
    GPU=0
    RESULTS="${OUT:-results/gpu/cpu-fallback}" # not next to a GPU's results
fi
if [[ $GPU == 1 ]]; then BUDGET="${GPU_CHECK_BUDGET:-390}"; else BUDGET="${GPU_CHECK_BUDGET:-540}"; fi
DEADLINE=$((START + BUDGET))
mkdir -p "$RESULTS" 2>/dev/null || fail_usage "cannot create the results folder $RESULTS"
[[ -w "$RESULTS" ]] || fail_usage "the results folder $RESULTS is not writable"
if [[ $GPU == 0 && -z "${OUT:-}" && ! -e "$RESULTS/.gitignore" ]]; then
    echo '*' >"$RESULTS/.gitignore" # a CPU machine's check results are not GPU results: kept out of git
fi
STEPS_FILE="$RESULTS/.gpu_check_steps.tsv"
: >"$STEPS_FILE"

# step NAME LIMIT COMMAND...: run COMMAND under a time limit (cut to what is left of the check's budget), say how it
# went, record it for gpu_check.json. With STEP_LOG set, the output is also written to that file (kept when a time
# limit stops the command before it writes its reports).
step() {
    local name="$1" limit="$2" began status seconds remaining
    shift 2
    remaining=$((DEADLINE - $(date +%s)))
    echo
    if ((remaining < 15)); then
        echo "=== $name: NOT RUN: the check's time budget (${BUDGET} s) is spent"
        printf '%s\t%s\t%s\t%s\n' "$name" "-" 0 0 >>"$STEPS_FILE"
        return 0
    fi
    ((limit > remaining)) && limit=$remaining
    echo "=== $name (limit ${limit} s)"
    began=$(date +%s)
    if [[ -n "${STEP_LOG:-}" ]]; then
        timeout --kill-after=15 "$limit" "$@" 2>&1 | tee "$STEP_LOG"
        status=${PIPESTATUS[0]}
    else
        timeout --kill-after=15 "$limit" "$@"
        status=$?
    fi
    seconds=$(($(date +%s) - began))
    if [[ $status == 0 ]]; then
        echo "=== $name: passed in ${seconds} s"
    elif [[ $status == 124 || $status == 137 ]]; then
        echo "=== $name: STOPPED at its time limit (${limit} s)"
    else
        echo "=== $name: FAILED (exit status $status) after ${seconds} s"
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$seconds" "$limit" >>"$STEPS_FILE"
    return 0
}

# overlay_venv DIR: a venv over $PYTHON's packages (--system-site-packages). Where $PYTHON is itself a venv's (the
# image's python3 is /opt/torch/.venv/bin/python3), the new venv would see the base interpreter's packages instead of
# that venv's (its CUDA torch): a .pth file adds that venv's site-packages after the new venv's own.
overlay_venv() {
    local dir="$1" parent child
    [[ -x "$dir/bin/python" ]] && return 0
    "$PYTHON" -m venv --system-site-packages "$dir" || fail_usage "could not create $dir with $PYTHON"
    echo '*' >"$dir/.gitignore"
    parent=$("$PYTHON" -c 'import site, sys
if sys.prefix != sys.base_prefix:
    print("\n".join(site.getsitepackages()))')
    if [[ -n "$parent" ]]; then
        child=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        printf '%s\n' "$parent" >"$child/_gpu_check_parent_venv.pth"
    fi
}

# install_into VENV_DIR: the package and what it needs. From wheelhouse/ (`make gpu-wheelhouse`) with --no-index where
# it holds the package's wheel: the lent machine has no network, and takes what its image holds from the image; else
# `pip install -e ".[test]"` from the index. Skipped when VENV_DIR was installed since pyproject.toml (and the
# wheelhouse) last changed.
install_into() {
    local dir="$1" py="$1/bin/python" began wheel=""
    wheel=$(ls "$WHEELHOUSE"/hf_vit_plus-*.whl 2>/dev/null | tail -n 1)
    if [[ "$dir/.stamp-test" -nt pyproject.toml && (-z "$wheel" || "$dir/.stamp-test" -nt "$wheel") ]]; then
        echo "gpu-check: $dir is installed already (pyproject.toml and $WHEELHOUSE/ unchanged since): no install"
        INSTALL_SECONDS=0
        return 0
    fi
    began=$(date +%s)
    if [[ -n "$wheel" ]]; then
        echo "gpu-check: installing from $WHEELHOUSE/ (offline): $(basename "$wheel") and what $PYTHON lacks"
        step install "${GPU_CHECK_INSTALL_TIMEOUT:-240}" "$py" -m pip install -q --disable-pip-version-check \
            --no-index --find-links "$WHEELHOUSE" "$wheel"
    else
        echo "gpu-check: no $WHEELHOUSE/ (make gpu-wheelhouse writes it): installing from the package index"
        # few retries: where the machine is offline, the install fails in seconds and the check goes on
        step install "${GPU_CHECK_INSTALL_TIMEOUT:-240}" "$py" -m pip install -q --disable-pip-version-check \
            --retries 2 --timeout 30 -e ".[test]"
    fi
    INSTALL_SECONDS=$(($(date +%s) - began))
    if tail -n 1 "$STEPS_FILE" | cut -f2 | grep -qx 0; then
        touch "$dir/.stamp-test"
        echo "gpu-check: the install took ${INSTALL_SECONDS} s"
    else
        echo "gpu-check: the install failed after ${INSTALL_SECONDS} s: going on with what $dir sees (the" \
            "packages of $PYTHON, this checkout on PYTHONPATH)"
    fi
}

INSTALL_SECONDS=null
if [[ $GPU == 1 ]]; then
    echo "gpu-check: CUDA GPU(s) found:"
    nvidia-smi -L | sed 's/^/  /'
    overlay_venv "$GPU_VENV"
    install_into "$GPU_VENV"
    PY="$GPU_VENV/bin/python"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" # this checkout's code, whatever the install put beside it
    if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        echo "gpu-check: torch in $GPU_VENV cannot use the GPU (or is missing):"
        "$PY" -c 'import torch; print("  torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -n 2
        printf '%s\t%s\t%s\t%s\n' "torch sees the GPU" 1 0 0 >>"$STEPS_FILE"
    else
        "$PY" -c 'import torch; print("gpu-check: torch", torch.__version__, "CUDA", torch.version.cuda, "on",
                  torch.cuda.get_device_name(0), "x", torch.cuda.device_count())'
        STEP_LOG="$RESULTS/pytest_gpu.log" step "pytest -m gpu" "${GPU_CHECK_TESTS_TIMEOUT:-200}" "$PY" -m pytest \
            -m gpu -p no:xdist -v -rs --durations=15 --junitxml="$RESULTS/pytest_gpu.xml" tests/gpu
        step "bench vit" "${GPU_CHECK_BENCH_TIMEOUT:-60}" "$PY" scripts/benchmarks/bench_gpu.py --parts vit \
            --repeats 3 --out_dir "$RESULTS"
        step "bench sparse" "${GPU_CHECK_BENCH_TIMEOUT:-60}" "$PY" scripts/benchmarks/bench_gpu.py --parts sparse \
            --repeats 3 --lengths 4096 16384 --out_dir "$RESULTS"
        step "bench decoding" "${GPU_CHECK_BENCH_TIMEOUT:-60}" "$PY" scripts/benchmarks/bench_gpu.py \
            --parts decoding --repeats 3 --out_dir "$RESULTS"
    fi
else
    echo "gpu-check: no CUDA GPU on the local host (nvidia-smi lists none): running the CPU fallbacks (the gpu tests'"
    echo "gpu-check: CPU cells, a quick CPU run of the benchmarks) into $RESULTS"
    needs='import torch, pytest, datasets'
    if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "$needs" 2>/dev/null; then
        PY="$VENV/bin/python"
    elif ls "$WHEELHOUSE"/hf_vit_plus-*.whl >/dev/null 2>&1; then
        # as on the lent machine: a venv over $PYTHON's packages, and what they lack from the wheelhouse
        overlay_venv "$GPU_VENV"
        install_into "$GPU_VENV"
        PY="$GPU_VENV/bin/python"
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "gpu-check: no usable $VENV and no $WHEELHOUSE/: creating $VENV (make venv-test)"
        make --no-print-directory venv-test VENV="$VENV" PYTHON="$PYTHON" || {
            echo "gpu-check: could not create $VENV (make venv-test failed)" >&2
            exit 1
        }
        PY="$VENV/bin/python"
    fi
    # The install is not part of the CPU check's budget (a fresh .venv downloads torch); the checks are.
    DEADLINE=$(($(date +%s) + BUDGET))
    if ! "$PY" -c "$needs" 2>/dev/null; then
        echo "gpu-check: $PY cannot import torch, pytest and datasets:" >&2
        "$PY" -c "$needs" 2>&1 | tail -n 1 >&2
        exit 1
    fi
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
    STEP_LOG="$RESULTS/pytest_gpu.log" step "pytest -m gpu (CPU cells)" "${GPU_CHECK_TESTS_TIMEOUT:-300}" "$PY" -m \
        pytest -m gpu -p no:xdist -q -rs --junitxml="$RESULTS/pytest_gpu.xml" tests/gpu
    step "bench --quick (CPU)" "${GPU_CHECK_BENCH_TIMEOUT:-200}" "$PY" scripts/benchmarks/bench_gpu.py --quick \
        --device cpu --out_dir "$RESULTS"
fi

# gpu_check.json, and what was skipped
GPU="$GPU" RESULTS="$RESULTS" BUDGET="$BUDGET" INSTALL_SECONDS="$INSTALL_SECONDS" TOTAL=$(($(date +%s) - START)) \
    "${PY:-$PYTHON}" - <<'EOF'
import collections, json, os, platform, subprocess, xml.etree.ElementTree as ET
from pathlib import Path

results = Path(os.environ["RESULTS"])
steps = []
for line in (results / ".gpu_check_steps.tsv").read_text().splitlines():
    name, status, seconds, limit = line.split("\t")
    outcome = {"0": "passed", "124": "stopped at its time limit", "137": "stopped at its time limit",
               "-": "not run: the time budget was spent"}.get(status, "failed")
    steps.append({"name": name, "exit_status": None if status == "-" else int(status), "outcome": outcome,
                  "seconds": int(seconds),
                  "limit_s": int(limit)})
summary = {"gpu": os.environ["GPU"] == "1", "python": platform.python_version(),
           "budget_s": int(os.environ["BUDGET"]), "install_s": json.loads(os.environ["INSTALL_SECONDS"]),
           "total_s": int(os.environ["TOTAL"]), "steps": steps}
try:
    import torch
    summary["torch"], summary["cuda"] = torch.__version__, torch.version.cuda
    if torch.cuda.is_available():
        summary["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
except ImportError:
    pass
skipped = []
junit = results / "pytest_gpu.xml"
if junit.is_file():
    counts, reasons = collections.Counter(), collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        counts["tests"] += 1
        for kind in ("failure", "error", "skipped"):
            for element in case.findall(kind):
                counts[kind] += 1
                if kind == "skipped":
                    reasons[element.get("message", "").removeprefix("SKIPPED ").strip() or "?"] += 1
    passed = counts["tests"] - counts["failure"] - counts["error"] - counts["skipped"]
    summary["pytest"] = {"tests": counts["tests"], "passed": passed, "failed": counts["failure"],
                         "errors": counts["error"], "skipped": counts["skipped"], "skip_reasons": dict(reasons)}
    skipped += [f"{n} test(s): {reason}" for reason, n in reasons.items()]
summary["benchmarks"] = {}
for path in sorted(results.glob("bench_gpu_*.json")):
    data = json.loads(path.read_text())
    summary["benchmarks"][data["part"]] = {"file": path.name, "rows": len(data["rows"]), "skipped": data["skipped"],
                                           "failed": data["failed"], "seconds": data.get("seconds")}
    skipped += [f"bench {data['part']}: {s['what']}: {s['why']}" for s in data["skipped"]]
skipped += [f"step '{s['name']}': {s['outcome']}" for s in steps if s["exit_status"] != 0]
summary["skipped"] = skipped
(results / "gpu_check.json").write_text(json.dumps(summary, indent=1) + "\n")
print()
print(f"gpu-check: {'GPU' if summary['gpu'] else 'CPU fallbacks'} in {summary['total_s']} s; results in {results}/")
for s in steps:
    print(f"  {s['name']}: {s['outcome']} ({s['seconds']} s)")
if "pytest" in summary:
    p = summary["pytest"]
    print(f"  tests: {p['passed']} passed, {p['skipped']} skipped, {p['failed']} failed, {p['errors']} errors")
print("gpu-check: skipped or not done:" if skipped else "gpu-check: nothing skipped")
for line in skipped:
    print(f"  - {line}")
EOF
rm -f "$STEPS_FILE"
[[ -f "$RESULTS/gpu_check.json" ]] || exit 1
"${PY:-$PYTHON}" -c 'import json, sys
sys.exit(0 if all(step["exit_status"] == 0 for step in json.load(open(sys.argv[1]))["steps"]) else 1)' \
    "$RESULTS/gpu_check.json"
