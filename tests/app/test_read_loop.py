"""The read loop's rules, driven event by event with no I/O and no clock: what both readers of a run
(a client alone, the shared writer) decide for pings, idleness, the first event and terminal events."""

from __future__ import annotations

import pytest

from api.core.app.apps.message_generator import terminal_events
from api.core.app.apps.read_loop import Idle, IncompleteRunError, Next, ReadLoop


def loop(*, continue_on_pause: bool = False, first_event: str | None = None) -> ReadLoop:
    return ReadLoop(
        terminal=terminal_events(continue_on_pause),
        now=100.0,
        ping_interval=10,
        idle_timeout=60,
        first_event=first_event,
    )


def test_pings_fall_due_after_the_last_thing_sent_and_idleness_after_the_last_event() -> None:
    rules = loop()
    assert rules.wait(100.0) == 10
    assert rules.nothing(105.0) is Idle.WAIT
    assert rules.nothing(110.0) is Idle.PING
    assert rules.wait(110.0) == 10  # the ping counts as sent
    assert rules.event("text_chunk", 115.0) is Next.GO_ON
    assert rules.wait(120.0) == 5  # an event counts as sent too
    for now in (125.0, 135.0, 145.0, 155.0, 165.0):
        assert rules.nothing(now) is Idle.PING
    assert rules.wait(170.0) == 5  # the idle end (115 + 60) comes before the next ping
    assert rules.nothing(175.0) is Idle.END


def test_a_writer_s_clients_are_idle_from_their_join_when_it_came_after_the_last_event() -> None:
    # The shared writer keeps one loop (its last event, its last write) for every client it serves.
    writer = ReadLoop(terminal=frozenset(), now=100.0, ping_interval=10, idle_timeout=60)
    assert writer.event(None, 100.0) is Next.GO_ON  # the writer ends no stream by an event itself
    assert writer.wait(130.0, joined=140.0) == 0  # a ping is overdue at 110: wake now
    assert writer.ping_due(130.0)
    assert not writer.ping_due(135.0)  # the ping counted as sent at 130
    assert writer.idle_over(160.0, joined=90.0)  # joined before the last event: idle since 100
    assert not writer.idle_over(160.0, joined=140.0)  # joined at 140: idle until 200
    assert writer.wait(195.0, joined=140.0) == 0  # a ping due at 140 comes first
    assert writer.ping_due(195.0)
    assert writer.wait(195.0, joined=140.0) == 5  # then its idle end at 200
    assert writer.idle_over(200.0, joined=140.0)


def test_a_reader_from_the_beginning_must_find_the_start_first() -> None:
    rules = loop(first_event="workflow_started")
    with pytest.raises(IncompleteRunError, match="'text_chunk'"):
        rules.event("text_chunk", 101.0)
    started = loop(first_event="workflow_started")
    assert started.event("workflow_started", 101.0) is Next.GO_ON
    # A resumed run starts again: only the first event is checked.
    assert started.event("workflow_started", 102.0) is Next.GO_ON


def test_the_run_s_end_always_ends_the_stream() -> None:
    for continue_on_pause in (False, True):
        assert loop(continue_on_pause=continue_on_pause).event("workflow_finished", 101.0) is Next.END


def test_a_pause_followed_by_more_is_stale() -> None:
    rules = loop()
    assert rules.event("workflow_paused", 101.0) is Next.LOOK_AHEAD
    assert rules.looked_ahead(ready=True, closed=False) is Next.GO_ON


def test_a_pause_at_a_sealed_end_ends_the_stream() -> None:
    rules = loop()
    assert rules.event("workflow_paused", 101.0) is Next.LOOK_AHEAD
    assert rules.looked_ahead(ready=False, closed=True) is Next.END


def test_a_pause_with_nothing_after_it_asks_the_run_s_row() -> None:
    rules = loop()
    assert rules.event("workflow_paused", 101.0) is Next.LOOK_AHEAD
    assert rules.looked_ahead(ready=False, closed=False) is Next.ASK_ROW
    assert rules.row_says(moved_past=False) is Next.END  # the run waits at this pause
    assert rules.row_says(moved_past=True) is Next.GO_ON  # answered a moment ago: its events come next


def test_a_reader_that_continues_on_pause_never_looks_ahead() -> None:
    rules = loop(continue_on_pause=True)
    assert not rules.stops_at_pauses
    assert rules.event("workflow_paused", 101.0) is Next.GO_ON
    assert loop().stops_at_pauses
