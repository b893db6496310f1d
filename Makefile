# Two commands: `make lab` (students, instructors) and `make test` (everyone, CI).
# Every target installs what it needs into .venv first; `make install` is quick once done.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# nbgrader finds autograders/nbgrader_config.py through this path, from any directory.
export JUPYTER_CONFIG_PATH := $(CURDIR)/autograders
# As if the venv were activated: nbgrader and Jupyter start other tools (alembic, kernels) by name.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help install lab test release grade bench clean

help:
	@echo "make lab       open JupyterLab on course/ (nbgrader Validate + Formgrader)"
	@echo "make test      install and run the whole test suite on CPU"
	@echo "make install   create .venv and install (idempotent)"
	@echo "make release   regenerate course/ from solutions/"
	@echo "make grade SUBMISSIONS=<dir> RESULTS=<dir>   grade <student>/<assignment>/<nb>.ipynb"
	@echo "make bench     measure lessons and grading; reports in bench/results/"

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required; set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[lab,test]"
	@touch $@

install: $(STAMP)

# Containers and Colab-style machines run as root; Jupyter refuses that unless told.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: install
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/course $(ROOT_FLAG) $(LAB_ARGS)

# GPUCOURSE_SMOKE=1 shrinks epochs and data in every notebook (the text stays the same);
# GPUCOURSE_OFFLINE=1 writes a small CIFAR-10 instead of downloading it.
test: install
	GPUCOURSE_SMOKE=1 GPUCOURSE_OFFLINE=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

release: install
	$(BIN)/python autograders/release.py

grade: install
	@if [ -z "$(SUBMISSIONS)" ] || [ -z "$(RESULTS)" ]; then \
	  echo "usage: make grade SUBMISSIONS=<dir> RESULTS=<dir>"; exit 2; fi
	$(BIN)/python autograders/grade.py --submissions "$(SUBMISSIONS)" --results "$(RESULTS)" $(GRADE_ARGS)

bench: install
	$(BIN)/python -m gpucourse.bench --out bench/results
	$(BIN)/python autograders/bench_grading.py --out bench/results

clean:
	rm -rf $(VENV) autograders/gradebook.db bench/results .pytest_cache
