# The two commands of a new user: `make demo` and `make test`. Both start from nothing:
# they create .venv with the machine's python3 (3.11+), install tandem and its test
# dependencies, and build the agent jar and the native probe.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tandem-installed
PYTEST_ARGS ?=

.PHONY: all venv build test-tools test test-fast demo bench notebook readme-picture clean

all: build

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Rebuild the jar and the probe extension in the tree (editable install): cheap, always run.
build: $(STAMP)
	$(PY) setup.py -q jar >/dev/null
	$(PY) setup.py -q build_ext --inplace >/dev/null
	$(PY) -m engine.probe.autostart install >/dev/null  # GIL probe start hook (.pth), see docs/probe.md
	$(PY) -m compileall -q engine/__init__.py engine/errors.py engine/probe >/dev/null  # what every session interpreter imports at start: bytecode even under PYTHONDONTWRITEBYTECODE (docs/probe.md)

# Debian packages the suite runs against (tests/test_metrics.py: a real Prometheus and its
# promtool). Installed when missing and we are root; otherwise said once, and the tests that
# need them fail under CI=true (skip elsewhere).
test-tools:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	{ if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null \
	    || echo "make: apt-get could not install prometheus: tests/test_metrics.py will fail under CI=true"; \
	  else echo "make: prometheus is not installed and this is not root: tests/test_metrics.py will fail under CI=true"; fi; }

# The suite's files are spread over TEST_WORKERS processes (pytest-xdist; a file's tests stay
# together, sharing its fixtures); TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2

test: build test-tools
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && { echo "no tests ran"; exit 1; }; exit $$rc

test-fast: build
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: build
	$(VENV)/bin/tandem demo

bench: build
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench

# Opens notebooks/explore.ipynb on the results of `make demo` (demo-out/results).
notebook: build
	$(PY) -m pip install -q -e '.[notebook]'
	cd notebooks && TANDEM_RESULTS=$(CURDIR)/demo-out/results ../$(VENV)/bin/jupyter lab explore.ipynb

# The README's picture: the demo's timeline around its worst pause.
readme-picture: demo
	cp demo-out/timeline.png docs/timeline.png

clean:
	rm -rf build dist *.egg-info engine/_java/*.jar engine/probe/*.so engine/ingest/*.so .pytest_cache
