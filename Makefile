# Everything runs from the project's own virtual environment, built from pyproject.toml.
PYTHON_VERSION := 3.12
PYTHON ?= python3.12
# The interpreter that builds the venv: $(PYTHON) where it runs, else pyenv's own 3.12 (pyenv's python3.12
# shim exists but refuses to run while pyenv's selected version is another one). Expanded only by install.
PYTHON_EXE = $(shell $(PYTHON) -c 'import sys; print(sys.executable)' 2>/dev/null \
	|| ls -d $(HOME)/.pyenv/versions/$(PYTHON_VERSION).*/bin/python$(PYTHON_VERSION) 2>/dev/null | tail -n 1)
VENV := .venv
BIN := $(VENV)/bin
# Named after the interpreter's version: a venv installed by another one has no such stamp, so install runs.
STAMP := $(VENV)/.installed-py$(PYTHON_VERSION)
comma := ,

# Some machines set PYTHONDONTWRITEBYTECODE=1: pytest would then rewrite every test module's asserts again in
# each of its processes (collection 8.5 CPU-seconds instead of 3.9).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install lock chromium promtool node-deps conformance-deps test-conformance lint docs test test-durations test-loaded test-threads test-gevent test-gevent-local test-gevent-clustered bench soak run clean

install: $(STAMP)

# The Python client (sdk/python) is a package of its own; the tests and the lint use it from here.
# The runtime dependencies at the versions of requirements.lock (the image installs the same; `make lock`
# writes it from this environment after a deliberate upgrade).
# graphon (requirements-nodeps.txt) goes in without its declared dependencies: its light ones are ours in
# pyproject.toml, its heavy ones (the document extractor's) are the `documents` extra (docs/development.md).
$(STAMP): pyproject.toml sdk/python/pyproject.toml requirements.lock requirements-nodeps.txt
	@test -n "$(PYTHON_EXE)" || { echo "Python $(PYTHON_VERSION) is required ($(PYTHON) does not run)"; exit 1; }
	@# A venv another interpreter made (3.11 before) is rebuilt, never upgraded in place.
	@if test -x $(BIN)/python && ! $(BIN)/python -c 'import sys; sys.exit(sys.version_info[:2] != ($(subst .,$(comma) ,$(PYTHON_VERSION))))' 2>/dev/null; then \
		echo "$(VENV) was made by another interpreter ($$($(BIN)/python -V 2>&1)): rebuilding it"; rm -rf $(VENV); fi
	test -x $(BIN)/python || $(PYTHON_EXE) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps -c requirements.lock -r requirements-nodeps.txt
	$(BIN)/python -m pip install --quiet -e sdk/python
	@# The repository's commit-msg hook (subjects of at most 72 characters), where this is a git checkout.
	-git rev-parse --git-dir >/dev/null 2>&1 && git config core.hooksPath tools/git-hooks
	touch $(STAMP)

# Debian's chromium for the browser tests (tests/browser), which Playwright drives by its path:
# Playwright's own browser download cannot run here. Quick when it is already installed.
CHROMIUM := /usr/bin/chromium

