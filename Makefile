# All set-up happens here: `make demo` and `make test` create .venv on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# Isolated caches and no Hub traffic: nothing in the demo or the tests needs the network.
export HF_HOME ?= $(CURDIR)/.cache/hf
export HF_HUB_DISABLE_TELEMETRY := 1
export HF_HUB_DISABLE_XET := 1
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM := false
PYTEST_ARGS ?= -n 2 --dist loadfile --durations=15

.PHONY: demo test test-learning test-oldest test-slow test-deepspeed test-generic aarch64-headers lint format bench \
	bench-import clean venv venv-test env gpu-check gpu-wheelhouse gpu-rehearsal docs docs-serve results screenshots

# The oldest releases the package supports (pyproject's lower bounds), in an environment of their own.
OLDEST_VENV ?= .venv-oldest
OLDEST_CONSTRAINTS := .ci/constraints-oldest.txt

# The demo trains (the [train] extra: TensorBoard, the digits, the card's figures); the tests need every extra.
$(VENV)/.stamp-base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[train]"
	touch $@

$(VENV)/.stamp-test: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[test]"
	touch $(VENV)/.stamp-base $@

$(OLDEST_VENV)/.stamp-test: pyproject.toml $(OLDEST_CONSTRAINTS)
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip --disable-pip-version-check install -q --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip --disable-pip-version-check install -q -c $(OLDEST_CONSTRAINTS) -e ".[test]"
	touch $@

# The docs site's tools (the [docs] extra: mkdocs, Material, mkdocstrings), beside whatever else .venv holds.
$(VENV)/.stamp-docs: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[docs]"
	touch $@

venv: $(VENV)/.stamp-base
venv-test: $(VENV)/.stamp-test

demo: $(VENV)/.stamp-base
	$(VENV)/bin/hf-vit-plus demo --output_dir outputs/demo

# The multi-process tests fork (accelerate.debug_launcher), which torch refuses in a process that already ran
# autograd: they run first, in a fresh interpreter of their own; the rest runs on 2 pytest-xdist workers.
# test_training_deepspeed.py is skipped unless deepspeed is installed (`make test-deepspeed`).
DISTRIBUTED_TESTS := tests/training/test_training_distributed.py tests/training/test_training_fsdp.py \
	tests/training/test_training_deepspeed.py tests/training/test_fsdp_ram_efficient_loading.py \
	tests/training/test_streaming_distributed.py
test: $(VENV)/.stamp-test
	$(VENV)/bin/hf-vit-plus env
	OMP_NUM_THREADS=1 $(PY) -m pytest -p no:xdist -q $(DISTRIBUTED_TESTS)
	OMP_NUM_THREADS=1 $(PY) -m pytest $(PYTEST_ARGS) $(addprefix --ignore=,$(DISTRIBUTED_TESTS)) tests

# The same suite on the oldest supported releases (see README, "Supported releases"). Where .venv exists too, the
# checkpoints saved under one environment's transformers are also run under the other's (tests/test_compat.py).
# Left out there: the docs' code blocks and the benchmark scripts' and GPU check's tests (NEWEST_ONLY_TESTS), which
# check the documentation and the developers' tools on the releases they are written for; what they call is tested
# on the oldest releases by the rest of the suite, and `make gpu-rehearsal` runs the GPU check on the image's
# releases (the oldest torch and transformers).
NEWEST_ONLY_TESTS := tests/test_doc_examples.py tests/scripts/test_bench_result_files.py \
	tests/scripts/test_bench_translate_file.py tests/scripts/test_gpu_check.py
test-oldest: $(OLDEST_VENV)/.stamp-test
	$(OLDEST_VENV)/bin/hf-vit-plus env
	OMP_NUM_THREADS=1 $(OLDEST_VENV)/bin/python -m pytest -p no:xdist -q $(DISTRIBUTED_TESTS)
	OMP_NUM_THREADS=1 HF_VIT_PLUS_OTHER_PYTHON=$(if $(wildcard $(PY)),$(abspath $(PY)),) \
		$(OLDEST_VENV)/bin/python -m pytest $(PYTEST_ARGS) $(addprefix --ignore=,$(DISTRIBUTED_TESTS) $(NEWEST_ONLY_TESTS)) \
		tests

env: $(VENV)/.stamp-base
	$(VENV)/bin/hf-vit-plus env

# DeepSpeed ZeRO-2/3 on 2 CPU processes (README, "Sharded training"): not in the test extras, since importing
# deepspeed builds ops on first use and slows every run that imports it.
test-deepspeed: $(VENV)/.stamp-test
	$(VENV)/bin/pip install -q deepspeed
	OMP_NUM_THREADS=1 $(PY) -m pytest -p no:xdist -q tests/training/test_training_deepspeed.py tests/training/test_fsdp_ram_efficient_loading.py

