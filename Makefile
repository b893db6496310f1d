# `make lab` (students), `make formgrader` (instructors) and `make test` (everyone, CI).
# Every target installs what it needs into .venv first; `make install` is quick once done.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# nbgrader finds autograders/nbgrader_config.py through this path, from any directory.
export JUPYTER_CONFIG_PATH := $(CURDIR)/autograders
# As if the venv were activated: nbgrader and Jupyter start other tools (alembic, kernels) by name.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help install lab formgrader nbgrader test test-suite test-fast test-edition test-stress lint test-gpu gpu-tests site release publish grade bench bench-gpu full-run clean

help:
	@echo "make lab       students: copy course/ into work/ (once per file) and open JupyterLab there"
	@echo "make formgrader [RESULTS=<dir>]   instructors: JupyterLab with Formgrader on the course (or a graded class)"
	@echo "make nbgrader ARGS=\"<command>\" [RESULTS=<dir>]   any nbgrader command on the course (or a graded class)"
	@echo "make test      install and run the whole gate on CPU, what CI runs: test-suite, then test-edition"
	@echo "make test-suite the suite alone: every notebook, grading, attacks, sandboxes, cluster (PYTEST_ARGS to choose)"
	@echo "make test-fast the fast tier, for every change: unit tests, every fixture judged in-process, one notebook"
	@echo "make test-edition the student edition installed from its tag on the oldest supported torch: every notebook runs"
	@echo "make test-stress every multi-process demo launched GPUCOURSE_STRESS_RUNS times (50) under load: no rank may abort"
	@echo "make lint      ruff on the project's Python files (also a test in both tiers)"
	@echo "make test-gpu  on an NVIDIA GPU: notebooks and GPU tests, where a skipped CUDA cell is a failure, then bench-gpu --quick"
	@echo "make site      run the lessons and render them as HTML: build/site/_build/html/index.html"
	@echo "make install   create .venv and install (idempotent)"
	@echo "make release   regenerate course/ from solutions/"
	@echo "make publish   write the public student edition into build/student-edition/ (edition.toml)"
	@echo "make grade SUBMISSIONS=<dir> RESULTS=<dir>   grade <student>/<assignment>/<nb>.ipynb"
	@echo "make bench     measure lessons and grading; reports in bench/results/"
	@echo "make bench-gpu on an NVIDIA GPU, in minutes: a new GPU reference file (bench/results/reference-<gpu>.json)"
	@echo "make full-run  run every lesson at full size, timing lessons and their slowest cells (bench/results/full_runs.md)"
	@echo "make cluster   lesson 10: a local Slurm cluster of 2 emulated nodes (root, Debian's slurm-wlm); make cluster-stop ends it"

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required; set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[lab,test,darts,site]"
	@touch $@

install: $(STAMP)

# Containers and Colab-style machines run as root; Jupyter refuses that unless told.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

# Students work in their own copy, WORK (gitignored): `git pull` updates course/ and never touches it.
# lab/students/ turns off, for this server only, every nbgrader extension but the Validate button.
WORK ?= work
lab: install
	@$(BIN)/python lab/copy_course.py course "$(WORK)"
	JUPYTER_CONFIG_PATH="$(CURDIR)/lab/students:$(CURDIR)/autograders" \
	  $(BIN)/jupyter lab --ServerApp.root_dir="$(abspath $(WORK))" --LabApp.default_url=/lab $(ROOT_FLAG) $(LAB_ARGS)

# Instructors: the repository with Formgrader (assignments registered and released first), or with
# RESULTS=<dir>, the class `make grade` wrote into <dir>/nbgrader, for manual grading.
COURSE_ROOT = $(if $(RESULTS),$(abspath $(RESULTS))/nbgrader,$(CURDIR))
formgrader: install
	@$(BIN)/python -m autograders formgrader $(if $(RESULTS),--results "$(RESULTS)")
	cd "$(COURSE_ROOT)" && "$(abspath $(BIN))/jupyter" lab --ServerApp.root_dir="$(COURSE_ROOT)" \
	  --LabApp.default_url=/lab $(ROOT_FLAG) $(LAB_ARGS)

