# The commands a fresh machine needs:
#   make serve   set up the app (no test tools) and serve the embedded default model at
#                http://127.0.0.1:8000 (another port: make serve PORT=9000)
#   make serve TORCH=cpu   the same with PyTorch's CPU build: ~0.4 GB to download instead of
#                ~3 GB, a venv of ~1.3 GB instead of ~5.7 GB (no CUDA libraries; no GPU use)
#   make test    set up the app with the test and lint tools, run the whole test suite
#   make lint    ruff (lint, format check) and mypy on app/
#   make docs    the documentation site into site/ (mkdocs build --strict, offline); docs-serve previews it
#   make extract ARGS="static/samples --out attn.safetensors"   the CLI from the venv
VENV ?= .venv
PY := $(VENV)/bin/python
# pip shows what it downloads (name and size) with a progress bar; PIP_FLAGS=-q for silence.
PIP_FLAGS ?= --disable-pip-version-check
# Empty: the app's defaults (HEADSCOPE_HOST / HEADSCOPE_PORT, else 127.0.0.1:8000).
HOST ?=
PORT ?=
ARGS ?=
# PyTorch build. Empty (default): PyPI's torch, which bundles CUDA (works on a CPU too).
# cpu: PyTorch's CPU wheel index for torch and torchvision only (everything else from PyPI);
# another build of that index works the same (TORCH=cu126). TORCH_INDEX overrides the address
# (a mirror). Switching builds needs a fresh venv: make clean first.
TORCH ?=
TORCH_INDEX ?= https://download.pytorch.org/whl/$(TORCH)
# serve --any-model (load any pretrained timm model from the page, downloaded on demand): on
# when the server listens on loopback only (HOST, else HEADSCOPE_HOST: empty, 127.0.0.1,
# localhost or ::1), where only this machine's user can trigger downloads; ANY_MODEL=0 turns it
# off, ANY_MODEL=1 asks for it anywhere (the server still refuses it on a network address unless
# HEADSCOPE_ANY_MODEL_ON_NETWORK=1 says so too).
ANY_MODEL ?=
LOOPBACK_HOSTS := 127.0.0.1 localhost ::1
SERVE_HOST = $(strip $(or $(HOST),$(HEADSCOPE_HOST)))
SERVE_ANY_MODEL = $(if $(filter 1,$(ANY_MODEL)),--any-model,$(if $(filter 0,$(ANY_MODEL)),,$(if $(SERVE_HOST),$(if $(filter $(SERVE_HOST),$(LOOPBACK_HOSTS)),--any-model),--any-model)))

.PHONY: check-torch setup setup-dev serve test test-fast test-long lint format build browser-deps js-deps bench bench-smoke \
	docker-test fetch extract docs docs-serve clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)

# The app alone (what `make serve` needs); the test and lint tools are a separate stamp.
# One line per step says what it installs and about how much it downloads (measured on
# Linux x86_64, Python 3.11); pip then shows each file and its progress.
$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
ifneq ($(TORCH),)
	@echo "==> 1/2 PyTorch ($(TORCH) build) from $(TORCH_INDEX): torch and torchvision only (cpu: ~0.2 GB to download)"
	$(PY) -m pip install $(PIP_FLAGS) --no-deps --index-url $(TORCH_INDEX) torch torchvision
	@echo "==> 2/2 headscope and its other dependencies from PyPI (timm, FastAPI, ONNX, pyarrow...): ~0.2 GB to download"
else
	@echo "==> headscope and its dependencies from PyPI: ~3 GB to download (PyTorch with its CUDA libraries ~2.8 GB of it),"
	@echo "    ~5.7 GB installed, a few minutes; without an NVIDIA GPU, make clean && make serve TORCH=cpu needs ~0.4 GB"
endif
	$(PY) -m pip install $(PIP_FLAGS) -e .
	@# The build really installed (torch.version.cuda) into .torch; a loud warning if it is not TORCH's.
	$(PY) scripts/torch_build.py --asked "$(TORCH)" --record $(VENV)/.torch
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	@echo "==> test and lint tools (pytest, Playwright's driver, onnxruntime, schemathesis, ruff, mypy) and open_clip: ~0.2 GB to download"
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test,dev,clip]'
	@# LeGrad's authors' code for its exactness test: it pins open-clip-torch<=2.23.0, which
	@# would downgrade open_clip; --no-deps keeps open_clip 3.x (the test extra has its imports).
	$(PY) -m pip install $(PIP_FLAGS) --no-deps legrad_torch==1.1
	touch $@

# Ray Data for the survey's Ray engine (heavy: only the tests need it, not lint or serve).
$(VENV)/.installed-ray: pyproject.toml $(VENV)/.installed-dev
	@echo "==> Ray Data for the survey's Ray engine (tests only): ~0.1 GB to download"
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test,dev,clip,ray]'
	touch $@

# A venv built with another PyTorch than TORCH asks for is kept as it is: say so. .torch holds the
# build really installed (cpu, cu126...; older venvs: the flavour asked for, pypi included).
check-torch:
	@if [ -f $(VENV)/.torch ]; then had="$$(cat $(VENV)/.torch)"; \
		if [ -n "$(TORCH)" ] && [ "$$had" != "$(TORCH)" ]; then \
			echo "note: $(VENV) has the PyTorch build '$$had', not '$(TORCH)'; make clean first to switch"; \
		elif [ -z "$(TORCH)" ] && [ "$$had" = "cpu" ]; then \
			echo "note: using $(VENV)'s PyTorch CPU build (made with TORCH=cpu); for PyPI's build with CUDA: make clean, then make without TORCH"; \
		fi; \
	fi

