"""Responses shared by the service API and the web app: starting a run and (re)attaching to its events.

This is the HTTP edge of the event streams: a client's ``Last-Event-ID`` is opened into a cursor
here, and the cursor of every event sent is sealed into its ``id:`` here (the services deal in
cursors only).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from flask import Flask, Response, current_app, g, request

from api.controllers.common.sse import SSE_HEADERS, SseFramer
from api.core.app.apps.message_generator import StartAt
from api.core.durable_stream import TopicCursor
from api.libs import log_context, metrics
from api.libs.errors import GoneError, InvalidParamError, NotFoundError, ServiceUnavailableError
from api.libs.resume_token import InvalidResumeTokenError
from api.models import App, WorkflowRun
from api.models.engine import db
from api.services import delivery as event_streams
from api.services import idempotency, limits
from api.services import workflow_run_service as runs
from api.services.delivery import current_runtime
from api.services.run_recovery import run_log_fields

logger = logging.getLogger(__name__)


def start_run(app_model: App, body: Any) -> Any:
    """``POST …/workflows/run`` in any response mode; an ``Idempotency-Key`` makes a retry safe."""
    inputs, user, mode = runs.parse_run_request(app_model, body)
    # A streaming start takes its open-stream slot first: a refused one (429) creates no run.
    slot = limits.acquire_stream(app_model.id, user) if mode == "streaming" else None
    try:
        return _start_run(app_model, body, inputs, user, mode, slot)
    except BaseException:
        if slot is not None:
            limits.release_stream(slot)
        raise


def _start_run(
    app_model: App, body: Any, inputs: dict[str, Any], user: str, mode: str, slot: limits.StreamSlot | None
) -> Any:
    key = idempotency.parse_key(request.headers.get(idempotency.HEADER))
    if key is None:
        run = runs.create_run(app_model, inputs, user)
    else:
        run, replayed = idempotency.create_run_once(app_model, inputs, user, key, idempotency.fingerprint(body))
        if replayed:
            return _replay(app_model, run, mode, slot)
    if mode == "async":
        runs.dispatch(run)
        return {"task_id": run.task_id, "workflow_run_id": run.id}, 202
    if mode == "streaming":
        return event_stream_response(
            app_model, run, StartAt.BEGINNING, headers=event_streams.run_headers(run), new_run=True, slot=slot
        )
    return runs.run_blocking(app_model, run)


def _replay(app_model: App, run: WorkflowRun, mode: str, slot: limits.StreamSlot | None) -> Any:
    """The answer to a retried start: the run an earlier request with the same key started."""
    replayed = {idempotency.REPLAYED_HEADER: "true"}
    logger.info("run %s: a retried start of the same Idempotency-Key gets the same run", run.id)
    if mode == "async":
        return {"task_id": run.task_id, "workflow_run_id": run.id}, 202, replayed
    if mode == "streaming":
        db.session.close()
        headers = {**event_streams.run_headers(run), **replayed}
        return event_stream_response(app_model, run, StartAt.BEGINNING, headers=headers, slot=slot)
    return runs.run_blocking(app_model, run, replay=True), 200, replayed


def admitted_stream(view: Callable[..., Any]) -> Callable[..., Any]:
    """Admit an event-stream request before anything else, its credentials included: a worker that
    cannot take another stream refuses it (503 ``server_busy``) at the least cost (``delivery.admission``)."""

    @functools.wraps(view)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        admission = current_runtime().admission
        with admission.start():
            response = view(*args, **kwargs)
        if isinstance(response, Response) and response.is_streamed:
            # Counted as open until the server closes the body (the stream ended, or its client left).
            response.response = admission.holding(response.response)
        return response

    return decorated


def run_events(app_model: App, task_id: str, user: str) -> Response:
    """``GET …/workflow/<id>/events`` (the run's id or its task's): ``Last-Event-ID`` (header or query),
    ``continue_on_pause`` and ``include_state_snapshot``.

    Every outcome is counted (``workflow_sse_resumes_total``): ``attached`` (the stream starts, without
    ``Last-Event-ID``), ``resumed`` (it starts after one), or the code of the refusal:
    ``invalid_resume_token`` (400), ``resume_cursor_expired`` / ``run_events_lost`` (410), ``not_found``
    (404), ``unavailable`` (503).

    Raises:
        NotFoundError: (404) no such run of this app and user.
        InvalidParamError: (400, ``invalid_resume_token``) the token is malformed, forged, made with an
            unknown key, or belongs to another run or user.
        GoneError: (410) see ``DeliveryRuntime.open_stream``.
    """
    try:
        run, recalled = current_runtime().find_run(app_model, task_id, user)
    except NotFoundError:
        metrics.RESUMES.tally.add(("not_found",))
        raise
    with log_context.bound(run_log_fields(app_model, run)):
        try:
            response = _run_events(app_model, run, recalled=recalled)
        except InvalidParamError as exc:
            if exc.code == "invalid_resume_token":
                metrics.RESUMES.tally.add((exc.code,))
                logger.info("run %s: a reconnect's resume token was refused (%s)", run.id, exc.code)
            raise
        except GoneError as exc:
            metrics.RESUMES.tally.add((exc.code,))
            logger.info("run %s: a reconnect came too late (%s)", run.id, exc.code)
            raise
        except ServiceUnavailableError as exc:
            metrics.RESUMES.tally.add(("unavailable",))
            logger.warning("run %s: a reconnect found the event stream unavailable (%s)", run.id, exc.code)
            raise
    resumed = last_event_id() is not None and event_streams.resumable()
    metrics.RESUMES.tally.add(("resumed" if resumed else "attached",))
    return response


def _run_events(app_model: App, run: WorkflowRun, *, recalled: bool) -> Response:
    """The response; ``recalled``: ``run`` is a writer's recent copy of the row, not a row just read."""
    # The rows are loaded: the stream store's round trips below must not hold a pooled connection
    # (thousands of clients reconnecting at once would wait for the pool, not for the store).
    db.session.close()
    cursor = None
    token = last_event_id()
    if token is not None and event_streams.resumable():  # a live-only transport ignores it
        cursor = open_resume_token(app_model, run, token)
    start: StartAt | TopicCursor = cursor if cursor is not None else StartAt.TAIL
    if cursor is None and _flag("include_state_snapshot"):
        start = StartAt.BEGINNING
    slot = limits.acquire_stream(app_model.id, run.end_user)  # 429 past the app's or the end user's limit
    return event_stream_response(
        app_model, run, start, continue_on_pause=_flag("continue_on_pause"), recalled=recalled, slot=slot
    )


