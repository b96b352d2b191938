# The two commands a fresh machine needs:
#   make serve   set up and start the app on the embedded default model (http://127.0.0.1:8000)
#   make test    set up and run the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS ?= -q --disable-pip-version-check

.PHONY: setup serve test test-fast browser-deps bench bench-smoke load docker-test fetch clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test]'
	touch $@

setup: $(VENV)/.installed

fetch: setup
	$(VENV)/bin/headscope fetch

serve: fetch
	$(VENV)/bin/headscope serve

# Debian's chromium drives the browser tests (Playwright's own browser download needs internet).
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ]; then (apt-get update -q && apt-get install -y -q chromium) >/dev/null; \
		else echo "note: /usr/bin/chromium missing (apt install chromium); browser tests will be skipped"; fi; \
	fi

test: fetch browser-deps
	$(PY) -m pytest

test-fast: fetch
	$(PY) -m pytest -m "not browser"

bench: fetch
	$(PY) -m bench.run

bench-smoke: fetch
	$(PY) -m bench.run --smoke

docker-test:
	bash tests/docker/run.sh

clean:
	rm -rf $(VENV) test-artifacts .pytest_cache
