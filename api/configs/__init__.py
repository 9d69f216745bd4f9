"""Application settings, read from the environment (and an optional ``.env`` file).

Each process builds one in ``create_app()``. Defaults are the embedded setup: SQLite for data and
streams and Celery's filesystem broker under ``VAR_DIR``, so ``make run`` needs no external service.
"""

from __future__ import annotations

import pathlib
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["AppConfig"]

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The built-in ``SECRET_KEY``: passports and resume tokens signed with it can be forged by anyone, so a
#: process still running on it is a development one (this is what "production" means for the defaults).
DEVELOPMENT_SECRET_KEY = "dev-only-secret-key-change-me"


class AppConfig(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    SECRET_KEY: str = Field(
        default=DEVELOPMENT_SECRET_KEY,
        description="Flask secret; also the root of the development resume-token key.",
    )
    VAR_DIR: pathlib.Path = Field(default=PROJECT_ROOT / "var", description="Where embedded data lives.")

    SQLALCHEMY_DATABASE_URI: str = Field(default="", description="App database; default SQLite in VAR_DIR.")
    SQLALCHEMY_POOL_SIZE: int = Field(
        default=10, ge=1, description="App database connections each process keeps open (its pool's size)."
    )
    SQLALCHEMY_MAX_OVERFLOW: int = Field(
        default=10, ge=0, description="Connections a process may open beyond SQLALCHEMY_POOL_SIZE under load."
    )
    # Whole seconds: Flask-SQLAlchemy builds the engine with engine_from_config(), which makes it an int.
    SQLALCHEMY_POOL_TIMEOUT: int = Field(
        default=10,
        ge=1,
        description="Seconds a request waits for a free app database connection; then it is answered 503 "
        "database_busy (with Retry-After) rather than waiting on.",
    )
    DURABLE_STREAM_URL: str = Field(default="", description="Durable-stream backend; default SQLite in VAR_DIR.")
    REDIS_URL: str | None = Field(default=None, description="Redis for the broadcast channel, if used.")
    REDIS_MAX_CONNECTIONS: int = Field(
        default=1000,
        ge=1,
        description="Connections each process's Redis pool (the broadcast channel's) holds at most; every open "
        "broadcast event stream keeps one. A stream that finds none free within REDIS_POOL_TIMEOUT is answered 503.",
    )
    REDIS_POOL_TIMEOUT: float = Field(
        default=0.5, ge=0, description="Seconds to wait for a free connection of the Redis pool before giving up."
    )

    CELERY_BROKER_URL: str = Field(default="filesystem://", description="Celery broker.")
    CELERY_QUEUE: str = Field(default="workflow", description="Queue the workflow tasks use.")
    CELERY_VISIBILITY_TIMEOUT: float = Field(
        default=60,
        description="Redis broker: seconds after which a task message no worker acknowledged is delivered again.",
    )
    CELERY_PREFETCH_MULTIPLIER: int = Field(default=1, ge=1, description="Task messages a worker reserves per thread.")

    APP_MAX_EXECUTION_TIME: float = Field(default=1200, description="Watchdog: seconds one execution attempt may run.")
    WORKFLOW_LEASE_TTL: float = Field(default=30, description="Seconds a worker's run lease lasts between renewals.")
    WORKFLOW_LLM_TOKEN_DELAY: float = Field(default=0.02, description="Default delay between simulated LLM tokens.")
    WORKFLOW_STOP_CHECK_INTERVAL: float = Field(default=1.0, description="Seconds the stop flag may be cached.")
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
    )
    UPLOAD_FILE_SIZE_LIMIT: int = Field(default=15, ge=1, description="Largest uploaded document, in MB.")
    UPLOAD_IMAGE_FILE_SIZE_LIMIT: int = Field(default=10, ge=1, description="Largest uploaded image, in MB.")
    UPLOAD_AUDIO_FILE_SIZE_LIMIT: int = Field(default=50, ge=1, description="Largest uploaded audio file, in MB.")
    UPLOAD_VIDEO_FILE_SIZE_LIMIT: int = Field(default=100, ge=1, description="Largest uploaded video, in MB.")
    UPLOAD_FILE_EXTENSION_BLACKLIST: str = Field(
        default="", description="Comma-separated extensions refused by POST /files/upload (e.g. 'exe,bat')."
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
        validation_alias=AliasChoices("BROADCAST_CHANNEL_TYPE", "EVENT_BUS_REDIS_CHANNEL_TYPE"),
        description="Redis primitive of the broadcast channel (needs REDIS_URL).",
    )
    RESUME_TOKEN_KEYS: str = Field(
        default="",
        description="Comma-separated '<key id>:<base64url 32-byte key>'; the first signs, all verify. "
        "Empty: a development key derived from SECRET_KEY.",
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
        description="Serve the browser demo page at /demo. Unset: only in development, i.e. while SECRET_KEY is "
        "the built-in development value (any deployment sets its own, and then /demo is 404 unless this is true).",
    )

    def demo_page_enabled(self) -> bool:
        if self.DEMO_PAGE_ENABLED is not None:
            return self.DEMO_PAGE_ENABLED
        return self.SECRET_KEY == DEVELOPMENT_SECRET_KEY

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
        default="json", description="Log lines as JSON objects (one per line) or as plain text."
    )
    LOG_LEVEL: str = Field(default="INFO", description="Level of the app's loggers.")
    BEAT_REAPER_INTERVAL: float = Field(
        default=30,
        description="Celery beat: seconds between scheduled reaper sweeps (reap_expired_workflow_runs); 0: none.",
    )
    BEAT_RETENTION_INTERVAL: float = Field(
        default=600,
        description="Celery beat: seconds between scheduled enforce_retention() sweeps (enforce_stream_retention); "
        "0: none.",
    )

    # Crash safety of user actions, supervision and readiness (docs/operations.md).
    WORKFLOW_REDISPATCH_AFTER: float = Field(
        default=30,
        gt=0,
        description="Seconds after a task message was handed to the broker within which a worker should claim its "
        "attempt; then the dispatcher sends it again (twice, four, eight times as long after each send), so a "
        "message the broker lost or a dead worker held still runs. Duplicates are harmless: one claim wins.",
    )

    def database_uri(self) -> str:
        return self.SQLALCHEMY_DATABASE_URI or f"sqlite:///{self.VAR_DIR / 'app.db'}"

    def durable_stream_url(self) -> str:
        return self.DURABLE_STREAM_URL or f"sqlite:///{self.VAR_DIR / 'streams.db'}"

    def broker_folder(self) -> pathlib.Path:
        return self.VAR_DIR / "broker"
