# distributed-runbook: `make diagnose` runs the allocation check, `make test` the test suite (ruff first,
# then every layer); `make test-unit` etc. run one layer (tests/README.md).
# Both create .venv when missing and install what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Keep pip's and torch's scratch files inside the project.
export TMPDIR := $(CURDIR)/build/tmp
export TORCH_EXTENSIONS_DIR := $(CURDIR)/build/torch_extensions

.PHONY: setup system-tools ds-ops gpu-check lint-code test book test-unit test-jobs test-lab test-notebooks test-scenarios test-configs test-browser diagnose lab bench course course-sbatch clean

$(STAMP): pyproject.toml
	@mkdir -p build/tmp
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, in a step of its own: exactly this version is the CPU wheel these
	# machines install; any other spec pulls GBs of CUDA packages.
	$(BIN)/python -m pip install -q torch==2.13.0
	# Then everything else (deepspeed builds from its sdist against the installed torch).
	$(BIN)/python -m pip install -q -e .
	@$(MAKE) --no-print-directory system-tools
	@$(MAKE) --no-print-directory ds-ops
	# nbstripout as this clone's git clean filter: outputs never reach a diff or a commit (helpers/nbclean.py)
	-$(BIN)/python -m helpers.nbclean --install-git-filter
	touch $@

# Debian tools the network lab and the pre-flight check use when present (chapter 06 shows a real
# `ping -M do`): installed only as root, only when missing; without them the checks fall back to
# Python (a raw ICMP probe, ioctls), so a failure here is a warning, never an error; without
# slurm-wlm/munge the SLURM lab tests (Lab(..., slurm=True)) skip with the reason.
# chromium: Debian's browser, which the browser test of the command builder drives (tests/browser; it skips,
# saying why, when /usr/bin/chromium is missing).
SYSTEM_TOOLS := ping:iputils-ping ethtool:ethtool ip:iproute2 slurmctld:slurm-wlm munged:munge chromium:chromium
system-tools:
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $${t%%:*} >/dev/null 2>&1 || missing="$$missing $${t##*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian packages:$$missing"; \
	  (timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends $$missing) >/dev/null 2>&1 \
	    || echo "warning: could not install$$missing; the lab and pre-flight checks use their Python fall-backs"; \
	else echo "note: not installed:$$missing (needs root and apt-get); the lab and pre-flight checks use their Python fall-backs"; fi

setup: $(STAMP)

# DeepSpeed JIT-builds its CPU shared-memory op on first use (~35 s alone, minutes on a loaded machine):
# build it here, with the venv's ninja first on PATH (the ranks reuse it only then), so that the first
# DeepSpeed job (the allocation check's smoke test, chapter 05) does not spend its stall window compiling.
# Skipped where CUDA is available: there DeepSpeed uses NCCL, not this op.
ds-ops:
	@mkdir -p build/tmp
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -c "import torch, sys; from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; sys.exit(0) if torch.cuda.is_available() else B().load()" \
	  || echo "warning: DeepSpeed's CPU op did not build here; the first DeepSpeed job will try again"

# pyflakes, pycodestyle errors and import order ([tool.ruff] in pyproject.toml); no reformatting.  Then the
# import contracts ([tool.importlinter]: no cycle between sibling modules, the layers).
lint-code: $(STAMP)
	$(BIN)/ruff check helpers tests benchmarks
	$(BIN)/lint-imports

# Two pytest processes at once (2 cores; a test's jobs spend much of their time waiting on their ranks): the tests
# that build the network lab (marker `lab`: namespaces and SLURM daemons are global to the machine, so they run one
# after the other), with the tests marked `lab_process` (no lab needed: there to even out the two processes' time),
# beside all the others; their log is printed when both are done.  The book's test reads the
# chapters both executed, so it runs after them, alone.  Each writes its JUnit XML under build/.
PYTEST := $(BIN)/python -m pytest -q
test: lint-code
	@mkdir -p build/tmp
	@( $(PYTEST) -m "(lab or lab_process) and not last" --basetemp=build/tmp/pytest-lab --junitxml=build/test-results-lab.xml tests \
	    > build/test-lab.log 2>&1; echo $$? > build/test-lab.rc ) & \
	$(PYTEST) -m "not lab and not lab_process and not last" --basetemp=build/tmp/pytest-main --junitxml=build/test-results.xml tests; \
	main=$$?; wait; echo "=== the lab tests, run beside the others (build/test-lab.log):"; cat build/test-lab.log; \
	lab=$$(cat build/test-lab.rc); \
	$(PYTEST) -m last --basetemp=build/tmp/pytest-book --junitxml=build/test-results-book.xml tests; book=$$?; \
	echo "make test: pytest exit status $$main (most layers), $$lab (lab), $$book (book)"; \
	[ $$main -eq 0 ] && [ $$lab -eq 0 ] && [ $$book -eq 0 ]

# The course as a book (helpers/book.py, docs/book.md): a static site in build/book/html of the README, the
# chapters with the outputs `make test` executed (build/executed/: nothing is executed here), docs/; Sphinx with
# -W -n (a broken cross-reference fails it), then LinkChecker.  `make test` builds it too, in its last test
# (tests/browser/test_book_pages.py).  Open build/book/html/index.html, or serve it: python -m http.server -d build/book/html
book: $(STAMP)
	@mkdir -p build/tmp
	$(BIN)/python -m helpers.book

# One layer each (tests/README.md: what each checks, how long it takes).  test-lab needs root or user namespaces.
LAYER_TARGETS := test-unit test-jobs test-lab test-notebooks test-scenarios test-configs test-browser
$(LAYER_TARGETS): test-%: $(STAMP)
	@mkdir -p build/tmp
	$(BIN)/python -m pytest -q tests/$*

diagnose: $(STAMP)
	@mkdir -p build/tmp
	$(BIN)/runbook diagnose $(ARGS)

# JupyterLab on 127.0.0.1:$(LAB_PORT) (as root too: --allow-root only then); it prints the URL with its
# token.  From a laptop: ssh -N -L 8888:127.0.0.1:8888 you@host (docs/command-builder.md).
# Autosave is off and the news pop-up too (helpers/labserver.py): a chapter changes only when you save it.
LAB_PORT ?= 8888
lab: $(STAMP)
	@mkdir -p build/tmp
	$(BIN)/python -m helpers.labserver --port $(LAB_PORT)

# The course as a test suite (helpers/course.py): every chapter under papermill, one summary in build/course/.
# Inside an allocation it uses the allocation; `make course-sbatch` submits configs/slurm/course.sbatch.
# ARGS: --chapters 00,08, -p 08:JOB_TIMEOUT_S=120 ...
course: $(STAMP)
	@mkdir -p build/tmp
	$(BIN)/python -m helpers.course $(ARGS)

# Everything that needs a GPU, in one command (issue 22; helpers/gpu_check.py): the GPU health check on real NVML,
# runbook diagnose with NCCL, the FusedAdam build, every chapter with tier-gpu cells (tier-multigpu with >= 2 GPUs);
# summary in build/gpu-check/summary.md.  It runs on the interpreter it finds (this clone's .venv, else python3 with
# its own torch: no venv is made, nothing installed), so it works on a GPU node's image as it is.  Without a GPU it
# says so and skips every step (exit 0).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:
	@mkdir -p build/tmp
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m helpers.gpu_check --out build/gpu-check $(ARGS)

course-sbatch:
	mkdir -p build/course && sbatch configs/slurm/course.sbatch

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_runner.py

clean:
	rm -rf build/jobs build/reports build/executed build/tmp build/book