def _flag(name: str) -> bool:
    """A boolean query parameter (``true`` / ``false``, as Dify's clients send them; ``1`` / ``yes`` too)."""
    return request.args.get(name, "").lower() in ("1", "true", "yes")


def last_event_id() -> str | None:
    """The header browsers send on reconnect, or a query parameter for clients that cannot set headers.

    Only the header's optional whitespace (spaces and tabs around a field value) is dropped, as every
    HTTP server does; anything else around or inside a token makes it malformed, not another spelling.
    """
    value = (request.headers.get("Last-Event-ID") or "").strip(" \t") or request.args.get("last_event_id")
    return value or None


def open_resume_token(app_model: App, run: WorkflowRun, token: str) -> TopicCursor:
    """The cursor sealed in ``token``, which must have been issued for this run's topic, app and user."""
    try:
        cursor = current_runtime().tokens.open(
            token, topic=runs.topic_name(app_model, run), app_id=app_model.id, end_user=run.end_user
        )
    except InvalidResumeTokenError as exc:
        raise InvalidParamError(str(exc), code="invalid_resume_token") from exc
    return TopicCursor(cursor)


def event_stream_response(
    app_model: App,
    run: WorkflowRun,
    start: StartAt | TopicCursor,
    *,
    headers: dict[str, str] | None = None,
    continue_on_pause: bool = False,
    new_run: bool = False,
    recalled: bool = False,
    slot: limits.StreamSlot | None = None,
) -> Response:
    """An SSE response of the run's events from ``start``, each event's cursor sealed into a token bound
    to the run and user; delivery decides how (``DeliveryRuntime.open_stream``).

    The request's database work ends here: the stream may stay open for hours, and must hold
    neither a pooled connection nor the rows the request loaded.
    """
    runtime = current_runtime()
    # Bound once per response: the associated data and the AEAD object are reused for every event.
    sealer = runtime.tokens.sealer(topic=runs.topic_name(app_model, run), app_id=app_model.id, end_user=run.end_user)
    # Events appended before this moment are replayed, not delivered live (the lag metric is the live one's).
    framer = SseFramer(sealer, since=time.time())
    socket = None
    if current_app.config["APP_CONFIG"].SSE_SHARED_WRITER and event_streams.resumable():
        socket = event_streams.writable_socket(request.environ)
    stream = event_streams.StreamRequest(
        app=app_model,
        run=run,
        start=start,
        framer=framer,
        continue_on_pause=continue_on_pause,
        new_run=new_run,
        socket=socket,
        chunked=request.environ.get("SERVER_PROTOCOL") != "HTTP/1.0",
        recalled=recalled,
        credential=g.get("credential"),
        slot=slot,
    )
    body = runtime.open_stream(stream)
    db.session.close()
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]  # the app, not its proxy
    # Passed through as it is: the chunks are bytes already, and werkzeug's encoding and closing
    # wrappers would add two layers to every chunk's way out (and to every parked stream's stack).
    return Response(
        _in_app_context(app, body),
        mimetype="text/event-stream",
        headers={**SSE_HEADERS, **(headers or {})},
        direct_passthrough=True,
    )


def _in_app_context(app: Flask, chunks: Iterator[bytes]) -> Generator[bytes, None, None]:
    """``chunks`` run in an application context of their own, from the first chunk to the close.

    Not the request's context (``stream_with_context``): a stream may stay open for hours, and its
    events need the app (settings, a database session for an error notice), never the request.
    A WSGI server asks for a first chunk before anything else, so ``chunks`` always starts and its
    ``finally`` (closing the subscription) always runs.
    """
    with app.app_context():
        try:
            yield from chunks
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
