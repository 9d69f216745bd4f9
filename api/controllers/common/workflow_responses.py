"""Responses shared by the service API and the web app: starting a run and (re)attaching to its events."""

from __future__ import annotations

from typing import Any

from flask import Response, request, stream_with_context

from api.libs.sse import SSE_HEADERS
from api.models import App, WorkflowRun
from api.services import workflow_event_service as event_streams
from api.services import workflow_run_service as runs


def start_run(app_model: App, body: Any) -> Any:
    """``POST …/workflows/run`` in any response mode."""
    inputs, user, mode = runs.parse_run_request(app_model, body)
    run = runs.create_run(app_model, inputs, user)
    if mode == "async":
        runs.dispatch(run)
        return {"task_id": run.task_id, "workflow_run_id": run.id}, 202
    if mode == "streaming":
        return event_stream_response(event_streams.run_streaming(app_model, run), event_streams.run_headers(run))
    return runs.run_blocking(app_model, run)


def run_events(app_model: App, run: WorkflowRun) -> Response:
    """``GET …/workflow/<task_id>/events``: ``Last-Event-ID`` (header or query) and ``continue_on_pause``."""
    return event_stream_response(
        event_streams.reconnect(
            app_model,
            run,
            last_event_id=last_event_id(),
            continue_on_pause=request.args.get("continue_on_pause", "").lower() in ("1", "true", "yes"),
        )
    )


def last_event_id() -> str | None:
    """The header browsers send on reconnect, or a query parameter for clients that cannot set headers.

    Only the header's optional whitespace (spaces and tabs around a field value) is dropped, as every
    HTTP server does; anything else around or inside a token makes it malformed, not another spelling.
    """
    value = (request.headers.get("Last-Event-ID") or "").strip(" \t") or request.args.get("last_event_id")
    return value or None


def event_stream_response(events: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(
        stream_with_context(events), mimetype="text/event-stream", headers={**SSE_HEADERS, **(headers or {})}
    )