# Defaults that learn (tests/training/test_default_recipes.py): every family's default run over 2 seeds x 1 and 2
# threads against its target; each matrix runs its one-thread cells two at a time itself (no pytest-xdist).
test-learning: $(VENV)/.stamp-test
	$(PY) -m pytest -m learning -p no:xdist -q --durations=10 tests/training/test_default_recipes.py

# The fast decoding engine's token-for-token checks with the C++ kernels on their portable paths
# (HF_VIT_PLUS_CPU_ISA=generic: what ARM64 and x86 without AVX2 run), on the CPU at hand; the kernels' own tests run
# every level in `make test` (tests/models/test_fast_kernels.py).
GENERIC_TESTS := tests/models/test_decoding_engines.py::test_every_engine_gives_the_tokens_of_eager_generate \
	tests/models/test_fast_decoding.py::test_marian_options_and_pre_norm \
	tests/models/test_fast_decoding.py::test_fast_decoding_generate_runs_the_encoder_and_gives_the_tokens_of_generate \
	tests/models/test_fast_kernels.py::test_the_engine_runs_the_paths_of_the_cap
test-generic: $(VENV)/.stamp-test
	HF_VIT_PLUS_CPU_ISA=generic OMP_NUM_THREADS=1 $(PY) -m pytest -p no:xdist -q -k fast $(GENERIC_TESTS)

# The aarch64 compile check's cross compiler and torch's aarch64 headers (scripts/aarch64_headers.sh), best effort,
# downloaded once into .cache/aarch64/: `make test` then runs the check (it skips without them).
aarch64-headers: $(VENV)/.stamp-test
	PY=$(PY) bash scripts/aarch64_headers.sh

test-slow: $(VENV)/.stamp-test
	$(PY) -m pytest -m slow tests

lint: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .


# The site (mkdocs.yml, docs/) into site/: the command-line reference is regenerated from the parsers first, and the
# build is strict, so a broken link, a missing page or a docstring mkdocstrings cannot read fails it.
export NO_MKDOCS_2_WARNING := 1
docs: $(VENV)/.stamp-docs
	$(PY) scripts/docs/cli_reference.py
	$(VENV)/bin/mkdocs build --strict -f mkdocs.yml -d site/

docs-serve: $(VENV)/.stamp-docs
	$(PY) scripts/docs/cli_reference.py
	$(VENV)/bin/mkdocs serve -f mkdocs.yml

format: $(VENV)/.stamp-test
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(VENV)/.stamp-test
	$(PY) scripts/benchmarks/bench_vit.py --output results/vit_throughput.csv

# The Results page (docs/results.md) and its plots, from the committed files under results/.
results: $(VENV)/.stamp-test
	$(PY) scripts/docs/results_pages.py

# Screenshots of the built site (docs/assets/screenshots/), with headless Chromium, to be checked by eye.
screenshots: $(VENV)/.stamp-docs
	$(PY) scripts/docs/screenshots.py

# `import hf_vit_plus` and `hf-vit-plus --help` against transformers (medians of fresh processes; results/)
bench-import: $(VENV)/.stamp-test
	$(PY) scripts/benchmarks/bench_import.py

# The GPU check in one command (docs/contributing/testing.md, "The GPU check"): with a CUDA GPU it makes .venv-gpu over
# $(PYTHON)'s packages, installs offline from wheelhouse/ where it is here, runs the gpu tests and
# scripts/benchmarks/bench_gpu.py, JSON in $OUT or results/gpu/; without one, the CPU fallbacks (creating what it needs).
gpu-check:
	VENV=$(VENV) PYTHON=$(PYTHON) bash scripts/gpu_check.sh

# wheelhouse/ for the lent GPU machine, which has no network: the package's wheel and the Python 3.12 wheels of what
# its image lacks (.ci/gpu-image.txt says what it holds). Needs the package registry; prints the folder's size.
gpu-wheelhouse:
	PYTHON=$(PYTHON) bash scripts/gpu_wheelhouse.sh

# `make gpu-check` rehearsed here as the lent machine runs it: a Python 3.12 venv with the image's releases and no
# datasets or evaluate, a fresh copy of the checkout with wheelhouse/, the check run there offline on the CPU.
gpu-rehearsal:
	PYTHON=$(PYTHON) bash scripts/gpu_rehearsal.sh

clean:
	rm -rf $(VENV) $(OLDEST_VENV) .venv-gpu .venv-image wheelhouse .cache outputs .pytest_cache site
