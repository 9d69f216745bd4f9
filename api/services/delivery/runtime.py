"""Delivery's one entry point, and what one process keeps for the event streams it serves.

The HTTP edge turns a request into a :class:`StreamRequest` (the run, where the client starts, its
flags, its socket and the framer of its bytes) and hands it to :meth:`DeliveryRuntime.open_stream`,
which decides how the client is delivered:

- **by its run's shared writer** (``writer``), whenever one may write the client's socket (gunicorn's
  gevent worker, in the clear, not ``HEAD``) and the run is live: the client arrives at the writer
  with what it missed after its start — a cursor, the run's start (a snapshot, or a run this request
  starts), or the live tail — without a read of its own;
- **alone** (``alone``), with a subscription of its own, where no writer may write the socket, where
  the writer cannot continue at the client's start (a position older than its history), or for a run
  that has ended. A client reading alone next to a writer joins it once it is level with it.

:class:`DeliveryRuntime` holds the process's resume-token codec, the event transport its streams
read through, its admission gate, its run watcher (one thread checking every watched run), its
shared writers and their ending lane. ``create_app`` builds it and puts it in ``app.extensions`` (:func:`init_app`), so
nothing is made lazily on a first request; the HTTP edge gets it with :func:`current_runtime`.

Its rules, in one place:

- **Fork.** gunicorn (without ``--preload``) and Celery's prefork pool build the app in each
  process, after the fork: the runtime is never inherited. Nothing in it starts a thread or a
  greenlet when it is built: the watcher's thread starts on the first watched stream (and again
  in a process that finds it not alive, e.g. one forked after it started), a writer's greenlet
  with its first client, the ending lane's when something ends, the admission's loop-lag probe
  with the first stream it admits.
- **Connections.** The transport is the process's ``ext_event_bus`` extension, which the Celery
  tasks (the producers) share: it connects on first use and again in a process that finds its
  connection inherited from its parent (it checks the pid), for the same fork rule. The runtime
  hands out whichever connection is current (:attr:`DeliveryRuntime.transport`).
- **gevent.** Under gunicorn's gevent workers the watcher's "thread" is a greenlet (the process is
  monkey-patched before the app is built); the writers and the lane run on the hub's one thread and
  need no locks. The shared writers are used only there (``writer.writable_socket``).
- **Threads.** Elsewhere (the Flask test client, a threaded server) streams read alone; the watcher
  is a real thread and takes its lock.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

from flask import Flask, current_app

from api.configs import AppConfig
from api.core.app.apps.event_transport import WorkflowEventTransport
from api.core.app.apps.message_generator import StartAt
from api.core.durable_stream import TopicCursor
from api.extensions.ext_event_bus import EXTENSION_KEY as EVENTS_KEY
from api.extensions.ext_event_bus import EventTransportExtension
from api.libs import metrics
from api.libs.resume_token import ResumeTokenCodec, development_key, parse_keys
from api.models import App, WorkflowRun
from api.models.engine import db

from .. import limits
from .. import workflow_run_service as runs
from ..credentials import Credential
from ..limits import StreamSlot
from . import alone
from . import watcher as watcher_module
from .admission import Admission
from .clients import Arrival, shared_body
from .credential_watch import CredentialWatch
from .framing import Framer
from .reading import StreamItem
from .watcher import RunWatcher
from .writer import SharedWriters

EXTENSION_KEY = "delivery"
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class StreamRequest:
    """One event-stream request, as the HTTP edge hands it to delivery."""

    app: App
    run: WorkflowRun
    #: Where the client starts: strictly after a cursor, at the run's start (``StartAt.BEGINNING``: a
    #: snapshot, or the run this request starts), or at the live tail (``StartAt.TAIL``: Dify's reader
    #: without ``Last-Event-ID`` or a snapshot).
    start: StartAt | TopicCursor
    #: The bytes of what the response sends, bound to its run and user (SSE, sealed ids).
    framer: Framer
    continue_on_pause: bool = False
    #: The request created the run: its stream is fixed at the run's start, then the run is dispatched.
    new_run: bool = False
    #: The client's socket where a shared writer may write it (``clients.writable_socket``), else ``None``.
    socket: Any | None = None
    #: HTTP/1.1 (chunked) rather than HTTP/1.0 (bare bytes until the close).
    chunked: bool = True
    #: ``run`` is a copy of its row that the run's writer keeps (``run_cards``), not a row just read.
    recalled: bool = False
    #: What the request proved (``g.credential``): the stream ends with ``key_revoked`` when it is revoked.
    credential: Credential | None = None
    #: The open-stream slots the edge took for it (``limits.acquire_stream``): given back when it ends.
    slot: StreamSlot | None = None


class DeliveryRuntime:
    def __init__(self, app: Flask, config: AppConfig, events: EventTransportExtension) -> None:
        self._config = config
        self._events = events
        #: Seals and opens the resume tokens of this deployment (``RESUME_TOKEN_KEYS``; without them a
        #: development key derived from ``SECRET_KEY``, see docs/configuration.md).
        self.tokens = ResumeTokenCodec(parse_keys(config.RESUME_TOKEN_KEYS) or [development_key(config.SECRET_KEY)])
        interval = max(0.5, config.WORKFLOW_LEASE_TTL / 3)
        self.watcher = RunWatcher(app, interval=interval, grace=config.WORKFLOW_END_RETRY_DEADLINE + interval)
        #: Ends the open streams of a revoked API key or passport (``CREDENTIAL_CHECK_INTERVAL``).
        self.credentials = CredentialWatch(app, interval=config.CREDENTIAL_CHECK_INTERVAL)
        self.writers = SharedWriters(
            app,
            self.watcher,
            credentials=self.credentials,
            ping_interval=config.SSE_PING_INTERVAL,
            idle_timeout=config.SSE_IDLE_TIMEOUT,
            history=config.SSE_WRITER_HISTORY,
        )
        self.admission = Admission(
            max_starting=config.SSE_MAX_STARTING,
            max_lag=config.SSE_MAX_LOOP_LAG,
            retry_after_max=config.SSE_BUSY_RETRY_AFTER_MAX,
            max_rate=config.SSE_MAX_ARRIVAL_RATE,
            max_streams=config.SSE_MAX_STREAMS,
        )

    def find_run(self, app: App, run_or_task_id: str, user: str) -> tuple[WorkflowRun, bool]:
        """The run a client asks for, and whether it is a copy of its row that the run's writer keeps:
        a herd of arrivals at a run this process delivers shares one recent row instead of a query
        each (``run_cards``); anyone else's run is read and checked (``watcher.checked_run``).

        Raises:
            NotFoundError: (404) no such run of this app and user.
        """
        run = self.writers.cards.recall(run_or_task_id, app_id=app.id, end_user=user)
        metrics.RUN_LOOKUPS.tally.add(("writer" if run is not None else "database",))
        if run is not None:
            return run, True
        return watcher_module.checked_run(app, run_or_task_id, user), False

    def open_stream(self, request: StreamRequest) -> Iterator[bytes]:
        """The bytes of the client's stream, each event's cursor sealed into its ``id:`` by the request's
        framer; everything that can refuse the request is decided before the first byte. Closing the
        iterator ends the stream and frees what it holds.

        Raises:
            GoneError: (410) ``resume_cursor_expired`` (the cursor's position is gone) or
                ``run_events_lost`` (the retained events are not the run's whole history).
            ServiceUnavailableError: (503) the stream store (``stream_unavailable``) or, for a new
                run, the task queue (``queue_unavailable``) is unavailable; a new run then failed.
            NotFoundError: (404) a recalled run is no longer this app's and user's.
        """
        try:
            body = self._open(request)
        except BaseException:
            if request.slot is not None:
                limits.release_stream(request.slot)
            raise
        return body if request.slot is None else _Releasing(body, request.slot)

    def _open(self, request: StreamRequest) -> Iterator[bytes]:
        app, run = request.app, request.run
        ids = alone.RunIds.of(app, run, request.credential)
        arrival = self._arrive(request, ids)
        if arrival is not None:
            if request.new_run:
                try:
                    runs.dispatch(run)
                except BaseException:
                    arrival.cancel()
                    raise
            metrics.ARRIVALS.tally.add(("shared",))
            events = None
        else:
            if request.new_run:
                events = alone.run_streaming(app, run, request.credential)
            else:
                if request.recalled:  # the client reads on its own, from the row as it is now
                    run = watcher_module.checked_run(app, run.id, run.end_user)
                    db.session.close()
                cursor = None if isinstance(request.start, StartAt) else request.start
                events = alone.reconnect(
                    app,
                    run,
                    cursor=cursor,
                    continue_on_pause=request.continue_on_pause,
                    snapshot=request.start is StartAt.BEGINNING,
                    credential=request.credential,
                )
                metrics.ARRIVALS.tally.add(("alone",))
        if request.socket is None:
            assert events is not None, "an arrival needs a shared writer"
            return _alone_body(events, request.framer)
        return shared_body(
            events,
            writers=self.writers,
            socket=request.socket,
            chunked=request.chunked,
            ids=ids,
            framer=request.framer,
            continue_on_pause=request.continue_on_pause,
            arrival=arrival,
        )

    def _arrive(self, request: StreamRequest, ids: alone.RunIds) -> Arrival | None:
        """The client's way in at its run's writer, if a writer may write its socket and the run is live."""
        if request.socket is None or not (request.new_run or not request.run.run_status.is_terminal):
            return None
        epoch = None if request.new_run else request.run.stream_epoch
        key = (ids.topic, request.framer.binding)
        if not request.new_run and not request.recalled:
            # Before arriving (which may wait for a new writer to read its run): the clients arriving
            # meanwhile use this row instead of reading it each.
            self.writers.cards.remember(key, request.run)
        return self.writers.arrive(key, ids, request.framer, request.start, epoch=epoch)

    @property
    def transport(self) -> WorkflowEventTransport:
        """The transport the streams read through (its current connection: see the module's rules)."""
        return self._events.transport

    def drain(self) -> None:
        """The process is going away (SIGTERM, a reload): end every open stream with a ``retry:``.

        The writers' clients first (each gets its ``retry:`` from its writer), then every stream that
        reads alone and every writer's subscription (the watcher closes them; each stream ends with
        its own ``retry:``); a stream that starts after this ends at once. The clients resume with
        ``Last-Event-ID`` on another process; the server's drain then finds no connection left.
        """
        writers = self.writers.drain(lambda: alone.drain_retry_ms(self._config))
        drained = self.watcher.drain()
        logger.info("draining: %d writer(s) and %d stream(s) told their clients to come back", writers, drained)


def init_app(app: Flask, config: AppConfig) -> DeliveryRuntime:
    """Needs ``ext_event_bus`` initialised first."""
    built = DeliveryRuntime(app, config, app.extensions[EVENTS_KEY])
    app.extensions[EXTENSION_KEY] = built
    # For the modules the runtime's own parts import (the writers import the streams and the watcher).
    app.extensions[watcher_module.EXTENSION_KEY] = built.watcher
    app.extensions[alone.TRANSPORT_KEY] = lambda: built.transport
    app.extensions[alone.CREDENTIALS_KEY] = built.credentials
    return built


def current_runtime() -> DeliveryRuntime:
    """The current app's runtime."""
    built: DeliveryRuntime = current_app.extensions[EXTENSION_KEY]
    return built


def _alone_body(events: Iterator[StreamItem], framer: Framer) -> Iterator[bytes]:
    """The bytes of a client reading alone, one write per item; closing it closes ``events``."""
    try:
        for item in events:
            yield framer.item(item)
            del item  # not kept while the next one is awaited
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


class _Releasing:
    """A stream's body that gives its open-stream slots back when the server closes it (once, started or not)."""

    __slots__ = ("_body", "_slot")

    def __init__(self, body: Iterator[bytes], slot: StreamSlot) -> None:
        self._body = body
        self._slot: StreamSlot | None = slot

    def __iter__(self) -> _Releasing:
        return self

    def __next__(self) -> bytes:
        return next(self._body)

    def close(self) -> None:
        slot, self._slot = self._slot, None
        if slot is None:
            return
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            limits.release_stream(slot)
