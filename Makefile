# The two commands of the README, plus helpers. Both create .venv on first use (about 3 minutes, 6 GB).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Data: COURSE_DATA if set, else ../shared/data/cifar10-jpeg where it exists, else torchvision's download
# (course_lib.config.data_source decides, for the lessons, the CLI, the scripts and the tests alike).

.PHONY: course test lessons lab venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

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

## Open the lessons in JupyterLab.
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf build
