"""Checking what clients received against what the stream store holds.

Two checks. :func:`compare` matches a client's whole copy of a run against the stored run event by
event: lost (stored, never received), duplicated (received again), reordered (received after an
event that comes later in the store) and foreign (received, but not in the store). :func:`check_resumes`
looks at each reconnect with ``Last-Event-ID`` on its own: what it delivered must be exactly the
stored events that follow the event the id belonged to; anything else is a *skip*.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from harness.sse_client import Connection, FollowedRun

Event = dict[str, Any]


def canonical(event: Event) -> str:
    return json.dumps(event, sort_keys=True, separators=(",", ":"))


def shape(event: Event) -> str:
    """What identifies an event within one run of the soak workflows, without run ids or clocks.

    For live-only transports, whose runs have no stored copy, and for a ``workflow_finished`` that
    the server built from the run row (it carries the row's timestamps, not the worker's).
    """
    data = event.get("data") or {}
    return "|".join(
        str(part) for part in (event.get("event"), data.get("node_id"), data.get("text"), data.get("status"))
    )


def outcome_or_canonical(event: Event) -> str:
    """:func:`canonical`, except that a ``workflow_finished`` is known by its outcome: a reader whose run's
    end was still pending when it gave up waiting built one from the run row, with the row's clock."""
    return shape(event) if event.get("event") == "workflow_finished" else canonical(event)


@dataclasses.dataclass
class Comparison:
    expected: int
    received: int
    lost: int
    duplicated: int
    reordered: int
    foreign: int

    @property
    def exact(self) -> bool:
        return not (self.lost or self.duplicated or self.reordered or self.foreign)

    @classmethod
    def zero(cls) -> Comparison:
        return cls(0, 0, 0, 0, 0, 0)

    def add(self, other: Comparison) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def compare(received: Sequence[Event], stored: Sequence[Event], key: Callable[[Event], str] = canonical) -> Comparison:
    positions: dict[str, list[int]] = defaultdict(list)
    for index, event in enumerate(stored):
        positions[key(event)].append(index)
    used: set[int] = set()
    duplicated = reordered = foreign = 0
    latest = -1
    for event in received:
        candidates = positions.get(key(event))
        if not candidates:
            foreign += 1
            continue
        free = [index for index in candidates if index not in used]
        if not free:
            duplicated += 1
            continue
        index = free[0]
        used.add(index)
        if index < latest:
            reordered += 1
        latest = max(latest, index)
    return Comparison(len(stored), len(received), len(stored) - len(used), duplicated, reordered, foreign)


@dataclasses.dataclass
class ResumeCheck:
    #: Reconnects with Last-Event-ID that delivered exactly the stored suffix (maybe empty) without a 410.
    resumed_ok: int = 0
    #: Reconnects with Last-Event-ID answered 410 (at once or as an ``event: error``).
    gone: int = 0
    skips: int = 0
    details: list[str] = dataclasses.field(default_factory=list)

    def add(self, other: ResumeCheck) -> None:
        self.resumed_ok += other.resumed_ok
        self.gone += other.gone
        self.skips += other.skips
        self.details.extend(other.details)


def check_resumes(run: FollowedRun, stored: Sequence[Event]) -> ResumeCheck:
    result = ResumeCheck()
    index_of = {canonical(event): index for index, event in enumerate(stored)}
    for number, connection in enumerate(run.connections):
        if not connection.resumed:
            continue
        if _is_gone(connection):
            result.gone += 1
        if connection.status != 200:
            continue
        assert connection.anchor is not None
        start = index_of.get(canonical(connection.anchor))
        delivered = [item.event for item in connection.events]
        if start is None:
            if delivered:
                result.skips += 1
                result.details.append(
                    f"run {run.run_id}, connection {number}: resumed after an event the store does not hold, "
                    f"and was given {len(delivered)} event(s)"
                )
            continue
        expected = stored[start + 1 : start + 1 + len(delivered)]
        if not _same_suffix(connection, delivered, expected):
            result.skips += 1
            result.details.append(
                f"run {run.run_id}, connection {number}: after stored event {start} it delivered "
                f"{[shape(e) for e in delivered[:3]]}… where the store has {[shape(e) for e in expected[:3]]}…"
            )
        elif not _is_gone(connection):
            result.resumed_ok += 1
    return result


def _same_suffix(connection: Connection, delivered: Sequence[Event], expected: Sequence[Event]) -> bool:
    if len(delivered) != len(expected):
        return False
    for item, want in zip(connection.events, expected, strict=True):
        if item.id is None and item.event.get("event") == "workflow_finished":
            # Built from the run row by a reader whose run's end was still pending: same outcome.
            if shape(item.event) != shape(want):
                return False
        elif canonical(item.event) != canonical(want):
            return False
    return True


def _is_gone(connection: Connection) -> bool:
    return connection.status == 410 or (connection.error is not None and connection.error.get("status") == 410)
