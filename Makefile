# The commands a fresh machine needs:
#   make serve   set up the app (no test tools) and serve the embedded default model at
#                http://127.0.0.1:8000 (another port: make serve PORT=9000)
#   make test    set up the app with the test and lint tools, run the whole test suite
#   make lint    ruff (lint, format check) and mypy on app/
#   make docs    the documentation site into site/ (mkdocs build --strict, offline); docs-serve previews it
#   make extract ARGS="static/samples --out attn.safetensors"   the CLI from the venv
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS ?= -q --disable-pip-version-check
# Empty: the app's defaults (HEADSCOPE_HOST / HEADSCOPE_PORT, else 127.0.0.1:8000).
HOST ?=
PORT ?=
ARGS ?=

.PHONY: setup setup-dev serve test test-fast lint format build browser-deps bench bench-smoke \
	docker-test fetch extract docs docs-serve clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)

# The app alone (what `make serve` needs); the test and lint tools are a separate stamp.
$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install $(PIP_FLAGS) -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test,dev]'
	touch $@

# Ray Data for the survey's Ray engine (heavy: only the tests need it, not lint or serve).
$(VENV)/.installed-ray: pyproject.toml $(VENV)/.installed-dev
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test,dev,ray]'
	touch $@

# MkDocs Material and mkdocstrings for the documentation site (and tests/docs' strict build).
$(VENV)/.installed-docs: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install $(PIP_FLAGS) -e '.[docs]'
	touch $@

setup: $(VENV)/.installed

setup-dev: $(VENV)/.installed-dev

fetch: setup
	$(VENV)/bin/headscope fetch

serve: fetch
	$(VENV)/bin/headscope serve $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

extract: fetch
	$(VENV)/bin/headscope extract $(ARGS)

# Debian's chromium drives the browser tests (Playwright's own browser download needs internet).
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ]; then (apt-get update -q && apt-get install -y -q chromium) >/dev/null; \
		else echo "note: /usr/bin/chromium missing (apt install chromium); browser tests will be skipped"; fi; \
	fi

# The suite runs in parallel (pytest-xdist, a test file per worker: module-scoped servers are
# started once): most tests wait on real servers and browsers, and on 2 cores two workers take
# 15 minutes instead of 20. The suite is CPU-bound beyond that, so at most 4 workers. PASSIVE:
# idle OpenMP threads sleep instead of spinning, so the workers' servers do not burn the CPU
# the others need. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)

test: setup-dev $(VENV)/.installed-ray $(VENV)/.installed-docs fetch browser-deps
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m pytest $(PYTEST_PARALLEL)

test-fast: setup-dev $(VENV)/.installed-ray $(VENV)/.installed-docs fetch
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m pytest $(PYTEST_PARALLEL) -m "not browser"

lint: setup-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

format: setup-dev
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# sdist and wheel into dist/ (the wheel carries static/ and templates/).
build: setup-dev
	$(PY) -m build --outdir dist .

# The documentation site, offline (no fonts or plugins from the internet); a warning fails it.
DOCS_PORT ?= 8001
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

docs-serve: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

bench: fetch
	$(PY) -m bench.run

bench-smoke: fetch
	$(PY) -m bench.run --smoke

docker-test:
	bash tests/docker/run.sh

clean:
	rm -rf $(VENV) test-artifacts .pytest_cache .mypy_cache .ruff_cache build dist site ./*.egg-info
