# `make reproduce` and `make test` create the environment if it is missing, then run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: reproduce test env clean-results

env: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

reproduce: env
	$(BIN)/snakemake --cores all

test: env
	$(BIN)/python -m pytest -q

clean-results:
	rm -rf results/* figures/*
