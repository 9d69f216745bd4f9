"""The search for a built cursor's ordinal (``adapters.nats.locate``) against a fake stream.

The NATS tests count the search's gets on a real server for two layouts; here any layout of a topic's
messages among other subjects' sequences is tried, with a subject that changes under the search.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.core.durable_stream.adapters.nats.locate import locate
from api.core.durable_stream.adapters.nats.messages import KIND_RECORD, StreamMessage

SUBJECT = "ds.topic"


class _Stream:
    """The ``next_message`` get of a stream holding one subject's ``messages`` (others' sequences are gaps)."""

    def __init__(self, messages: list[StreamMessage], *, replace_after: int | None = None) -> None:
        self.messages = messages
        self.seqs = [message.seq for message in messages]
        self.probes: list[int] = []
        self._replace_after = replace_after

    async def next_message(self, subject: str, seq: int) -> StreamMessage | None:
        assert subject == SUBJECT
        self.probes.append(seq)
        if self._replace_after is not None and len(self.probes) > self._replace_after:
            # Deleted and re-created meanwhile: the same sequences now hold another incarnation.
            self.messages = [_message(m.seq, m.ordinal, "new") for m in self.messages]
        index = bisect.bisect_left(self.seqs, seq)
        return self.messages[index] if index < len(self.messages) else None


def _message(seq: int, ordinal: int, epoch: str = "e") -> StreamMessage:
    return StreamMessage(seq=seq, ordinal=ordinal, epoch=epoch, kind=KIND_RECORD, payload=b"")


def _layout(gaps: list[int], first_ordinal: int) -> list[StreamMessage]:
    """Records ``first_ordinal``… with ``gaps[i]`` other subjects' sequences before each."""
    messages, seq = [], 0
    for offset, gap in enumerate(gaps):
        seq += gap + 1
        messages.append(_message(seq, first_ordinal + offset))
    return messages


def _locate(
    stream: _Stream, ordinal: int, window: int, ends: tuple[StreamMessage, StreamMessage] | None = None
) -> StreamMessage | None:
    """``locate`` with the subject's first and last messages as ``stream`` holds them (or ``ends``)."""
    js: Any = stream
    first, last = ends or (stream.messages[0], stream.messages[-1])
    return asyncio.run(locate(js, SUBJECT, ordinal, window, first, last))


gaps = st.lists(st.one_of(st.just(0), st.integers(0, 3), st.integers(0, 1000)), min_size=2, max_size=600)


@settings(max_examples=300, deadline=None)
@given(gaps=gaps, first_ordinal=st.integers(1, 50), window=st.integers(1, 64), data=st.data())
def test_the_search_ends_in_the_window_within_its_bound_of_gets(
    gaps: list[int], first_ordinal: int, window: int, data: st.DataObject
) -> None:
    stream = _Stream(_layout(gaps, first_ordinal))
    last = stream.messages[-1]
    ordinal = data.draw(st.integers(first_ordinal, last.ordinal - 1))
    found = _locate(stream, ordinal, window)
    assert found is not None and max(ordinal - window + 1, 0) <= found.ordinal <= ordinal
    assert found in stream.messages
    # Every two gets at least halve the bracket, which never gets narrower than the window's sequences.
    assert len(stream.probes) <= 2 * math.ceil(math.log2(max(last.seq / window, 1))) + 2, stream.probes
    if first_ordinal > ordinal - window:
        assert found == stream.messages[0] and stream.probes == []  # the first retained message will do


@pytest.mark.parametrize("gap", [0, 2])
def test_a_topic_alone_or_evenly_mixed_takes_one_get(gap: int) -> None:
    stream = _Stream(_layout([gap] * 1000, 1))
    for ordinal in (100, 500, 999):
        stream.probes.clear()
        found = _locate(stream, ordinal, 64)
        assert found is not None and ordinal - 63 <= found.ordinal <= ordinal
        assert len(stream.probes) == 1


def test_a_position_behind_retention_or_at_the_tail_is_not_searched() -> None:
    stream = _Stream(_layout([5] * 100, 40))  # ordinals 40..139 retained
    for ordinal in (0, 39, 139, 140, 10**9):
        assert _locate(stream, ordinal, 8) is None
    assert stream.probes == []


def test_first_and_last_of_different_incarnations_are_not_searched() -> None:
    stream = _Stream(_layout([5] * 100, 1))
    last = _message(stream.messages[-1].seq, 100, "new")
    assert _locate(stream, 50, 4, (stream.messages[0], last)) is None
    assert stream.probes == []


@settings(max_examples=100, deadline=None)
@given(gaps=gaps, replace_after=st.integers(0, 4), data=st.data())
def test_a_subject_that_changes_under_the_search_is_not_found(
    gaps: list[int], replace_after: int, data: st.DataObject
) -> None:
    """Another incarnation's message is never taken for the position; the caller reads from the start."""
    stream = _Stream(_layout(gaps, 1), replace_after=replace_after)
    first, last = stream.messages[0], stream.messages[-1]
    ordinal = data.draw(st.integers(1, last.ordinal - 1))
    found = _locate(stream, ordinal, 4, (first, last))
    assert found is None or (found.epoch == "e" and ordinal - 3 <= found.ordinal <= ordinal)
    assert found is not None or len(stream.probes) > replace_after


def test_a_subject_emptied_or_grown_under_the_search_is_not_found() -> None:
    messages = _layout([3] * 300, 1)
    first, last = messages[0], messages[-1]
    emptied = _Stream([])
    assert _locate(emptied, 150, 4, (first, last)) is None
    assert len(emptied.probes) == 1
    # Retention removed the old messages and new ones came after ``last``: the probe lands past it.
    grown = _Stream([_message(last.seq + 10, 301)])
    assert _locate(grown, 150, 4, (first, last)) is None
    assert len(grown.probes) == 1