# Any nbgrader command, from a plain shell, on the course or (RESULTS=<dir>) a graded class.
nbgrader: install
	cd "$(COURSE_ROOT)" && "$(abspath $(BIN))/nbgrader" $(ARGS)

# GPUCOURSE_SMOKE=1 shrinks epochs and data in every notebook (the text stays the same);
# GPUCOURSE_OFFLINE=1 writes a small CIFAR-10 instead of downloading it.
# Benchmarks are not tests: their code is checked end to end by `make bench` (the tests marked bench).
# Both tiers run on every core (pytest-xdist), with one worker more than there are cores: a worker waiting on a
# launch, a lock or the cluster leaves its core to the others (on 2 cores, the suite's CPU idle was 19-23% with
# 2 workers and 9% with 3, and the suite took 1913 s instead of 2060 s; a fourth gained nothing on a faster machine,
# 1097 s against 1095 s, with the CPU idle under 1% in most minutes: the suite is bound by its CPU-seconds). Tests
# that share a module's fixture, or one notebook's run, stay on one worker (tests/conftest.py). XDIST= runs them
# in one process, as when debugging.
WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)) + 1)')
XDIST ?= -n $(WORKERS) --dist loadgroup
# The slowest tests are listed at the end of every run (where the time goes, for keeping the tiers in budget).
DURATIONS ?= --durations=40 --durations-min=5
# `make test` is the whole gate, what CI runs: the suite (test-suite), then the student edition as a
# student receives it (test-edition). The second runs even when the first fails; either failing fails
# the target. To run chosen tests, give PYTEST_ARGS to `make test-suite`. The edition's runtime (the oldest torch,
# installed once per machine, by uv: tests/test_edition_installed.py's install_command) is built in the background
# at the lowest priority while the suite runs; the edition test waits for it.
test: install
	@mkdir -p build; nice -n 19 $(BIN)/python tests/test_edition_installed.py > build/oldest-torch-prepare.log 2>&1 & \
	$(MAKE) --no-print-directory test-suite; suite=$$?; \
	$(MAKE) --no-print-directory test-edition; edition=$$?; \
	echo "make test: suite exit $$suite, edition exit $$edition"; [ $$suite -eq 0 ] && [ $$edition -eq 0 ]

test-suite: install
	GPUCOURSE_SMOKE=1 GPUCOURSE_OFFLINE=1 $(BIN)/python -m pytest -m "not bench and not stress and not edition" $(XDIST) $(DURATIONS) $(PYTEST_ARGS)

# The same suite without the tests marked slow (pyproject.toml's markers): minutes, for every change.
test-fast: install
	GPUCOURSE_SMOKE=1 GPUCOURSE_OFFLINE=1 $(BIN)/python -m pytest -m "not slow and not bench and not stress and not edition" $(XDIST) $(DURATIONS) $(PYTEST_ARGS)

# Every torchrun demo and script exercise (and lesson 9's ddp_spawn script) launched many times in a row
# beside a busy process: each launch must exit 0 with no rank aborting at exit. Tens of minutes; one at a
# time (the load is the point). GPUCOURSE_STRESS_RUNS=<n> launches each n times instead of 50.
# The student edition as a student receives it: built, installed from its git tag (non-editable, --no-deps)
# next to the oldest supported torch (pyproject's [tool.gpucourse]), every course/ notebook run with the
# reference answers pasted in (tests/test_edition_installed.py; build/oldest-torch/ keeps the runtime, so
# only a fresh clone pays for its install, under a minute with uv). Part of `make test`.
test-edition: install
	GPUCOURSE_SMOKE=1 GPUCOURSE_OFFLINE=1 $(BIN)/python -m pytest -m edition tests/test_edition_installed.py $(DURATIONS) $(PYTEST_ARGS)

test-stress: install
	GPUCOURSE_SMOKE=1 GPUCOURSE_OFFLINE=1 $(BIN)/python -m pytest -m stress tests/test_clean_exits.py $(PYTEST_ARGS)

lint: install
	$(BIN)/python -m ruff check .

