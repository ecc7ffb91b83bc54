#!/usr/bin/env bash
# The GPU check in one command (`make gpu-check`; README, "GPU check"), for a fresh machine with a CUDA GPU and this
# repository:
#   1. creates .venv-gpu (`pip install -e ".[test]"`: the CUDA build of torch from pip's default index; with the
#      system's packages visible, so that a CUDA torch already installed is reused) and says how long that took;
#   2. runs the gpu-marked tests (`pytest -m gpu -p no:xdist tests/gpu`), with a JUnit XML report;
#   3. runs the GPU benchmarks (scripts/benchmarks/bench_gpu.py: vit, sparse, decoding), one time limit per part;
#   4. writes gpu_check.json (steps, times, test counts, what was skipped) next to the benchmarks' JSON files, in
#      $OUT, or results/gpu/ when $OUT is unset, and prints what it skipped.
# Without a CUDA GPU it says so, creates nothing, and runs the CPU fallbacks in .venv (or $PYTHON where there is no
# .venv): the gpu tests' CPU cells and `bench_gpu.py --quick --device cpu`, results in <results>/cpu-fallback/.
# The whole check keeps to a time budget (GPU_CHECK_BUDGET: 470 s with a GPU, under 8 minutes; 290 s without): each
# step's limit is cut to what is left, and a step with no time left is not run (and reported).
# Exit status: 0 when every step passed, 1 otherwise (every step runs regardless), 2 for bad settings.
#
# Settings (environment): OUT, PYTHON (python3), VENV (.venv), GPU_VENV (.venv-gpu), and the time limits in seconds
# GPU_CHECK_BUDGET, GPU_CHECK_INSTALL_TIMEOUT (240), GPU_CHECK_TESTS_TIMEOUT (200; 240 on the CPU) and
# GPU_CHECK_BENCH_TIMEOUT (60 per part; 90 for the CPU's quick run of all parts).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
START=$(date +%s)
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
GPU_VENV="${GPU_VENV:-.venv-gpu}"
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
if [[ $GPU == 1 ]]; then BUDGET="${GPU_CHECK_BUDGET:-470}"; else BUDGET="${GPU_CHECK_BUDGET:-290}"; fi
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

INSTALL_SECONDS=null
if [[ $GPU == 1 ]]; then
    echo "gpu-check: CUDA GPU(s) found:"
    nvidia-smi -L | sed 's/^/  /'
    if [[ ! -x "$GPU_VENV/bin/python" ]]; then
        "$PYTHON" -m venv --system-site-packages "$GPU_VENV" || fail_usage "could not create $GPU_VENV with $PYTHON"
        echo '*' >"$GPU_VENV/.gitignore"
    fi
    PY="$GPU_VENV/bin/python"
    if [[ "$GPU_VENV/.stamp-test" -nt pyproject.toml ]]; then
        echo "gpu-check: $GPU_VENV is installed already (pyproject.toml unchanged since): no install"
        INSTALL_SECONDS=0
    else
        began=$(date +%s)
        # few retries: where the machine is offline, the install fails in seconds and the check goes on
        step install "${GPU_CHECK_INSTALL_TIMEOUT:-240}" "$PY" -m pip install -q --disable-pip-version-check \
            --retries 2 --timeout 30 -e ".[test]"
        INSTALL_SECONDS=$(($(date +%s) - began))
        if tail -n 1 "$STEPS_FILE" | cut -f2 | grep -qx 0; then
            touch "$GPU_VENV/.stamp-test"
            echo "gpu-check: the install took ${INSTALL_SECONDS} s"
        else
            echo "gpu-check: the install failed after ${INSTALL_SECONDS} s (no network?): going on with what" \
                "$GPU_VENV sees (the system's packages, this checkout on PYTHONPATH)"
        fi
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" # the checkout, also where the editable install failed
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
    echo "gpu-check: no CUDA GPU on the local host (nvidia-smi lists none): nothing is installed; running the CPU"
    echo "gpu-check: fallbacks (the gpu tests' CPU cells, a quick CPU run of the benchmarks) into $RESULTS"
    if [[ -x "$VENV/bin/python" ]]; then
        PY="$VENV/bin/python"
    else
        PY="$PYTHON"
        echo "gpu-check: no $VENV here (make venv-test creates it): using $PYTHON"
    fi
    if ! "$PY" -c 'import torch, pytest' 2>/dev/null; then
        echo "gpu-check: $PY cannot import torch and pytest: run 'make venv-test' first" >&2
        exit 1
    fi
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
    STEP_LOG="$RESULTS/pytest_gpu.log" step "pytest -m gpu (CPU cells)" "${GPU_CHECK_TESTS_TIMEOUT:-240}" "$PY" -m \
        pytest -m gpu -p no:xdist -q -rs --junitxml="$RESULTS/pytest_gpu.xml" tests/gpu
    step "bench --quick (CPU)" "${GPU_CHECK_BENCH_TIMEOUT:-90}" "$PY" scripts/benchmarks/bench_gpu.py --quick \
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
