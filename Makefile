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
# CI's second stack: every runtime dependency at its floor (Colab's torch 2.11 and torchvision 0.26), for Python 3.11
# here; FLOOR_313 is the same set for Colab's Python 3.13, wheels only. make floor builds the venv once per machine,
# outside the clone, named by the file's hash (a changed floor.txt gets a new venv; delete old ones by hand).
FLOOR      := requirements/floor.txt
FLOOR_313  := requirements/floor-py313.txt
FLOOR_VENV ?= $(HOME)/.cache/lightning-speed-course/floor-$(shell $(PYTHON) -c \
	"import hashlib; print(hashlib.sha256(open('$(FLOOR)', 'rb').read()).hexdigest()[:16])")
# Colab's platform for that check: x86_64 Linux, glibc 2.35 (Ubuntu 22.04), so every manylinux tag up to uv's 2_28
PY313_PLATFORMS := $(foreach v,$(shell seq 5 28),--platform manylinux_2_$(v)_x86_64) --platform manylinux2014_x86_64
# the unit tests that floor runs besides every lesson: the API scan, and those that call version-sensitive APIs
FLOOR_TESTS := tests/test_floor.py tests/test_config_policy.py tests/test_compress.py tests/test_models.py
# Data: COURSE_DATA if set, else ../shared/data/cifar10-jpeg where it exists, else torchvision's download
# (course_lib.base.config.data_source decides, for the lessons, the CLI, the scripts and the tests alike).

.PHONY: course test test-fast lessons lab venv lock floor site clean

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

## Re-pin the two stacks from pyproject.toml, for every platform, with hashes: requirements/lock.txt (the newest stack:
## requirements/main.txt's pins, every other direct dependency at its floor) and requirements/floor.txt (every direct
## dependency at its floor: Colab's versions), plus floor-py313.txt (the runtime set at the floors for Python 3.13,
## wheels only: it fails where a floor has no cp313 wheel). The other pins: the newest release that fits. Then make
## test and make floor.
lock:
	@test -n "$(UV)" || { echo "make lock needs uv: pip install uv (or pipx install uv), or make lock UV=/path/to/uv"; exit 1; }
	$(UV) pip compile pyproject.toml --extra dev --extra docs --universal --resolution lowest-direct --generate-hashes \
		-c requirements/main.txt --custom-compile-command "make lock" $(LOCK_FLAGS) -o $(LOCK)
	$(UV) pip compile pyproject.toml --extra dev --universal --resolution lowest-direct --generate-hashes \
		--custom-compile-command "make lock" $(LOCK_FLAGS) -o $(FLOOR)
	$(UV) pip compile pyproject.toml --python-version 3.13 --python-platform x86_64-manylinux_2_28 --no-build \
		--resolution lowest-direct --generate-hashes --custom-compile-command "make lock" $(LOCK_FLAGS) -o $(FLOOR_313)

## Run every lesson top to bottom (COURSE_SIZE=full unless set); executed notebooks and summary go to build/.
course: $(STAMP)
	COURSE_SIZE=$${COURSE_SIZE:-full} $(BIN)/python -m course_lib.entry.runner

# make test's workers: one per core, at most 4 (pytest-xdist; each test file, and each notebook, runs in one worker)
TEST_WORKERS ?= auto --maxprocesses=4

# make test's second pass: the tests of every hardware-dependent decision, again under the CPU class that answers
# "native bf16?" the other way from this machine (course_lib.base.machines.other_class: AVX2 where this CPU has bf16,
# else AVX512_BF16, emulated), so CI exercises a class besides its own. COURSE_HARDWARE=<class> make test runs the
# whole suite under one class (course_lib/base/machines.py lists them). The second pass leaves out the costly tests of these
# files that no class changes (tests/conftest.py's CLASS_FREE: marked class_free); the first pass ran them.
HARDWARE_TESTS := tests/test_hardware_matrix.py tests/test_muon.py tests/test_config_policy.py tests/test_compress.py \
	tests/test_capstone.py
OTHER_CLASS = $(shell $(BIN)/python -c \
	"from course_lib.base import hardware, machines; print(machines.other_class(hardware.own_cpu_flags()))")

## Lint, then the unit tests plus every notebook through nbval, in smoke size, the files side by side on the cores
## (make test TEST_WORKERS=0 runs them in one process); the 15 slowest tests listed at the end; then the
## hardware-dependent tests under the other CPU class (HARDWARE_TESTS).
test: $(STAMP)
	$(BIN)/ruff check course_lib scripts tests
	COURSE_SIZE=smoke $(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile
	@echo "The hardware-dependent tests again, emulating $(OTHER_CLASS):"
	COURSE_HARDWARE=$(OTHER_CLASS) COURSE_SIZE=smoke $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile \
		-m "not class_free" $(HARDWARE_TESTS)

## The developer's inner loop: lint, then the tests not marked slow (nothing that trains,
## starts a Python process or executes a notebook: tests/conftest.py's SLOW). make test still runs everything.
test-fast: $(STAMP)
	$(BIN)/ruff check course_lib scripts tests
	COURSE_SIZE=smoke $(BIN)/python -m pytest -q -m "not slow"

## CI's second stack: the floor venv (built once, see FLOOR_VENV), the course into it without touching torch, a check that
## every floor has a cp313 wheel in the registry, then FLOOR_TESTS and every lesson through nbval, in smoke size.
floor: $(FLOOR_VENV)/.installed
	$(FLOOR_VENV)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	$(FLOOR_VENV)/bin/python -m pip install -q --dry-run --ignore-installed --no-deps --only-binary=:all: \
		--python-version 3.13 $(PY313_PLATFORMS) --target $(FLOOR_VENV)/py313 --require-hashes -r $(FLOOR_313)
	COURSE_SIZE=smoke $(FLOOR_VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(FLOOR_TESTS) notebooks/

$(FLOOR_VENV)/.installed: $(FLOOR)
	test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
ifneq ($(UV),)
	$(UV) pip install --python $(FLOOR_VENV)/bin/python --require-hashes -r $(FLOOR)
else
	awk '/^pip==/ {f = 1} f {print} f && !/\\$$/ {exit}' $(FLOOR) > $(FLOOR_VENV)/pip-lock.txt
	$(FLOOR_VENV)/bin/python -m pip install -q --require-hashes --no-deps -r $(FLOOR_VENV)/pip-lock.txt
	$(FLOOR_VENV)/bin/python -m pip install -q --require-hashes -r $(FLOOR)
endif
	touch $@

## Re-run the lessons and write their outputs back into notebooks/ (what is committed).
lessons: $(STAMP)
	COURSE_SIZE=$${COURSE_SIZE:-full} $(BIN)/python -m course_lib.entry.runner --inplace

## The course as a website in build/site/: the committed notebooks with their outputs (nothing executed), the landing
## page from this README, the results pages; offline, warnings as errors. tests/test_site.py runs the same script.
site: $(STAMP)
	$(BIN)/python -m scripts.build_site

## Open the lessons in JupyterLab.
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf build
