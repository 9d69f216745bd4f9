"""Event streams for SSE clients: streaming runs, reconnects with ``Last-Event-ID``, resume tokens."""

from __future__ import annotations

import time
from collections.abc import Iterator

from flask import current_app

from api.configs import AppConfig
from api.core.app.apps.event_transport import EventSubscription
from api.core.app.apps.message_generator import (
    PING,
    MessageGenerator,
    stream_topic_events,
    terminal_events,
)
from api.core.durable_stream import CursorUnavailableError, DurableStreamError, TopicCursor
from api.core.workflow.engine import finished_event
from api.extensions.ext_database import db
from api.extensions.ext_event_bus import event_transport
from api.libs import sse
from api.libs.resume_token import InvalidResumeTokenError, ResumeTokenCodec
from api.models import App, WorkflowRun

from . import workflow_run_service as runs
from .errors import GoneError, InvalidParamError, ServiceUnavailableError

CURSOR_EXPIRED_MESSAGE = (
    "the run's events after this point are no longer retained; reload the run (GET /workflows/run/<id>)"
)


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def _codec() -> ResumeTokenCodec:
    codec: ResumeTokenCodec = current_app.extensions["resume_tokens"]
    return codec


def run_streaming(app: App, run: WorkflowRun) -> Iterator[str]:
    """Subscribe at the tail, then dispatch, then stream: no event of the run can be missed."""
    subscription = event_transport().subscribe_live(runs.topic_name(app, run))
    try:
        subscription.__enter__()
    except DurableStreamError as exc:
        raise ServiceUnavailableError(f"the event stream is unavailable: {exc}") from exc
    try:
        runs.dispatch(run)
    except BaseException:
        subscription.close()
        raise
    return _sse(app, run, subscription, continue_on_pause=False)


def reconnect(app: App, run: WorkflowRun, *, last_event_id: str | None, continue_on_pause: bool) -> Iterator[str]:
    """Resume strictly after ``last_event_id``; without one, replay the whole retained run.

    Raises:
        InvalidParamError: (400, ``invalid_resume_token``) the token is malformed, forged, made with an
            unknown key, or belongs to another run or user.
        GoneError: (410, ``resume_cursor_expired``) the token is genuine but its position is gone.
    """
    transport = event_transport()
    name = runs.topic_name(app, run)
    cursor: TopicCursor | None = None
    if transport.resumable and last_event_id:
        try:
            cursor = TopicCursor(_codec().open(last_event_id, topic=name, app_id=app.id, end_user=run.end_user))
        except InvalidResumeTokenError as exc:
            raise InvalidParamError(str(exc), code="invalid_resume_token") from exc
    if run.run_status.is_terminal and cursor is None:
        info = transport.topic_info(name)
        if info is None or info.length == 0:
            return iter([sse.PING, sse.sse_event(_finished_from_row(run))])
    subscription = MessageGenerator.retrieve_events(transport, name, cursor)
    try:
        subscription.__enter__()
    except CursorUnavailableError as exc:
        raise GoneError(CURSOR_EXPIRED_MESSAGE, code="resume_cursor_expired") from exc
    except DurableStreamError as exc:
        raise ServiceUnavailableError(f"the event stream is unavailable: {exc}") from exc
    return _sse(app, run, subscription, continue_on_pause=continue_on_pause)


def _sse(app: App, run: WorkflowRun, subscription: EventSubscription, *, continue_on_pause: bool) -> Iterator[str]:
    config = _config()
    name = runs.topic_name(app, run)
    codec = _codec()
    app_id, run_id, end_user = app.id, run.id, run.end_user
    lease_check = _LeaseCheck(app_id, run_id, interval=max(0.5, config.WORKFLOW_LEASE_TTL / 3))
    try:
        for item in stream_topic_events(
            subscription,
            ping_interval=config.SSE_PING_INTERVAL,
            idle_timeout=config.SSE_IDLE_TIMEOUT,
            terminal=terminal_events(continue_on_pause),
            on_idle=lease_check,
        ):
            if item is PING:
                yield sse.PING
                continue
            assert not isinstance(item, type(PING))
            token = None
            if item.cursor is not None:
                token = codec.seal(item.cursor, topic=name, app_id=app_id, end_user=end_user)
            yield sse.sse_event(item.event, event_id=token)
    except CursorUnavailableError:
        yield sse.sse_event(
            {"code": "resume_cursor_expired", "message": CURSOR_EXPIRED_MESSAGE, "status": 410}, event="error"
        )
    except DurableStreamError as exc:
        yield sse.sse_event({"code": "stream_unavailable", "message": str(exc), "status": 503}, event="error")
    finally:
        subscription.close()


class _LeaseCheck:
    """On idle, end the run if its worker died (at most once per ``interval``)."""

    def __init__(self, app_id: str, run_id: str, interval: float) -> None:
        self._app_id, self._run_id, self._interval = app_id, run_id, interval
        self._last = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        self._last = now
        run = db.session.get(WorkflowRun, self._run_id)
        app = db.session.get(App, self._app_id)
        if run is None or app is None:
            return
        db.session.refresh(run)
        runs.check_lease(app, run)
        db.session.commit()  # end the read transaction: the next check must see fresh rows


def _finished_from_row(run: WorkflowRun) -> dict[str, object]:
    return finished_event(
        task_id=run.task_id,
        workflow_run_id=run.id,
        app_id=run.app_id,
        status=run.status,
        outputs=run.outputs,
        error=run.error,
        steps=run.total_steps,
        created_at=run.created_timestamp,
        finished_at=run.finished_timestamp,
    )
