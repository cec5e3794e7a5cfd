# `make reproduce` and `make test` create the environment if it is missing, then run.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: reproduce test env fingerprints check-gpu-pins gpu-check-cpu clean-results

env: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

reproduce: env
	$(BIN)/snakemake --cores all

# the unit tests on both cores (pytest-xdist), then the end-to-end runs one at a time: each
# of those runs a workflow or torchrun on both cores itself
test: env
	$(BIN)/python -m pytest -q -m "not e2e" -n 2
	$(BIN)/python -m pytest -q -m e2e

# rewrite this CPU's reference fingerprints of the smoke run (tests/data/fingerprints/), when
# the numerics change on purpose
fingerprints: env
	LOGRA_UPDATE_FINGERPRINTS=1 $(BIN)/python -m pytest -q tests/e2e/test_workflow.py \
		-k "end_to_end or reference_fingerprints"

# the GPU pin set (requirements-gpu.txt: these pins + vLLM) resolves against PyPI (.ci/gpu_pins.py)
check-gpu-pins: env
	$(BIN)/python .ci/gpu_pins.py

# benchmarks/gpu_check.py in a throwaway environment with a bare CUDA machine's packages
# (benchmarks/gpu_check-requirements.txt; no Snakemake, lm-eval or vLLM), on the CPU
GPU_CHECK_VENV ?= .venv-gpu-check
gpu-check-cpu:
	rm -rf $(GPU_CHECK_VENV) && $(PYTHON) -m venv $(GPU_CHECK_VENV)
	$(GPU_CHECK_VENV)/bin/python -m pip install --quiet -r benchmarks/gpu_check-requirements.txt
	$(GPU_CHECK_VENV)/bin/python -m pip install --quiet --no-deps galore-torch==1.0 bitsandbytes==0.50.2
	! $(GPU_CHECK_VENV)/bin/python -c "import snakemake" 2>/dev/null
	! $(GPU_CHECK_VENV)/bin/python -c "import lm_eval" 2>/dev/null
	! $(GPU_CHECK_VENV)/bin/python -c "import vllm" 2>/dev/null
	PYTHONPATH=. $(GPU_CHECK_VENV)/bin/python benchmarks/gpu_check.py --device cpu --size tiny

clean-results:
	rm -rf results/* figures/*