# MkDocs Material and mkdocstrings for the documentation site (and tests/docs' strict build).
$(VENV)/.installed-docs: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install $(PIP_FLAGS) -e '.[docs]'
	touch $@

setup: check-torch $(VENV)/.installed

setup-dev: check-torch $(VENV)/.installed-dev

fetch: setup
	$(VENV)/bin/headscope fetch

serve: fetch
	$(VENV)/bin/headscope serve $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) $(SERVE_ANY_MODEL)

extract: fetch
	$(VENV)/bin/headscope extract $(ARGS)

# Debian's chromium drives the browser tests (Playwright's own browser download needs internet).
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ]; then (apt-get update -q && apt-get install -y -q chromium) >/dev/null; \
		else echo "note: /usr/bin/chromium missing (apt install chromium); browser tests will be skipped"; fi; \
	fi

# Node runs the page's JavaScript tests (tests/js, from tests/unit/test_parity.py). Without it
# that test skips on a workstation and fails in CI (CI=true), where `make test` installs it.
js-deps:
	@if ! command -v node >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then (apt-get update -q && apt-get install -y -q nodejs npm) >/dev/null; \
		else echo "note: node missing (apt install nodejs); the JavaScript tests will be skipped"; fi; \
	fi

# axe-core (package.json's devDependencies) for the browser tests' accessibility check: npm ci
# installs the locked version into node_modules/, which the tests inject into the page (nothing
# from a CDN). Without npm the check skips itself, saying why.
node_modules/.installed: package.json package-lock.json | js-deps
	@if command -v npm >/dev/null 2>&1; then npm ci --no-audit --no-fund && touch $@; \
	else echo "note: npm missing (apt install npm); the accessibility check (axe-core) will be skipped"; fi

# The suite runs in parallel (pytest-xdist, a test file per worker: module-scoped servers are
# started once): most tests wait on real servers and browsers, and on 2 cores two workers take
# 15 minutes instead of 20. The suite is CPU-bound beyond that, so at most 4 workers (three on 2
# cores took 927 s where two took 761 s, 2026-11-29). PASSIVE:
# idle OpenMP threads sleep instead of spinning, so the workers' servers do not burn the CPU
# the others need. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)

# The markers of the long tests (below); `make test` runs the rest.
LONG_TESTS = soak or ray or packaging or waits or sweeps or lifecycle or examples or screens or surveys or heavy or thorough

test: setup-dev $(VENV)/.installed-ray $(VENV)/.installed-docs fetch browser-deps js-deps node_modules/.installed
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m pytest $(PYTEST_PARALLEL) -m "not ($(LONG_TESTS))"

test-fast: setup-dev $(VENV)/.installed-ray $(VENV)/.installed-docs fetch js-deps
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m pytest $(PYTEST_PARALLEL) -m "not browser and not ($(LONG_TESTS))"

# The long tests `make test` leaves out (16 minutes on the slow 2-core machine of 2026-11-30): the load and soak runs
# (tests/api/test_reliability.py; HEADSCOPE_SLOW=1 makes them the long versions), the survey's
# Ray engine (a local Ray cluster per test), the packaging test (sdist, wheel, a fresh venv),
# the tests that wait out request deadlines and paced sleeps (marker `waits`), two whole head
# sweeps through the server whose results no other test reuses (marker `sweeps`: the page's
# importance view, and the sweep's progress while an upload interleaves), the servers started to
# fail, fall back, drain or log into a pipe nobody reads (marker `lifecycle`), the docs' examples
# run as written (marker `examples`), the browser tests' other screen sizes (marker `screens`: each test's first size
# runs in `make test`) and the surveys and extracts run end to end (marker `surveys`: against the
# server, and whole command-line runs; the command line's refusals and one extract stay in `make test`),
# five single tests of 20-60 s of both cores (marker `heavy`: the accessibility check over every
# view, the widget in a kernel and a standalone file, the GPU bench profile run tiny), and a
# view's or endpoint's further tests of 10-85 s where `make test` keeps a first one (marker
# `thorough`: the Why view's pages, the model picker's load, the Swin page, compare mode, the
# whole-head importance sweep, faithfulness against the engine, batched against single answers,
# a fresh interpreter's startup imports, links read in another tab and their whole query grammar,
# servers of their own started to refuse a setting or ignore a header; 34 tests, about 530 s of
# one core on the slow machine of 2026-11-30, where make test took 1,128 s on 2 workers and CPU
# was 100 % busy throughout: 3 workers took 1,120 s, so only less work makes it shorter).
# CI runs them after `make test`, on the same workers (a file per worker: 903 s where one process
# took about 1,250 s on a slow day, 2026-11-30). The markers are in pyproject.toml.
test-long: setup-dev $(VENV)/.installed-ray fetch browser-deps
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m pytest $(PYTEST_PARALLEL) -m "$(LONG_TESTS)"

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
	rm -rf $(VENV) node_modules test-artifacts .pytest_cache .mypy_cache .ruff_cache build dist site ./*.egg-info