# On a machine with one NVIDIA GPU, in about 5 minutes: every notebook at smoke size and every GPU test,
# where a cell or test that would skip for want of CUDA fails instead (GPUCOURSE_REQUIRE=cuda; cells
# needing 2 GPUs skip on one GPU), then `bench-gpu --quick`: a reference with its provenance (device,
# capability, versions, date, commit) in bench/results/reference-quick.json, refused unless every
# measurement of gpucourse.reference.MEASUREMENTS is measured or absent with a reason. The bench runs
# after the tests (not beside them: it times the GPU) and even when they fail; either failing fails the target.
GPU_TESTS := tests/test_notebooks.py tests/test_notebooks_accelerator_cells.py tests/test_cpu_gpu_cuda.py tests/test_moving_data.py \
  tests/test_mixed_precision.py tests/test_profiling.py tests/test_bench_gpu.py
GPU_XDIST ?= -n 8 --dist loadgroup
# The same list for bench/offline_gpu_run.sh (a GPU machine with no network and its own torch).
gpu-tests:
	@echo $(GPU_TESTS)
test-gpu: install
	@GPUCOURSE_SMOKE=1 GPUCOURSE_OFFLINE=1 GPUCOURSE_REQUIRE=cuda $(BIN)/python -m pytest -rs -m "not bench" \
	  $(GPU_XDIST) $(GPU_TESTS) $(PYTEST_ARGS); tests=$$?; \
	$(BIN)/python -m gpucourse.bench_gpu --quick --out bench/results/reference-quick.json; bench=$$?; \
	echo "make test-gpu: tests exit $$tests, bench-gpu --quick exit $$bench"; [ $$tests -eq 0 ] && [ $$bench -eq 0 ]

# The rendered course: runs solutions/ (full size; GPUCOURSE_SMOKE=1 for smoke size) into build/executed/,
# shows each lesson as released with the run's outputs for its non-exercise cells (book/make_book.py).
site: install
	$(BIN)/python book/make_book.py $(SITE_ARGS)

release: install
	$(BIN)/python -m autograders release

# The student edition (course/, the gpucourse package, a student README), committed and tagged in
# its own git repository, ready to push to edition.toml's home. PUBLISH_ARGS="--out DIR" elsewhere.
publish: release
	$(BIN)/python -m autograders publish $(PUBLISH_ARGS)

grade: install
	@if [ -z "$(SUBMISSIONS)" ] || [ -z "$(RESULTS)" ]; then \
	  echo "usage: make grade SUBMISSIONS=<dir> RESULTS=<dir>"; exit 2; fi
	$(BIN)/python -m autograders grade --submissions "$(SUBMISSIONS)" --results "$(RESULTS)" $(GRADE_ARGS)

bench: install
	GPUCOURSE_SMOKE=1 GPUCOURSE_OFFLINE=1 $(BIN)/python -m pytest -q -m bench
	$(BIN)/python -m gpucourse.bench --out bench/results
	$(BIN)/python -m autograders bench --out bench/results

# On an NVIDIA GPU: matmul per dtype, ResNet-18 steps, copies, overlap, sync and CUDA graphs, written as a
# reference file in gpucourse.reference's schema (a few minutes, with progress). Refuses without CUDA.
bench-gpu: install
	$(BIN)/python -m gpucourse.bench_gpu $(BENCH_GPU_ARGS)

# Every notebook of solutions/ at FULL size (GPUCOURSE_SMOKE=0), as a student's run and nbgrader's
# Validate see it: wall time per lesson and its slowest cells. GPUCOURSE_OFFLINE=0 downloads CIFAR-10.
full-run: install
	$(BIN)/python bench/full_runs.py --out bench/results --offline "$${GPUCOURSE_OFFLINE:-1}" $(FULL_RUN_ARGS)

# Lesson 10 and its grader: slurmctld, munged and two slurmd (node1, node2) on this machine, started from a
# generated slurm.conf (gpucourse.local_slurm); it says what is missing where it cannot start.
.PHONY: cluster cluster-stop
cluster: install
	$(BIN)/python -m gpucourse.local_slurm start

cluster-stop: install
	$(BIN)/python -m gpucourse.local_slurm stop

clean:
	rm -rf $(VENV) autograders/gradebook.db exchange bench/results .pytest_cache
