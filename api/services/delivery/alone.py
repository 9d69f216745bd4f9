"""A client reading a run alone: where it starts, its own subscription, and how its stream ends.

Used where no shared writer may write the client's socket (another server, TLS, ``HEAD``), and by a
client a writer could not serve (:func:`reconnect` without a live writer, :func:`follow` after a
hand-back). The items it yields (``reading``) know nothing of SSE or resume tokens: the HTTP edge
frames them and seals each cursor into the ``id:`` of its event.

Where a reader without a cursor starts is Dify's rule: from the current tail (what happens next),
or with a snapshot from the beginning of the retained run; see :func:`reconnect`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from flask import current_app

from api.configs import AppConfig
from api.core.app.apps.event_codec import encode_event, event_name
from api.core.app.apps.event_transport import EventSubscription, StreamMessage, WorkflowEventTransport
from api.core.app.apps.message_generator import MessageGenerator, StartAt
from api.core.app.apps.run_history import history_gap
from api.core.durable_stream import CLOSED, Closed, CursorUnavailableError, DurableStreamError, TopicCursor
from api.extensions.ext_durable_stream import retention_max_age
from api.libs import log_context, metrics
from api.libs.errors import STREAM_FAILED_RUN, STREAM_UNAVAILABLE, GoneError, ServiceUnavailableError
from api.models import App, WorkflowRun

from .. import workflow_run_service as runs
from ..credentials import Credential
from . import watcher as rows
from .credential_watch import KEY_REVOKED_MESSAGE, CredentialWatch
from .reading import PING, IncompleteRunError, Notice, Retry, StreamEvent, StreamItem, read_alone
from .watcher import run_watcher

logger = logging.getLogger(__name__)

HISTORY_DIVERGED_MESSAGE = (
    "the stream store no longer holds the run's events up to this point as this client received them "
    "(a store failover lost some); reload the run (GET /workflows/run/<id>)"
)

CURSOR_EXPIRED_MESSAGE = (
    "the run's events after this point are no longer retained; reload the run (GET /workflows/run/<id>)"
)
#: The shortest wait a drained stream asks its client for (milliseconds).
DRAIN_RETRY_MIN_MS = 250
#: Events ready at once that one chunk (one socket write) may carry.
COALESCE = 64

EVENTS_LOST_MESSAGE = (
    "the run's events are not all retained (retention removed its start, or the stream store lost them); "
    "reload the run (GET /workflows/run/<id>)"
)

#: A stream of events for the HTTP edge; closing it closes the subscription behind it.
EventStream = Generator[StreamItem, None, None]


#: Where the runtime puts its transport getter for the streams (which the runtime's writers import).
TRANSPORT_KEY = "delivery_transport"
#: Where the runtime puts its credential watch.
CREDENTIALS_KEY = "delivery_credentials"


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def current_transport() -> WorkflowEventTransport:
    """The event transport of this process, as its :class:`~.runtime.DeliveryRuntime` hands it out."""
    source: Callable[[], WorkflowEventTransport] = current_app.extensions[TRANSPORT_KEY]
    return source()


def credential_watch() -> CredentialWatch:
    """The credential watch of this process (its :class:`~.runtime.DeliveryRuntime`'s)."""
    watch: CredentialWatch = current_app.extensions[CREDENTIALS_KEY]
    return watch


def resumable() -> bool:
    """Whether events carry cursors (and a client's ``Last-Event-ID`` means anything).

    Read from the settings, not the transport: this decides how a request's token is checked, which
    must not wait for (or fail with) the store's connection.
    """
    return _config().WORKFLOW_EVENT_TRANSPORT == "durable_stream"


def run_headers(run: WorkflowRun) -> dict[str, str]:
    """The ids a streaming client needs to reconnect, sent before any event."""
    return {"X-Task-Id": run.task_id, "X-Workflow-Run-Id": run.id}


def run_streaming(app: App, run: WorkflowRun, credential: Credential | None = None) -> EventStream:
    """Subscribe at the tail, then dispatch, then stream: no event of the run can be missed.

    The ids a client needs to reconnect travel in the response headers (:func:`run_headers`), so
    the stream itself carries only the run's events, as Dify's clients expect.

    Raises:
        ServiceUnavailableError: The stream store or the task queue is unavailable; the run failed.
    """
    try:
        subscription = MessageGenerator.retrieve_events(current_transport(), runs.topic_name(app, run), StartAt.TAIL)
        subscription.__enter__()
    except DurableStreamError as exc:
        logger.warning("run %s: the event stream is unavailable, the run is not started: %s", run.id, exc)
        runs.abandon(run, STREAM_FAILED_RUN)
        raise ServiceUnavailableError(STREAM_UNAVAILABLE) from exc
    except ServiceUnavailableError:  # e.g. event_stream_busy: answered 503 as it is, never dispatched
        runs.abandon(run, "the event stream could not be opened")
        raise
    try:
        runs.dispatch(run)
    except BaseException:
        subscription.close()
        raise
    return _closing(_events(RunIds.of(app, run, credential), subscription, continue_on_pause=False), subscription)


def _closing(events: EventStream, subscription: EventSubscription) -> EventStream:
    try:
        yield from events
    finally:
        # Also when the client left before the events began (the inner generator never started).
        events.close()
        subscription.close()


def reconnect(
    app: App,
    run: WorkflowRun,
    *,
    cursor: TopicCursor | None,
    continue_on_pause: bool,
    snapshot: bool = True,
    credential: Credential | None = None,
) -> EventStream:
    """Resume strictly after ``cursor``; without one, replay the whole retained run (``snapshot``) or
    follow it from the current tail — for a run that has ended, its ``workflow_finished`` alone.

    Raises:
        GoneError: (410) ``resume_cursor_expired``: the cursor is genuine but its position is gone;
            ``history_diverged``: the store holds another history before the position (a failover);
            ``run_events_lost``: without a cursor, the retained events are not the run's whole
            history (its start was removed, or the topic is another incarnation than the run's).
            Both carry the run row.
        ServiceUnavailableError: (503, ``stream_unavailable``) the stream store cannot be reached.
    """
    if run.run_status.is_terminal and (cursor is not None or snapshot):
        rows.repair_lost_end(app, run)  # a failover may have lost its end: not a run to wait on
    try:
        if cursor is None and not snapshot and run.run_status.is_terminal:
            return _only(PING, _row_event(run))  # what comes next is its end alone: no store needed
        # Inside the mapping: a process's first use of the store opens its connection, which an
        # outage at that moment fails like any later call.
        transport = current_transport()
        if not transport.resumable:
            cursor = None
        if cursor is None and not snapshot:
            return _tail(RunIds.of(app, run, credential), run, transport, continue_on_pause=continue_on_pause)
        return _open(RunIds.of(app, run, credential), run, transport, cursor, continue_on_pause=continue_on_pause)
    except CursorUnavailableError as exc:
        raise _gone(run, *cursor_gone(exc)) from exc
    except IncompleteRunError as exc:
        raise _gone(run, "run_events_lost", EVENTS_LOST_MESSAGE) from exc
    except DurableStreamError as exc:
        logger.warning("run %s: a reader found the event stream unavailable: %s", run.id, exc)
        raise ServiceUnavailableError(STREAM_UNAVAILABLE) from exc


def _open(
    ids: RunIds,
    run: WorkflowRun,
    transport: WorkflowEventTransport,
    cursor: TopicCursor | None,
    *,
    continue_on_pause: bool,
) -> EventStream:
    """Subscribe where the reader starts and check what it will see, before the response begins.

    Raises:
        CursorUnavailableError: The cursor's position is gone.
        IncompleteRunError: Without a cursor, the retained events are not the run's whole history.
        DurableStreamError: The stream store failed.
    """
    name = ids.topic
    if run.run_status.is_terminal and cursor is None and transport.resumable:
        info = transport.topic_info(name)
        if info is None or info.length == 0:
            if rows.events_lost(run, retention_max_age(_config())):
                raise IncompleteRunError(f"the events of run {run.id} are gone before retention could remove them")
            return _only(PING, _row_event(run))
    subscription = MessageGenerator.retrieve_events(transport, name, StartAt.BEGINNING if cursor is None else cursor)
    first: StreamMessage | Closed | None = None
    try:
        subscription.__enter__()
        if transport.resumable and cursor is None:
            # Checked after entering, so that the subscription cannot be on a newer incarnation.
            info = transport.topic_info(name)
            gap = history_gap(run, info)
            if gap is not None:
                raise IncompleteRunError(f"run {run.id}, topic {name!r}: {gap}")
            # Peek, so that a run whose start is gone is a 410 rather than a stream ending in an error.
            first = subscription.receive(timeout=0)
            if isinstance(first, StreamMessage) and event_name(first.payload) != "workflow_started":
                raise IncompleteRunError(f"the retained events of run {run.id} do not begin with its start")
    except BaseException:
        subscription.close()
        raise
    from_start = transport.resumable and cursor is None and first is None
    return _events(
        ids,
        subscription,
        continue_on_pause=continue_on_pause,
        first=first,
        first_event="workflow_started" if from_start else None,
    )


def _tail(ids: RunIds, run: WorkflowRun, transport: WorkflowEventTransport, *, continue_on_pause: bool) -> EventStream:
    """What happens next in the run, from the topic's current end (Dify's start without a snapshot)."""
    subscription = MessageGenerator.retrieve_events(transport, ids.topic, StartAt.TAIL)
    try:
        subscription.__enter__()
        # The run may have ended between reading its row and subscribing: then its end is behind the tail.
        latest = rows.latest(run.id)
    except BaseException:
        subscription.close()
        raise
    if latest is not None and latest.run_status.is_terminal:
        subscription.close()
        return _only(PING, _row_event(latest))
    return _events(ids, subscription, continue_on_pause=continue_on_pause)


def _only(*items: StreamItem) -> EventStream:
    yield from items


def _row_event(run: WorkflowRun) -> StreamEvent:
    """The ``workflow_finished`` of a terminal run, built from its row (it has no position)."""
    return StreamEvent("workflow_finished", encode_event(rows.final_event(run)), None)


def cursor_gone(error: CursorUnavailableError) -> tuple[str, str]:
    """The 410's code and message for a cursor the store cannot resume: ``history_diverged`` when the
    store holds another history than the one the client received, else ``resume_cursor_expired``."""
    if error.reason == "history_diverged":
        return "history_diverged", HISTORY_DIVERGED_MESSAGE
    return "resume_cursor_expired", CURSOR_EXPIRED_MESSAGE


def _gone(run: WorkflowRun, code: str, message: str) -> GoneError:
    return GoneError(message, code=code, details={"run": runs.run_detail(run)})


class RunIds(NamedTuple):
    """What a stream needs of its run for its whole life: ids, not rows.

    A stream can stay open for hours; holding the run's and the app's ORM objects (and their rows)
    would cost each of thousands of open streams a few kilobytes for nothing.
    """

    app_id: str
    task_id: str
    run_id: str
    topic: str
    #: What the request proved (an API key, a passport): a stream ends when it is revoked.
    credential: Credential | None = None

    @classmethod
    def of(cls, app: App, run: WorkflowRun, credential: Credential | None = None) -> RunIds:
        return cls(app.id, run.task_id, run.id, runs.topic_name(app, run), credential)


def follow(ids: RunIds, cursor: TopicCursor | None, *, continue_on_pause: bool) -> EventStream:
    """The run's events strictly after ``cursor`` (``None``: from its start), for a stream that has already begun.

    Nothing is checked against the run's row (the stream's start did that); a failure to subscribe
    is the stream's last item, an ``error`` notice (410 ``resume_cursor_expired`` or 503
    ``stream_unavailable``), as it is for a failure while following.
    """
    try:
        start = StartAt.BEGINNING if cursor is None else cursor
        subscription = MessageGenerator.retrieve_events(current_transport(), ids.topic, start)
    except DurableStreamError as exc:
        return _only(_unavailable_notice(ids.run_id, exc))
    try:
        subscription.__enter__()
    except CursorUnavailableError as exc:
        subscription.close()
        return _only(_error_notice(ids.run_id, *cursor_gone(exc), 410))
    except DurableStreamError as exc:
        subscription.close()
        return _only(_unavailable_notice(ids.run_id, exc))
    except BaseException:
        subscription.close()
        raise
    first_event = "workflow_started" if cursor is None else None
    return _events(ids, subscription, continue_on_pause=continue_on_pause, first_event=first_event)


def _events(
    ids: RunIds,
    subscription: EventSubscription,
    *,
    continue_on_pause: bool,
    first: StreamMessage | Closed | None = None,
    first_event: str | None = None,
) -> EventStream:
    """The stream of a client reading ``subscription`` (entered) alone, watched by the process's run
    watcher; its failures end it with an ``error`` notice."""
    config = _config()
    run_id = ids.run_id
    watcher = run_watcher()
    # The run's row is checked by the process's watcher, with every other watched run: the stream
    # itself only waits for its events and its pings.
    watch = watcher.watch(run_id, subscription, live_only=not subscription.resumable)
    revocation = credential_watch().watch(ids.credential, watch.revoke)
    transport = ("durable_stream",) if subscription.resumable else ("broadcast_channel",)
    metrics.STREAMS_OPEN.tally.add(transport)
    fields = log_context.fields_of(
        app_id=ids.app_id, task_id=ids.task_id, workflow_run_id=run_id, transport=transport[0]
    )
    binding = log_context.bound(fields)
    binding.__enter__()  # for the stream's life, in the greenlet that serves it
    try:
        if first is CLOSED:
            yield PING
            return
        events = read_alone(
            subscription,
            ping_interval=config.SSE_PING_INTERVAL,
            idle_timeout=config.SSE_IDLE_TIMEOUT,
            continue_on_pause=continue_on_pause,
            on_closed=watch.final_event,
            first=first,
            first_event=first_event,
            coalesce=COALESCE,
            left_pause=lambda payload: rows.left_pause(run_id, payload),
        )
        first = None  # delivered by `events`; this frame must not keep it for the stream's life
        yield from events
        if watch.revoked:
            yield _error_notice(run_id, "key_revoked", KEY_REVOKED_MESSAGE, 401)
        elif watch.drained:  # the process is going away: the client comes back, to another one
            yield Retry(drain_retry_ms(config))
    except CursorUnavailableError as exc:
        yield _error_notice(run_id, *cursor_gone(exc), 410)
    except IncompleteRunError:
        yield _error_notice(run_id, "run_events_lost", EVENTS_LOST_MESSAGE, 410)
    except DurableStreamError as exc:
        yield _unavailable_notice(run_id, exc)
    finally:
        metrics.STREAMS_OPEN.tally.add(transport, -1)
        credential_watch().unwatch(revocation)
        watcher.unwatch(watch)
        subscription.close()
        binding.__exit__(None, None, None)


def drain_retry_ms(config: AppConfig) -> int:
    """When a drained stream's client should come back: spread over ``SSE_DRAIN_RETRY_MAX_MS``, so
    that the clients of a stopping process do not all reconnect in the same instant."""
    return random.randint(min(DRAIN_RETRY_MIN_MS, config.SSE_DRAIN_RETRY_MAX_MS), config.SSE_DRAIN_RETRY_MAX_MS)


def _unavailable_notice(run_id: str, exc: DurableStreamError) -> Notice:
    logger.warning("run %s: the event stream failed under a reader: %s", run_id, exc)
    return _error_notice(run_id, "stream_unavailable", STREAM_UNAVAILABLE, 503)


def _error_notice(run_id: str, code: str, message: str, status: int) -> Notice:
    body: dict[str, Any] = {"code": code, "message": message, "status": status}
    if status == 410:
        run = rows.latest(run_id)
        if run is not None:
            body["run"] = runs.run_detail(run)
    return Notice("error", encode_event(body))
