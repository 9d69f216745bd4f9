"""Per-tenant limits, answered 429 ``rate_limit_error`` with ``Retry-After`` (:class:`TooManyRequestsError`).

Counted across every process (:mod:`.limit_store`: the app's Redis, or the app database without one):

- run starts per app and second (``LIMIT_RUN_STARTS_PER_SECOND``), passports per client address and
  minute (``LIMIT_PASSPORTS_PER_MINUTE``), gateway streams created per key and minute
  (``LIMIT_GATEWAY_STREAMS_PER_MINUTE``): sliding windows; the Retry-After is when the oldest counted
  event leaves the window, so a client that waits it out passes;
- gateway bytes written per key and minute (``LIMIT_GATEWAY_BYTES_PER_MINUTE``): a fixed window;
- active runs per app (``APP_MAX_ACTIVE_REQUESTS``, Dify's meaning: runs queued or running): counted from
  the run rows themselves, in the transaction that adds a run, behind a lock on the app's row. A run
  stops counting when its row ends, which the reaper sees to when its worker dies;
- open event streams per (app, end user) and per app (``LIMIT_SSE_STREAMS_PER_END_USER``,
  ``LIMIT_SSE_STREAMS_PER_KEY``): :func:`acquire_stream` / :func:`release_stream`, slots with a lease
  (``LIMIT_SSE_LEASE_SECONDS``) that this process renews while the streams are open; a process that
  dies gives its slots back when their leases run out.

Every refusal is counted in ``workflow_limit_refusals_total{limit, key_bucket}``: the bucket (one of
16) of the key refused, so that an alert can ask how many keys were refused rather than how often.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import uuid
import zlib
from collections.abc import Iterator
from typing import NoReturn

from flask import Flask, current_app
from sqlalchemy import func, select, update

from api.configs import AppConfig
from api.extensions.ext_redis import app_redis
from api.libs import metrics
from api.libs.errors import ServiceError, TooManyRequestsError
from api.models import App, WorkflowRun, WorkflowRunStatus
from api.models.engine import db

from .limit_store import DatabaseLimitStore, LimitStore, RedisLimitStore, ceil_seconds

logger = logging.getLogger(__name__)

__all__ = [
    "StreamSlot",
    "acquire_stream",
    "check_active_runs",
    "check_gateway_bytes",
    "check_gateway_create",
    "check_passport",
    "check_run_start",
    "counting_resume_refusals",
    "key_bucket",
    "release_stream",
    "stream_counts",
]

KEY_BUCKETS = 16


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def _store() -> LimitStore:
    store: LimitStore | None = current_app.extensions.get("limit_store")
    if store is None:
        choice = _config().LIMIT_STORE
        client = app_redis() if choice != "database" else None
        store = RedisLimitStore(client) if client is not None else DatabaseLimitStore()
        current_app.extensions["limit_store"] = store
    return store


def key_bucket(key: str) -> str:
    """Which of 16 buckets ``key`` falls in: a refusal metric's label that counts keys, not requests."""
    return str(zlib.crc32(key.encode()) % KEY_BUCKETS)


def _refuse(limit: str, key: str, message: str, seconds: float) -> NoReturn:
    metrics.LIMIT_REFUSALS.tally.add((limit, key_bucket(key)))
    raise TooManyRequestsError(message, limit=limit, retry_after=ceil_seconds(seconds))


#: The refusals of a reconnect that say its position cannot be served (counted per key bucket).
RESUME_REFUSALS = frozenset({"invalid_resume_token", "resume_cursor_expired", "run_events_lost"})


@contextlib.contextmanager
def counting_resume_refusals(app: App) -> Iterator[None]:
    """Count a reconnect of ``app`` refused for its position in ``workflow_sse_resume_refusals_by_key_total``."""
    try:
        yield
    except ServiceError as exc:
        if exc.code in RESUME_REFUSALS:
            metrics.RESUME_REFUSALS_BY_KEY.tally.add((key_bucket(app.id),))
        raise


