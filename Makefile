# Every target creates or updates the virtual environment by itself.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test chaos bench lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev,bench]'
	touch $(STAMP)

# The worker demo, then the operator's story on the API emulator and the local kubelet
# (test infrastructure, hence from tests/).
demo: $(STAMP)
	$(BIN)/outbox demo
	PYTHONPATH=tests $(BIN)/python -m k8s.demo

# Two pytest-xdist workers: most tests wait on servers, processes and timers, not on a core.
# Tests that share something costly (the image, a module's servers) run on one worker
# (xdist_group). PYTEST_WORKERS=0 runs them in this process; PYTEST_ARGS adds options.
PYTEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The chaos suite as a soak: more messages, more faults, longer outages than `make test`
# runs; prints the per-scenario report at the end and fails on any loss or broken invariant.
CHAOS_SCALE ?= 5
chaos: $(STAMP)
	OUTBOX_CHAOS_SCALE=$(CHAOS_SCALE) $(BIN)/python -m pytest -q -m chaos --timeout 3600 tests/chaos

bench: $(STAMP)
	$(BIN)/python -m bench
	$(BIN)/python -m bench.destinations

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/typecheck.py

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
