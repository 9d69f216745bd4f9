"""The rules every reader of a run reads by (``api.services.delivery.reading``), driven event by event
with no store and no clock: pings, idleness, the first event, where a client's stream ends, and the
stale-pause rule that both readers (a client alone, a run's shared writer) take from one loop."""

from __future__ import annotations

import pytest

from api.core.app.apps.event_codec import encode_event
from api.core.app.apps.event_transport import StreamMessage
from api.core.durable_stream import CLOSED, Closed, TopicCursor
from api.services.delivery.reading import (
    QUIET,
    Batch,
    EventBatch,
    Idle,
    IncompleteRunError,
    Ping,
    ReadLoop,
    StreamEvent,
    batches,
    ends_at,
    read_alone,
)


def loop(*, first_event: str | None = None) -> ReadLoop:
    return ReadLoop(now=100.0, ping_interval=10, idle_timeout=60, first_event=first_event)


def test_pings_fall_due_after_the_last_thing_sent_and_idleness_after_the_last_event() -> None:
    rules = loop()
    assert rules.wait(100.0) == 10
    assert rules.nothing(105.0) is Idle.WAIT
    assert rules.nothing(110.0) is Idle.PING
    assert rules.wait(110.0) == 10  # the ping counts as sent
    rules.events(["text_chunk"], 115.0)
    assert rules.wait(120.0) == 5  # an event counts as sent too
    for now in (125.0, 135.0, 145.0, 155.0, 165.0):
        assert rules.nothing(now) is Idle.PING
    assert rules.wait(170.0) == 5  # the idle end (115 + 60) comes before the next ping
    assert rules.nothing(175.0) is Idle.END


def test_a_writer_s_clients_are_idle_from_their_join_when_it_came_after_the_last_event() -> None:
    # The shared writer keeps one loop (its last event, its last write) for every client it serves.
    writer = loop()
    writer.events([None], 100.0)
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
        rules.events(["text_chunk", "workflow_started"], 101.0)
    started = loop(first_event="workflow_started")
    started.events(["workflow_started"], 101.0)
    # A resumed run starts again: only the first event is checked.
    started.events(["workflow_started"], 102.0)


def test_the_run_s_end_always_ends_the_stream_and_a_pause_only_a_client_that_stops_there() -> None:
    for stops in (False, True):
        assert ends_at(["text_chunk", "workflow_finished"], pause_ends=True, stops_at_pauses=stops) == 1
    assert ends_at(["text_chunk", "workflow_paused"], pause_ends=True, stops_at_pauses=True) == 1
    assert ends_at(["text_chunk", "workflow_paused"], pause_ends=True, stops_at_pauses=False) is None
    assert ends_at(["text_chunk", "workflow_paused"], pause_ends=False, stops_at_pauses=True) is None  # stale
    # A pause followed by more in the same batch is stale whatever the batch says of its last pause.
    assert ends_at(["workflow_paused", "text_chunk"], pause_ends=True, stops_at_pauses=True) is None


class Topic:
    """Records ready in a queue, then (optionally) the topic's end; ``receive`` never waits."""

    resumable = True

    def __init__(self, names: list[str], *, sealed: bool = False) -> None:
        self.ready: list[StreamMessage | Closed] = [
            StreamMessage(encode_event({"event": name}), TopicCursor(f"c{index}")) for index, name in enumerate(names)
        ]
        if sealed:
            self.ready.append(CLOSED)
        self.reads = 0

    def __enter__(self) -> Topic:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def receive(self, timeout: float) -> StreamMessage | Closed | None:
        self.reads += 1
        return self.ready.pop(0) if self.ready else None

    def close(self) -> None:
        pass


def first_batch(topic: Topic, *, coalesce: int = 64, left_pause: bool | None = False) -> tuple[Batch, int]:
    """The first batch, and how many times the run's row was asked about its last pause."""
    asked: list[bytes] = []

    def row_says(payload: bytes) -> bool:
        asked.append(payload)
        assert left_pause is not None
        return left_pause

    read = batches(topic, wait=lambda: 0.0, coalesce=coalesce, left_pause=None if left_pause is None else row_says)
    return next(read), len(asked)


def test_a_pause_followed_by_more_is_stale() -> None:
    # Ready in the same batch: the pause is not last, so it ends nobody (ends_at above).
    batch, asked = first_batch(Topic(["workflow_paused", "node_started"]))
    assert batch.names == ["workflow_paused", "node_started"] and asked == 0
    # Ready right after a full batch: the loop looks one record ahead, and holds it for the next batch.
    topic = Topic(["text_chunk", "workflow_paused", "node_started"])
    batches_read = batches(topic, wait=lambda: 0.0, coalesce=2, left_pause=lambda payload: False)
    first = next(batches_read)
    assert first.names == ["text_chunk", "workflow_paused"] and not first.pause_ends and not first.level
    assert next(batches_read).names == ["node_started"]


def test_a_pause_at_a_sealed_end_ends_the_stream() -> None:
    batch, asked = first_batch(Topic(["text_chunk", "workflow_paused"], sealed=True), left_pause=True)
    assert batch.pause_ends and batch.closed and asked == 0


def test_a_pause_with_nothing_after_it_asks_the_run_s_row() -> None:
    waiting, asked = first_batch(Topic(["text_chunk", "workflow_paused"]), left_pause=False)
    assert waiting.pause_ends and asked == 1  # the run waits there
    answered, asked = first_batch(Topic(["text_chunk", "workflow_paused"]), left_pause=True)
    assert not answered.pause_ends and asked == 1  # answered a moment ago: its events come next
    # Nobody reading stops at pauses: the row is not asked, and the pause counts as ending (for nobody).
    unasked, asked = first_batch(Topic(["text_chunk", "workflow_paused"]), left_pause=None)
    assert unasked.pause_ends and asked == 0


def test_quiet_and_level() -> None:
    topic = Topic(["text_chunk"])
    read = batches(topic, wait=lambda: 0.0, coalesce=64, left_pause=None)
    batch = next(read)
    assert batch.level and batch.names == ["text_chunk"]
    assert next(read) is QUIET


def test_a_client_alone_stops_at_a_live_pause_and_reads_on_through_a_stale_one() -> None:
    names = ["workflow_started", "workflow_paused", "node_started", "workflow_paused"]
    stopping = list(read_alone(Topic(names), coalesce=1, left_pause=lambda payload: False))
    assert isinstance(stopping[0], Ping)
    assert [item.event for item in stopping[1:] if isinstance(item, StreamEvent)] == names
    assert len(stopping) == 1 + len(names), "it ended at the last pause, the run waiting there"
    answered = read_alone(Topic(names, sealed=True), coalesce=64, continue_on_pause=True)
    items = list(answered)
    assert isinstance(items[1], EventBatch) and [event.event for event in items[1].events] == names
