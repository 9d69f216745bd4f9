# Everything runs from the project's own virtual environment, built from pyproject.toml.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lint docs test test-threads test-gevent bench soak run clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "$(PYTHON) is required"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: install
	$(BIN)/ruff check api tests bench harness tools
	$(BIN)/ruff format --check api tests bench harness tools
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# docs/adapters/{memory,sqlite,redis,postgres,nats}.md from the adapters' docstrings (their capability
# cards); tests/test_docs.py fails when a page is stale.
docs: install
	$(BIN)/python -m tools.gen_adapter_docs

# The whole suite in plain threads, then the durable-stream and broadcast contracts and the Redis and
# NATS adapters' own tests (their shared readers differ between threads and gevent) again under gevent.
test: lint test-threads test-gevent

test-threads: install
	$(BIN)/pytest tests

test-gevent: install
	EXPECT_GEVENT=1 $(BIN)/python -m gevent.monkey --module pytest -p no:cacheprovider \
		tests/durable_stream/test_contract_*.py tests/durable_stream/test_redis_adapter.py \
		tests/durable_stream/test_nats_adapter.py tests/durable_stream/test_nats_faults.py tests/broadcast_channel

bench: install
	$(BIN)/python -m bench.redis
	$(BIN)/python -m bench.postgres
	$(BIN)/python -m bench.nats
	$(BIN)/python -m bench.sse

# The fault harness (not part of make test; about 12 minutes on 2 cores): real gunicorn gevent servers and
# Celery workers, killed workers and stores, dropping and stalled clients. Tables in docs/reliability.md.
soak: install
	$(BIN)/python -m bench.soak

run: install
	bin/run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