def check_run_start(app: App) -> None:
    """Count one run start of ``app``.

    Raises:
        TooManyRequestsError: ``LIMIT_RUN_STARTS_PER_SECOND`` runs started in the last second.
    """
    limit = _config().LIMIT_RUN_STARTS_PER_SECOND
    if limit <= 0:
        return
    wait = _store().window_hit(f"starts:{app.id}", limit, 1.0, uuid.uuid4().hex)
    if wait is not None:
        _refuse("run_starts", app.id, f"this app may start {limit} runs a second; try again shortly", wait)


def check_passport(address: str) -> None:
    """Count one passport for the client at ``address``.

    Raises:
        TooManyRequestsError: ``LIMIT_PASSPORTS_PER_MINUTE`` passports in the last minute.
    """
    limit = _config().LIMIT_PASSPORTS_PER_MINUTE
    if limit <= 0:
        return
    wait = _store().window_hit(f"passports:{address}", limit, 60.0, uuid.uuid4().hex)
    if wait is not None:
        _refuse("passports", address, f"{limit} passports a minute from one address at most", wait)


def check_gateway_create(app_id: str) -> None:
    """Count one gateway stream created with ``app_id``'s key.

    Raises:
        TooManyRequestsError: ``LIMIT_GATEWAY_STREAMS_PER_MINUTE`` created in the last minute.
    """
    limit = _config().LIMIT_GATEWAY_STREAMS_PER_MINUTE
    if limit <= 0:
        return
    wait = _store().window_hit(f"gateway_streams:{app_id}", limit, 60.0, uuid.uuid4().hex)
    if wait is not None:
        _refuse("gateway_streams", app_id, f"this API key may create {limit} streams a minute", wait)


def check_gateway_bytes(app_id: str, amount: int) -> None:
    """Count ``amount`` bytes written through the gateway with ``app_id``'s key (before they are written).

    Raises:
        TooManyRequestsError: They would pass ``LIMIT_GATEWAY_BYTES_PER_MINUTE`` this minute.
    """
    limit = _config().LIMIT_GATEWAY_BYTES_PER_MINUTE
    if limit <= 0 or amount <= 0:
        return
    wait = _store().amount_hit(f"gateway_bytes:{app_id}", limit, 60.0, amount)
    if wait is not None:
        _refuse("gateway_bytes", app_id, f"this API key may write {limit} bytes a minute", wait)


