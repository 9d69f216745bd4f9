"""Genuine material for hostile cases: finished runs and their resume tokens, made through the API itself."""

from __future__ import annotations

import json
from typing import Any

from harness.hostile import GenuineRun, Target
from harness.http_transport import HttpRequest, Transport

__all__ = ["FAST_WORKFLOW", "build_target"]

#: A workflow that finishes in milliseconds (no simulated model), so accepted hostile runs cost little.
FAST_WORKFLOW: dict[str, Any] = {
    "name": "Fast",
    "mode": "workflow",
    "graph": {
        "nodes": [
            {"id": "start", "type": "start", "variables": [{"name": "n", "required": True}]},
            {"id": "t", "type": "template", "template": "run {{start.n}}"},
            {"id": "end", "type": "end", "outputs": {"out": "{{t.output}}"}},
        ],
        "edges": [{"source": "start", "target": "t"}, {"source": "t", "target": "end"}],
    },
}
USER, OTHER_USER = "hostile-user", "hostile-other"


def build_target(
    transport: Transport,
    app: dict[str, str],
    other_app: dict[str, str],
    *,
    max_body_bytes: int,
    max_json_depth: int,
) -> Target:
    """Runs ``FAST_WORKFLOW`` to the end a few times, as each kind of owner, collecting every token.

    ``app`` and ``other_app`` are what ``flask create-app`` printed for two apps of that workflow.
    """
    passport = _passport(transport, app["site_code"])
    return Target(
        api_key=app["api_key"],
        other_api_key=other_app["api_key"],
        site_code=app["site_code"],
        passport=passport,
        other_passport=_passport(transport, app["site_code"]),
        user=USER,
        other_user=OTHER_USER,
        run=_streamed_run(transport, "/v1/workflows/run", app["api_key"], USER),
        sibling_run=_streamed_run(transport, "/v1/workflows/run", app["api_key"], USER),
        other_users_run=_streamed_run(transport, "/v1/workflows/run", app["api_key"], OTHER_USER),
        other_apps_run=_streamed_run(transport, "/v1/workflows/run", other_app["api_key"], USER),
        web_run=_streamed_run(transport, "/api/workflows/run", passport, None),
        max_body_bytes=max_body_bytes,
        max_json_depth=max_json_depth,
        input_name="n",
    )


def _passport(transport: Transport, site_code: str) -> str:
    answer = transport.send(HttpRequest("GET", "/api/passport", (("X-App-Code", site_code),)))
    assert answer.status == 200, answer
    token: str = answer.body["access_token"]
    return token


def _streamed_run(transport: Transport, path: str, credential: str, user: str | None) -> GenuineRun:
    body: dict[str, Any] = {"inputs": {"n": "genuine"}, "response_mode": "streaming"}
    if user is not None:
        body["user"] = user
    headers = (("Authorization", f"Bearer {credential}"), ("Content-Type", "application/json"))
    # Workflow events are the messages without an SSE event name (not pings, not an older server's notices).
    streamed = transport.read_stream(HttpRequest("POST", path, headers, json.dumps(body).encode()))
    messages = [m for m in streamed if m.event is None]
    events = [m.json for m in messages]
    assert events and events[-1]["event"] == "workflow_finished", events
    tokens = tuple(m.id for m in messages if m.id)
    assert len(tokens) == len(messages) >= 3, "every event of a run carries a resume token"
    return GenuineRun(run_id=events[0]["workflow_run_id"], task_id=events[0]["task_id"], tokens=tokens)
