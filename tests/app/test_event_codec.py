"""The event codec: the name read from a payload's prefix is the name JSON decoding finds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.core.app.apps.event_codec import encode_event, event_name
from api.core.workflow.events import make_event


def _decoded_name(payload: bytes) -> str | None:
    try:
        event = json.loads(payload)
    except ValueError:
        return None
    name = event.get("event") if isinstance(event, dict) else None
    return name if isinstance(name, str) else None


@pytest.mark.parametrize(
    "event",
    [
        make_event("text_chunk", task_id="t", workflow_run_id="r", data={"text": 'a "quoted" \n chunk'}),
        make_event("workflow_finished", task_id="t", workflow_run_id="r", data={}),
        {"event": "run_created", "task_id": "t"},
        {"event": "only"},
        {"event": 'odd"name'},
        {"event": "caf\u00e9"},
        {"event": "tab\there"},
        {"event": ""},
        {"event": 3},
        {"task_id": "t", "event": "second"},
        {"code": "x", "message": "no event"},
    ],
)
def test_the_name_of_an_encoded_event_is_the_decoded_name(event: dict[str, Any]) -> None:
    payload = encode_event(event)
    assert event_name(payload) == _decoded_name(payload)


@pytest.mark.parametrize("payload", [b"", b"[]", b"not json", b'{"event":"x"', b'{"event":"x"]', b'"event"', b"{}"])
def test_anything_else_is_decoded_or_none(payload: bytes) -> None:
    assert event_name(payload) == _decoded_name(payload)