chromium:
	@test -x $(CHROMIUM) || { echo "installing Debian's chromium for tests/browser"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@test -x $(CHROMIUM) || { echo "$(CHROMIUM) is still missing: install Debian's chromium package"; exit 1; }

# Dify's official Node SDK, exactly as locked, for tests/app/test_dify_node_sdk.py. npm ci writes
# node_modules/.package-lock.json, which serves as the stamp: reinstalled only when the lockfile is newer.
NODE_DEPS := tests/dify_sdk
NODE_STAMP := $(NODE_DEPS)/node_modules/.package-lock.json

node-deps: $(NODE_STAMP)

$(NODE_STAMP): $(NODE_DEPS)/package-lock.json
	npm ci --no-audit --no-fund --prefix $(NODE_DEPS)
	touch $@

# The Durable Streams conformance suite and client, exactly as locked (tests/conformance); stamped the same way.
CONFORMANCE_DEPS := tests/conformance
CONFORMANCE_STAMP := $(CONFORMANCE_DEPS)/node_modules/.package-lock.json

conformance-deps: $(CONFORMANCE_STAMP)

$(CONFORMANCE_STAMP): $(CONFORMANCE_DEPS)/package-lock.json
	npm ci --no-audit --no-fund --prefix $(CONFORMANCE_DEPS)
	touch $@

# promtool (Debian's prometheus package) for the alerting rules' unit tests (tests/test_alerts.py).
PROMTOOL := /usr/bin/promtool

promtool:
	@test -x $(PROMTOOL) || { echo "installing Debian's prometheus package for promtool"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
	@test -x $(PROMTOOL) || { echo "$(PROMTOOL) is still missing: install Debian's prometheus package"; exit 1; }

# requirements.lock from this environment's versions of the runtime dependencies (no registry is asked).
lock: install
	$(BIN)/python -m tools.lock_deps

lint: install
	$(BIN)/ruff check api tests bench harness tools sdk
	$(BIN)/ruff format --check api tests bench harness tools sdk
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# docs/adapters/{memory,sqlite,redis,postgres,nats}.md from the adapters' docstrings (their capability
# cards), and docs/configuration.md from the settings models; tests/test_docs.py fails when a page is stale.
docs: install
	$(BIN)/python -m tools.gen_adapter_docs
	$(BIN)/python -m tools.gen_config_docs

# The whole suite in plain threads (tests/browser in a real headless Chromium) and, beside it, the
# durable-stream and broadcast contracts and the Redis and NATS adapters' own tests (their shared readers
# differ between threads and gevent) again under gevent; the soak-like cases (-m soak) are make bench's.
# Most tests wait on the servers they start, not on the CPU: the threaded suite runs its files in
# XDIST_WORKERS processes (pytest-xdist, a file at a time, so module fixtures stay shared; the longest
# files first, by tests/durations.json, see tests/conftest.py). Every time-based assertion waits on a
# deadline from a setting the test controls, so the gevent runs' hub timings hold beside it as they do beside
# make test-loaded's CPU hog. Each run's output is printed whole when it ends; the threaded run's
# closes with its 40 slowest steps (--durations), where time goes first.
XDIST_WORKERS ?= 4
# Whole files, handed out in the order tests/conftest.py gives them (not xdist's own: most tests first).
DIST := --dist loadfile --no-loadscope-reorder

# The lint runs beside the tests (it fails make test all the same, only later).
test: install chromium promtool
	$(MAKE) --no-print-directory -j4 --output-sync=target lint test-threads test-gevent-local test-gevent-clustered

test-threads: install chromium node-deps conformance-deps
	$(BIN)/pytest tests -n $(XDIST_WORKERS) $(DIST) -m "not soak" --durations=40

# tests/durations.json anew, from one threaded run: the files' order in make test (longest first).
test-durations: install chromium promtool node-deps conformance-deps
	$(BIN)/pytest tests -n $(XDIST_WORKERS) $(DIST) -m "not soak" -p no:cacheprovider --record-durations

# Two gevent-patched pytest processes side by side (the contracts of the stores on this machine's shared
# servers; the clustered and NATS stores and the adapters' own tests), each printed whole when it ends.
GEVENT_PYTEST := EXPECT_GEVENT=1 $(BIN)/python -m gevent.monkey --module pytest -p no:cacheprovider -m "not soak"

test-gevent: install
	$(MAKE) --no-print-directory -j2 --output-sync=target test-gevent-local test-gevent-clustered

test-gevent-local: install
	$(GEVENT_PYTEST) tests/durable_stream/test_contract_memory.py tests/durable_stream/test_contract_sqlite.py \
		tests/durable_stream/test_contract_redis.py tests/durable_stream/test_contract_postgres.py tests/broadcast_channel

test-gevent-clustered: install
	$(GEVENT_PYTEST) tests/durable_stream/test_contract_redis_cluster.py tests/durable_stream/test_contract_nats.py \
		tests/durable_stream/test_redis_adapter.py tests/durable_stream/test_nats_adapter.py \
		tests/durable_stream/test_nats_faults.py tests/durable_stream/test_nats_direct_publish.py

# make test beside a CPU hog keeping HOG_CORES cores busy (tools/cpu_hog.py, nothing to install), as on a
# shared CI machine: a test that holds only on an idle machine fails here. The hog stops whatever happens;
# LOADED_RUNS=3 runs make test three times in a row beside it, stopping at the first failure.
HOG_CORES ?= 2
LOADED_RUNS ?= 1

test-loaded: install
	@$(BIN)/python -m tools.cpu_hog --cores $(HOG_CORES) & hog=$$!; \
	trap 'kill $$hog 2>/dev/null; wait $$hog 2>/dev/null' EXIT; \
	trap 'exit 130' INT TERM; \
	for run in $$(seq $(LOADED_RUNS)); do \
		echo "test-loaded: run $$run of $(LOADED_RUNS), $(HOG_CORES) cores busy"; \
		start=$$(date +%s); \
		$(MAKE) --no-print-directory test || exit $$?; \
		echo "test-loaded: run $$run passed in $$(( $$(date +%s) - start )) s"; \
	done

# The Durable Streams conformance suite against the gateway on each adapter (memory, SQLite, Redis,
# PostgreSQL, NATS), each under gunicorn -k gevent on a free port; about a minute per adapter.
test-conformance: install conformance-deps
	$(BIN)/python -m tests.conformance.gateway

# The benchmarks, and the tests too soak-like for make test (pytest -m soak: bulk appends measuring memory).
bench: install
	$(BIN)/pytest tests -m soak -n $(XDIST_WORKERS) $(DIST) -p no:cacheprovider
	$(BIN)/python -m bench.redis
	$(BIN)/python -m bench.postgres
	$(BIN)/python -m bench.nats
	$(BIN)/python -m bench.sse
	$(BIN)/python -m bench.graphon

# The fault harness (not part of make test; about 12 minutes on 2 cores): real gunicorn gevent servers and
# Celery workers, killed workers and stores, dropping and stalled clients. Tables in docs/reliability.md.
soak: install
	$(BIN)/python -m bench.soak

run: install
	bin/run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
