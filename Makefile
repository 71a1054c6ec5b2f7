# distributed-runbook: `make diagnose` runs the allocation check, `make test` the test suite.
# Both create .venv when missing and install what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Keep pip's and torch's scratch files inside the project.
export TMPDIR := $(CURDIR)/build/tmp
export TORCH_EXTENSIONS_DIR := $(CURDIR)/build/torch_extensions

.PHONY: setup test diagnose lab bench clean

$(STAMP): pyproject.toml
	@mkdir -p build/tmp
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, in a step of its own: exactly this version is the CPU wheel these
	# machines install; any other spec pulls GBs of CUDA packages.
	$(BIN)/python -m pip install -q torch==2.13.0
	# Then everything else (deepspeed builds from its sdist against the installed torch).
	$(BIN)/python -m pip install -q -e .
	touch $@

setup: $(STAMP)

test: $(STAMP)
	@mkdir -p build/tmp
	$(BIN)/python -m pytest -q tests

diagnose: $(STAMP)
	@mkdir -p build/tmp
	$(BIN)/runbook diagnose $(ARGS)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_runner.py

clean:
	rm -rf build/jobs build/reports build/executed build/tmp