def check_active_runs(app: App) -> None:
    """In the caller's transaction, before it adds a run: lock ``app``'s row and count its active runs.

    The lock (an ``UPDATE`` of the app's own row: a row lock in PostgreSQL, the write lock in SQLite)
    lasts until the caller commits, so two starts in two processes cannot both see one slot free.

    Raises:
        TooManyRequestsError: ``APP_MAX_ACTIVE_REQUESTS`` runs of the app are queued or running (the
            transaction is rolled back).
    """
    config = _config()
    limit = config.APP_MAX_ACTIVE_REQUESTS
    if limit <= 0:
        return
    db.session.execute(update(App).where(App.id == app.id).values(key_generation=App.key_generation))
    active = db.session.execute(
        select(func.count())
        .select_from(WorkflowRun)
        .where(WorkflowRun.app_id == app.id, WorkflowRun.status == WorkflowRunStatus.RUNNING.value)
    ).scalar_one()
    if active >= limit:
        db.session.rollback()
        _refuse(
            "active_runs",
            app.id,
            f"too many requests: this app may have {limit} runs active at once; try again later",
            config.LIMIT_RETRY_AFTER,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class StreamSlot:
    """The slots one open event stream holds (per end user and per app) until :func:`release_stream`."""

    holder: str
    scopes: tuple[str, ...]


def _stream_scopes(app_id: str, end_user: str) -> list[tuple[str, str, int]]:
    config = _config()
    scopes = []
    if config.LIMIT_SSE_STREAMS_PER_END_USER > 0:
        scopes.append(
            ("sse_streams_per_end_user", _user_scope(app_id, end_user), config.LIMIT_SSE_STREAMS_PER_END_USER)
        )
    if config.LIMIT_SSE_STREAMS_PER_KEY > 0:
        scopes.append(("sse_streams_per_key", _app_scope(app_id), config.LIMIT_SSE_STREAMS_PER_KEY))
    return scopes


# A stream's scopes share the hash tag of its app: in a Redis Cluster one script takes both.
def _user_scope(app_id: str, end_user: str) -> str:
    return f"sse:{{{app_id}}}:user:{end_user}"


def _app_scope(app_id: str) -> str:
    return f"sse:{{{app_id}}}:app"


def acquire_stream(app_id: str, end_user: str) -> StreamSlot:
    """Take a slot for one more open event stream of ``end_user`` of ``app_id`` (of the end user's limit
    and of the app's, together or neither; one call to the store); renewed until released.

    Call :func:`release_stream` when the stream ends (its ``finally``), whatever ended it.

    Raises:
        TooManyRequestsError: The end user or the app has as many streams open as its limit allows.
    """
    scopes = _stream_scopes(app_id, end_user)
    holder = uuid.uuid4().hex
    if not scopes:
        return StreamSlot(holder, ())
    config = _config()
    refused = _store().acquire([(scope, limit) for _, scope, limit in scopes], holder, config.LIMIT_SSE_LEASE_SECONDS)
    if refused is not None:
        index, _wait = refused
        limit_name, _, limit = scopes[index]
        key = f"{app_id}:{end_user}" if limit_name == "sse_streams_per_end_user" else app_id
        noun = "this end user" if limit_name == "sse_streams_per_end_user" else "this app"
        _refuse(limit_name, key, f"{noun} may have {limit} event streams open at once", config.LIMIT_RETRY_AFTER)
    slot = StreamSlot(holder, tuple(scope for _, scope, _ in scopes))
    _renewer().hold(slot)
    return slot


def release_stream(slot: StreamSlot) -> None:
    """Give a stream's slots back (at once; a failure here leaves them to their leases)."""
    if not slot.scopes:
        return
    _renewer().drop(slot)
    try:
        _store().release(slot.scopes, slot.holder)
    except Exception as exc:  # the store is away: the lease gives the slots back
        logger.warning("limits: a stream's slots could not be given back (their leases will): %s", exc)


def stream_counts(app_id: str, end_user: str) -> tuple[int, int]:
    """Open streams of (``end_user`` of ``app_id``, ``app_id``) across every process, leases counted."""
    store = _store()
    return store.holders(_user_scope(app_id, end_user)), store.holders(_app_scope(app_id))


class _Renewer:
    """This process's held stream slots, renewed every third of their lease by one thread (a greenlet
    under gevent) while any is held."""

    def __init__(self, app: Flask, lease: float) -> None:
        self._app = app
        self._lease = lease
        self._held: dict[str, StreamSlot] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.pid = os.getpid()

    def hold(self, slot: StreamSlot) -> None:
        with self._lock:
            self._held[slot.holder] = slot
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stream-slot-renewer", daemon=True)
                self._thread.start()

    def drop(self, slot: StreamSlot) -> None:
        with self._lock:
            self._held.pop(slot.holder, None)

    def _run(self) -> None:
        while not self._wake.wait(self._lease / 3):
            with self._lock:
                slots = [(scope, slot.holder) for slot in self._held.values() for scope in slot.scopes]
            if not slots:
                continue
            try:
                with self._app.app_context():
                    _store().renew(slots, self._lease)
            except Exception as exc:  # the store is away: renew at the next turn, within the lease
                logger.warning("limits: open streams' slots could not be renewed: %s", exc)


def _renewer() -> _Renewer:
    renewer: _Renewer | None = current_app.extensions.get("stream_slot_renewer")
    if renewer is None or renewer.pid != os.getpid():  # a forked child holds none of its parent's slots
        app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]  # the app, not its proxy
        renewer = _Renewer(app, _config().LIMIT_SSE_LEASE_SECONDS)
        current_app.extensions["stream_slot_renewer"] = renewer
    return renewer
