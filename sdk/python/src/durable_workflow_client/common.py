"""Small pieces both clients share: timeouts, the reconnect note, the bodies of 2xx answers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import httpx

from .models import HumanInputAccepted, Passport, RunDetail, RunHandle, RunOutcome

#: Seconds without a byte after which a connection counts as dead: several server pings (10 s apart by default).
DEFAULT_READ_TIMEOUT = 45.0


def timeouts(read_timeout: float) -> httpx.Timeout:
    return httpx.Timeout(10.0, read=read_timeout)


@dataclasses.dataclass(frozen=True, slots=True)
class ReconnectInfo:
    """Passed to ``on_reconnect`` before a stream reconnects."""

    #: The stream's reconnects so far, this one included.
    attempt: int
    #: Seconds until the reconnect.
    delay: float
    #: What ended the previous connection.
    error: BaseException
    #: The ``Last-Event-ID`` the reconnect sends.
    last_event_id: str | None


ReconnectHook = Callable[[ReconnectInfo], None]


def outcome_of(body: dict[str, Any], replayed: bool) -> RunOutcome:
    run = RunDetail.from_json(body["data"])
    return RunOutcome(str(body["task_id"]), str(body["workflow_run_id"]), run, replayed=replayed)


def passport_of(body: dict[str, Any]) -> Passport:
    return Passport(access_token=str(body["access_token"]), end_user=str(body["end_user"]))


def handle_of(body: dict[str, Any], replayed: bool) -> RunHandle:
    return RunHandle(str(body["task_id"]), str(body["workflow_run_id"]), replayed=replayed)


def accepted_of(body: dict[str, Any]) -> HumanInputAccepted:
    return HumanInputAccepted(str(body["task_id"]), str(body["workflow_run_id"]), str(body["status"]))
