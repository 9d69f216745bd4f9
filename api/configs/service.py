"""The service's own settings (the ones Dify has no name for, and our URL forms of the ones it has).

Where Dify names the same thing, ``json_schema_extra={"dify": ...}`` says how (``docs/configuration.md``
lists them side by side): the Dify name is read too, as an alias or through :mod:`api.configs.resolve`.
"""

from __future__ import annotations

import pathlib
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings

__all__ = ["DEVELOPMENT_SECRET_KEY", "PROJECT_ROOT", "ServiceSettings"]

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The built-in ``SECRET_KEY``: passports and resume tokens signed with it can be forged by anyone, so
#: only a ``DEPLOY_ENV=DEVELOPMENT`` process starts on it (api.configs.checks).
DEVELOPMENT_SECRET_KEY = "dev-only-secret-key-change-me"


class ServiceSettings(BaseSettings):
    SECRET_KEY: str = Field(
        default=DEVELOPMENT_SECRET_KEY,
        description="Signs passports; the root of the resume-token key when RESUME_TOKEN_KEYS is empty. Outside "
        "DEPLOY_ENV=DEVELOPMENT it must be your own, of at least 32 bytes (e.g. `openssl rand -base64 42`).",
        json_schema_extra={"dify": "SECRET_KEY", "secret": True},
    )
    VAR_DIR: pathlib.Path = Field(default=PROJECT_ROOT / "var", description="Where embedded data lives.")

    SQLALCHEMY_DATABASE_URI: str = Field(
        default="",
        description="App database (postgresql+psycopg://… or sqlite:///…). Unset: built from Dify's DB_* settings "
        "when any is set; else, with DEPLOY_ENV=DEVELOPMENT only, SQLite in VAR_DIR.",
        json_schema_extra={"dify": "DB_TYPE, DB_HOST, DB_PORT, DB_USERNAME, DB_PASSWORD, DB_DATABASE", "secret": True},
    )
    SQLALCHEMY_POOL_SIZE: int = Field(
        default=10,
        ge=1,
        description="App database connections each process keeps open (its pool's size).",
        json_schema_extra={"dify": "SQLALCHEMY_POOL_SIZE (Dify's default: 30)"},
    )
    SQLALCHEMY_MAX_OVERFLOW: int = Field(
        default=10,
        ge=0,
        description="Connections a process may open beyond SQLALCHEMY_POOL_SIZE under load.",
        json_schema_extra={"dify": "SQLALCHEMY_MAX_OVERFLOW"},
    )
    # Whole seconds: Flask-SQLAlchemy builds the engine with engine_from_config(), which makes it an int.
    SQLALCHEMY_POOL_TIMEOUT: int = Field(
        default=10,
        ge=1,
        description="Seconds a request waits for a free app database connection; then it is answered 503 "
        "database_busy (with Retry-After) rather than waiting on.",
        json_schema_extra={"dify": "SQLALCHEMY_POOL_TIMEOUT (Dify's default: 30)"},
    )
    DURABLE_STREAM_URL: str = Field(
        default="",
        description="The stream store (docs/adapters/). Unset: the Redis of REDIS_URL or of Dify's REDIS_* "
        "settings (standalone, Sentinel or cluster) when set; else, with DEPLOY_ENV=DEVELOPMENT only, SQLite in "
        "VAR_DIR.",
        json_schema_extra={"secret": True},
    )
    REDIS_URL: str | None = Field(
        default=None,
        description="The app's Redis as one URL (redis://, rediss://, redis+sentinel://, redis+cluster://): the "
        "broadcast channel's unless EVENT_BUS_REDIS_URL names another, and the stream store's unless "
        "DURABLE_STREAM_URL does. Unset: built from Dify's REDIS_* settings when any is set. With both, they must "
        "name the same server.",
        json_schema_extra={
            "dify": "REDIS_HOST, REDIS_PORT, REDIS_USERNAME, REDIS_PASSWORD, REDIS_DB, REDIS_USE_SSL, "
            "REDIS_USE_SENTINEL, REDIS_USE_CLUSTERS and their options",
            "secret": True,
        },
    )
    REDIS_MAX_CONNECTIONS: int = Field(
        default=1000,
        ge=1,
        description="Connections each process's Redis pool (the broadcast channel's) holds at most; every open "
        "broadcast event stream keeps one. A stream that finds none free within REDIS_POOL_TIMEOUT is answered 503.",
        json_schema_extra={"dify": "REDIS_MAX_CONNECTIONS (Dify's default: redis-py's)"},
    )
    REDIS_POOL_TIMEOUT: float = Field(
        default=0.5, ge=0, description="Seconds to wait for a free connection of the Redis pool before giving up."
    )

    CELERY_BROKER_URL: str = Field(
        default="",
        description="Celery's broker: redis://, rediss://, sentinel://… (with CELERY_USE_SENTINEL), amqp://, or "
        "filesystem:// (the embedded one, in VAR_DIR). Unset: filesystem:// with DEPLOY_ENV=DEVELOPMENT only.",
        json_schema_extra={"dify": "CELERY_BROKER_URL", "secret": True},
    )
    CELERY_QUEUE: str = Field(default="workflow", description="Queue the workflow tasks use.")
    CELERY_VISIBILITY_TIMEOUT: float = Field(
        default=60,
        description="Redis broker: seconds after which a task message no worker acknowledged is delivered again.",
    )
    CELERY_PREFETCH_MULTIPLIER: int = Field(default=1, ge=1, description="Task messages a worker reserves per thread.")

    APP_MAX_EXECUTION_TIME: float = Field(
        default=1200,
        description="Watchdog: seconds one execution attempt may run.",
        json_schema_extra={"dify": "APP_MAX_EXECUTION_TIME"},
    )
    WORKFLOW_LEASE_TTL: float = Field(default=30, description="Seconds a worker's run lease lasts between renewals.")
    WORKFLOW_LLM_TOKEN_DELAY: float = Field(default=0.02, description="Default delay between simulated LLM tokens.")
    WORKFLOW_STOP_CHECK_INTERVAL: float = Field(default=1.0, description="Seconds the stop flag may be cached.")
    WORKFLOW_MODEL_BASE_URL: str | None = Field(
        default=None,
        description="An OpenAI-compatible endpoint (…/v1) for llm, question-classifier and parameter-extractor "
        "nodes. Unset: the simulated model answers (a node may also ask for it: provider 'simulated').",
    )
    WORKFLOW_MODEL_API_KEY: str | None = Field(
        default=None,
        description="Bearer key of WORKFLOW_MODEL_BASE_URL.",
        json_schema_extra={"secret": True},
    )
    WORKFLOW_GRAPH_WORKERS: int = Field(
        default=2,
        ge=1,
        le=16,
        description="graphon's node threads per run. A run holds this many plus graphon's dispatcher, the "
        "pool's thread, its lease renewal and its watchdog: a thread-pool Celery worker runs at most its "
        "concurrency times (WORKFLOW_GRAPH_WORKERS + 4) threads besides its own three (docs/operations.md).",
    )
    WORKFLOW_HTTP_ALLOWED_HOSTS: str = Field(
        default="",
        description="Comma-separated hosts http-request nodes may call; an app calling another is refused.",
    )
    BLOCKING_RESPONSE_TIMEOUT: float = Field(default=600, description="Longest wait of a blocking run request.")
    STRICT_END_USER_ACCESS: bool = Field(
        default=False,
        description="Only a run's own end user may stop it or answer its forms (404 not_found for another). "
        "Off by default, as Dify: any end user of the app may stop a task, and a form's first answer wins.",
    )
    WORKFLOW_START_TIMEOUT: float = Field(
        default=300, description="Seconds a queued execution attempt may wait for a worker before the run fails."
    )
    WORKFLOW_END_RETRY_DEADLINE: float = Field(
        default=30,
        description="Seconds a worker retries writing a run's end before it leaves the end to the repair.",
    )
    WORKFLOW_REAPER_INTERVAL: float = Field(
        default=10,
        description="Seconds between the reaper's sweeps in each Celery worker (expired leases, start "
        "deadlines, pending ends); 0 turns the worker's reaper off.",
    )
    API_REAPER_INTERVAL: float = Field(
        default=10,
        ge=0,
        description="Seconds between the reaper's sweeps in each API worker process served by gunicorn with "
        "api.gunicorn_conf (expired leases, start deadlines, pending ends, lost task messages, expired forms), "
        "so runs end with no Celery worker alive; 0 turns it off.",
    )
    WORKFLOW_DISPATCH_GRACE: float = Field(
        default=10,
        gt=0,
        description="Seconds after which a committed run whose task message never reached the broker (its API "
        "process died in between) is queued again by the next sweep or read of the run.",
    )
    DURABLE_STREAM_MAX_AGE_SECONDS: float = Field(
        default=7 * 24 * 3600,
        description="Default retention of run events when DURABLE_STREAM_URL sets no max_age_seconds; 0 keeps them.",
    )
    WORKFLOW_EVENT_REPAIR_WINDOW: int = Field(
        default=1024,
        ge=0,
        description="Events of a run its worker keeps to append again when a stream-store failover lost them "
        "(they are compared by digest before each append); more lost than this, or lost with the worker, "
        "ends the run's stream history explicitly (readers get 410). 0: no repair.",
    )
    DURABLE_STREAM_REDIS_WAIT_REPLICAS: int = Field(
        default=0,
        ge=0,
        description="With a redis:// stream store: replicas that must acknowledge each append and seal (Redis "
        "WAIT, up to 1 s) before it returns; a failover then loses no acknowledged event, for a replication "
        "round trip per event. 0: asynchronous (a failover may lose the last events; the worker appends them "
        "again). See docs/reliability.md, 'Failover'.",
    )
    DURABLE_STREAM_RETENTION_INTERVAL: float = Field(
        default=600, description="Seconds between the reaper's enforce_retention() sweeps; 0 never sweeps."
    )

    HUMAN_INPUT_FORM_TIMEOUT: float = Field(
        default=3 * 24 * 3600,
        gt=0,
        description="Seconds a human-input form waits for its answer when its node sets no 'timeout'; then the "
        "run resumes with human_input_form_timeout and fails.",
    )
    IDEMPOTENCY_KEY_TTL: float = Field(
        default=24 * 3600,
        ge=24 * 3600,
        description="Seconds an Idempotency-Key of POST /workflows/run is remembered (at least a day).",
    )

    MAX_REQUEST_BODY_BYTES: int = Field(
        default=1 << 20, ge=1, description="Largest request body accepted, chunked or not (413 beyond)."
    )
    STORAGE_LOCAL_PATH: pathlib.Path | None = Field(
        default=None,
        description="Folder where uploaded files (POST /files/upload) are kept; default VAR_DIR/storage.",
        json_schema_extra={"dify": "STORAGE_LOCAL_PATH"},
    )
    UPLOAD_FILE_SIZE_LIMIT: int = Field(
        default=15,
        ge=1,
        description="Largest uploaded document, in MB.",
        json_schema_extra={"dify": "UPLOAD_FILE_SIZE_LIMIT"},
    )
    UPLOAD_IMAGE_FILE_SIZE_LIMIT: int = Field(
        default=10,
        ge=1,
        description="Largest uploaded image, in MB.",
        json_schema_extra={"dify": "UPLOAD_IMAGE_FILE_SIZE_LIMIT"},
    )
    UPLOAD_AUDIO_FILE_SIZE_LIMIT: int = Field(
        default=50,
        ge=1,
        description="Largest uploaded audio file, in MB.",
        json_schema_extra={"dify": "UPLOAD_AUDIO_FILE_SIZE_LIMIT"},
    )
    UPLOAD_VIDEO_FILE_SIZE_LIMIT: int = Field(
        default=100,
        ge=1,
        description="Largest uploaded video, in MB.",
        json_schema_extra={"dify": "UPLOAD_VIDEO_FILE_SIZE_LIMIT"},
    )
    UPLOAD_FILE_EXTENSION_BLACKLIST: str = Field(
        default="",
        description="Comma-separated extensions refused by POST /files/upload (e.g. 'exe,bat').",
        json_schema_extra={"dify": "UPLOAD_FILE_EXTENSION_BLACKLIST"},
    )
    # Capped far below Python's recursion limit: the parser recurses once per level, also in greenlets.
    MAX_JSON_DEPTH: int = Field(
        default=32, ge=1, le=200, description="Deepest nesting of arrays and objects in a JSON body (400 beyond)."
    )

    WORKFLOW_EVENT_TRANSPORT: Literal["durable_stream", "broadcast_channel"] = Field(
        default="durable_stream",
        validation_alias=AliasChoices("WORKFLOW_EVENT_TRANSPORT", "EVENT_BUS_TRANSPORT"),
        description="Which transport carries workflow events (the rollout flag).",
    )
    BROADCAST_CHANNEL_TYPE: Literal["pubsub", "sharded", "streams"] = Field(
        default="pubsub",
        validation_alias=AliasChoices(
            "BROADCAST_CHANNEL_TYPE", "EVENT_BUS_REDIS_CHANNEL_TYPE", "PUBSUB_REDIS_CHANNEL_TYPE"
        ),
        description="Redis primitive of the broadcast channel (on the event bus's Redis).",
        json_schema_extra={"dify": "EVENT_BUS_REDIS_CHANNEL_TYPE, PUBSUB_REDIS_CHANNEL_TYPE"},
    )
    RESUME_TOKEN_KEYS: str = Field(
        default="",
        description="Comma-separated '<key id>:<base64url 32-byte key>'; the first signs, all verify. "
        "Empty: a key derived from SECRET_KEY.",
        json_schema_extra={"secret": True},
    )
    SSE_PING_INTERVAL: float = Field(default=10, description="Seconds between pings on an idle event stream.")
    SSE_IDLE_TIMEOUT: float = Field(default=300, description="An event stream with no event for this long ends.")
    SSE_DRAIN_RETRY_MAX_MS: int = Field(
        default=3000,
        ge=1,
        description="When an API worker stops (SIGTERM, a gunicorn reload), each open event stream ends with a "
        "'retry:' of 250 ms up to this many milliseconds, spread at random, and its client resumes elsewhere.",
    )
    SSE_SHARED_WRITER: bool = Field(
        default=True,
        description="Under gunicorn's gevent workers, one writer per run and process writes each live event "
        "to every client level with it (instead of a greenlet per client reading and writing it).",
    )
    SSE_WRITER_HISTORY: int = Field(
        default=1024,
        ge=1,
        description="Events a run's shared writer keeps after delivering them: a client that arrives or "
        "reconnects to a live run starts from them instead of reading the run again on its own.",
    )
    SSE_MAX_ARRIVAL_RATE: float = Field(
        default=0,
        ge=0,
        description="Event streams one API process admits a second (a token bucket holding one second's worth); "
        "more are answered 503 server_busy with a Retry-After that gives each refused client its own turn, so "
        "they come back at this rate. 0: no limit.",
    )
    SSE_MAX_STREAMS: int = Field(
        default=0,
        ge=0,
        description="Event streams one API process holds open at once; more are answered 503 server_busy with a "
        "Retry-After of SSE_BUSY_RETRY_AFTER_MAX to 30 s. 0 (the default): under gunicorn, 95% of the connections "
        "one worker accepts (WEB_WORKER_CONNECTIONS) or of its open-file limit, whichever is lower, so that a full "
        "worker still answers the rest; elsewhere no limit.",
    )
    SSE_MAX_STARTING: int = Field(
        default=0,
        ge=0,
        description="Event streams one API process lets start at once (token, run, subscription, the wait for "
        "the run's writer); more are answered 503 server_busy with Retry-After. 0 (the default): no limit; "
        "a herd is served sooner in turn than refused and retried (docs/benchmarks.md, 'Herds and deploys').",
    )
    SSE_MAX_LOOP_LAG: float = Field(
        default=0,
        ge=0,
        description="Seconds an API process's gevent loop may be behind before it refuses new event streams "
        "(503 server_busy with Retry-After). 0 (the default): never; a herd is served faster in turn than "
        "refused and retried (docs/benchmarks.md, 'Herds and deploys').",
    )
    SSE_BUSY_RETRY_AFTER_MAX: int = Field(
        default=5,
        ge=1,
        description="A refused stream's Retry-After is 1 to this many seconds, at random (a herd comes back spread).",
    )
    DEMO_PAGE_ENABLED: bool | None = Field(
        default=None,
        description="Serve the browser demo page at /demo. Unset: only with DEPLOY_ENV=DEVELOPMENT (elsewhere "
        "/demo is 404 unless this is true).",
    )

    DURABLE_STREAMS_GATEWAY_PREFIX: str = Field(
        default="",
        description="Mount the Durable Streams protocol gateway in the API under this path (e.g. /durable-streams); "
        "empty: not mounted (api/durable_streams_app.py serves it on its own at /).",
    )
    DURABLE_STREAMS_GATEWAY_ANONYMOUS: bool = Field(
        default=False,
        description="Let requests without an API key create, read, append to and delete streams outside /apps/ "
        "and /runs/ on the gateway (off: 401).",
    )
    DURABLE_STREAMS_GATEWAY_LONG_POLL_SECONDS: float = Field(
        default=20, gt=0, description="How long a gateway long-poll waits for data (then 204), and SSE keep-alives."
    )
    DURABLE_STREAMS_GATEWAY_SSE_MAX_SECONDS: float = Field(
        default=300, gt=0, description="A gateway SSE response ends after this long; clients resume from their offset."
    )
    DURABLE_STREAMS_GATEWAY_MAX_APPEND_BYTES: int = Field(
        default=512 * 1024, ge=1, description="Largest body a gateway append or create accepts (then 413)."
    )
    DURABLE_STREAMS_GATEWAY_MAX_READ_BYTES: int = Field(
        default=1024 * 1024, ge=1, description="A gateway read returns records up to about this many bytes at once."
    )
    WEB_WORKER_CONNECTIONS: int = Field(
        default=10000,
        ge=1,
        description="Connections (open event streams) one gunicorn gevent worker accepts (api/gunicorn_conf.py).",
    )
    API_METRICS_BIND: str = Field(
        default="",
        description="host:port on which the gunicorn master serves the API processes' Prometheus metrics "
        "(a listener of its own, never the API's port); empty: no metrics.",
    )
    WORKER_METRICS_BIND: str = Field(
        default="",
        description="host:port on which a Celery worker's main process serves its Prometheus metrics; empty: none.",
    )
    METRICS_DIR: str = Field(
        default="",
        description="Where the processes of a role keep their metric files (PROMETHEUS_MULTIPROC_DIR is "
        "METRICS_DIR/api or METRICS_DIR/worker); default VAR_DIR/metrics. Emptied when the role starts.",
    )
    METRICS_FLUSH_INTERVAL: float = Field(
        default=1.0, gt=0, description="Seconds between the publications of a process's counts to its metric files."
    )
    LOG_FORMAT: Literal["json", "text"] = Field(
        default="json",
        validation_alias=AliasChoices("LOG_FORMAT", "LOG_OUTPUT_FORMAT"),
        description="Log lines as JSON objects (one per line) or as plain text.",
        json_schema_extra={"dify": "LOG_OUTPUT_FORMAT (Dify's default: text)"},
    )
    LOG_LEVEL: str = Field(
        default="INFO", description="Level of the app's loggers.", json_schema_extra={"dify": "LOG_LEVEL"}
    )
    BEAT_REAPER_INTERVAL: float = Field(
        default=30,
        description="Celery beat: seconds between scheduled reaper sweeps (reap_expired_workflow_runs); 0: none.",
    )
    BEAT_RETENTION_INTERVAL: float = Field(
        default=600,
        description="Celery beat: seconds between scheduled enforce_retention() sweeps (enforce_stream_retention); "
        "0: none.",
    )
