# One-command set-up: every target creates or refreshes .venv first. pyproject.toml
# declares version ranges; constraints.txt picks the exact builds for dev and CI.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# apt needs root: sudo when we are not root (and it is there).
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)

.PHONY: venv browser test check lint serve bench clean

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

# The demo page's test (tests/server/test_demo_page.py) drives Debian's chromium: only
# distribution packages are reachable in CI, so it comes from apt, never a download.
browser:
	command -v chromium >/dev/null || ( $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium )

test: check browser
	$(BIN)/pytest -q

serve: $(STAMP)
	$(BIN)/omni-actors serve --preset tiny-omni

bench: $(STAMP)
	$(BIN)/omni-actors bench actors --json

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
