# One-command set-up: every target creates or refreshes .venv first. pyproject.toml
# declares version ranges; constraints.txt picks the exact builds for dev and CI.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test check lint serve bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: check
	$(BIN)/pytest -q

serve: $(STAMP)
	$(BIN)/omni-actors serve --preset tiny-omni

bench: $(STAMP)
	$(BIN)/omni-actors bench actors --json

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
