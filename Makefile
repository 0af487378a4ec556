# The two commands of the README, plus helpers. Both create .venv on first use (about 6 GB, mostly PyTorch with CUDA).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Every package of the course's own environment, pinned with hashes (make lock writes it from pyproject.toml).
LOCK   := requirements/lock.txt
# uv installs the lock much faster where it is installed; plain pip otherwise (make UV= forces pip).
UV     ?= $(shell command -v uv 2>/dev/null)
# make lock LOCK_FLAGS=--upgrade also moves every transitive pin to its newest release that fits.
LOCK_FLAGS ?=
# Data: COURSE_DATA if set, else ../shared/data/cifar10-jpeg where it exists, else torchvision's download
# (course_lib.config.data_source decides, for the lessons, the CLI, the scripts and the tests alike).

.PHONY: course test lessons lab venv lock site clean

venv: $(STAMP)

# The lock first (hash-checked: pip refuses any file whose hash the lock does not list, and any package it does not
# pin; with plain pip, the lock's pip goes in first), then the course itself, editable, built by the lock's setuptools.
$(STAMP): pyproject.toml $(LOCK)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "The course needs Python 3.11 or newer; $(PYTHON) is $$($(PYTHON) -V 2>&1). Run: make PYTHON=python3.11 ..."; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
ifneq ($(UV),)
	$(UV) pip install --python $(BIN)/python --require-hashes -r $(LOCK)
	$(UV) pip install --python $(BIN)/python --no-deps --no-build-isolation -e .
else
	awk '/^pip==/ {f = 1} f {print} f && !/\\$$/ {exit}' $(LOCK) > $(VENV)/pip-lock.txt
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r $(VENV)/pip-lock.txt
	$(BIN)/python -m pip install -q --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
endif
	touch $(STAMP)

## Re-pin requirements/lock.txt from pyproject.toml: each direct dependency at its lower bound (so CI tests the
## floors), everything else at the newest release that fits, for every platform, with hashes. Then run make test.
lock:
	@test -n "$(UV)" || { echo "make lock needs uv: pip install uv (or pipx install uv), or make lock UV=/path/to/uv"; exit 1; }
	$(UV) pip compile pyproject.toml --extra dev --extra docs --universal --resolution lowest-direct --generate-hashes \
		--custom-compile-command "make lock" $(LOCK_FLAGS) -o $(LOCK)

## Run every lesson top to bottom (COURSE_SIZE=full unless set); executed notebooks and summary go to build/.
course: $(STAMP)
	COURSE_SIZE=$${COURSE_SIZE:-full} $(BIN)/python -m course_lib.runner

## Lint, then the unit tests plus every notebook through nbval, in smoke size.
test: $(STAMP)
	$(BIN)/ruff check course_lib scripts tests
	COURSE_SIZE=smoke $(BIN)/python -m pytest -q

## Re-run the lessons and write their outputs back into notebooks/ (what is committed).
lessons: $(STAMP)
	COURSE_SIZE=$${COURSE_SIZE:-full} $(BIN)/python -m course_lib.runner --inplace

## The course as a website in build/site/: the committed notebooks with their outputs (nothing executed), the landing
## page from this README, the results pages; offline, warnings as errors. tests/test_site.py runs the same script.
site: $(STAMP)
	$(BIN)/python scripts/build_site.py

## Open the lessons in JupyterLab.
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf build
