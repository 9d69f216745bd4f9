"""The admission gate's rules, without a server: how many streams may be starting, a loop behind, and
the Retry-After a refusal carries (tests/app/test_herd.py refuses through a real gunicorn worker)."""

from __future__ import annotations

import pytest

from api.libs import metrics
from api.libs.errors import ServerBusyError
from api.services.delivery.admission import Admission


def test_streams_starting_beyond_the_limit_are_refused_until_one_has_started() -> None:
    gate = Admission(max_starting=2, max_lag=0, retry_after_max=5)
    refused = metrics.ADMISSION_REFUSED.tally.values.get(("starting",), [0.0])[0]
    with gate.start(), gate.start():
        with pytest.raises(ServerBusyError) as caught, gate.start():
            pass
        assert caught.value.code == "server_busy" and caught.value.status == 503
        assert 1 <= caught.value.retry_after <= 5
    assert gate.starting == 0
    with gate.start():  # one has started (or failed): room again
        assert gate.starting == 1
    assert metrics.ADMISSION_REFUSED.tally.values.get(("starting",), [0.0])[0] == refused + 1


def test_a_stream_that_fails_to_start_leaves_its_place() -> None:
    gate = Admission(max_starting=1, max_lag=0, retry_after_max=1)
    with pytest.raises(RuntimeError), gate.start():
        raise RuntimeError("the store went away")
    with gate.start():
        pass


def test_a_loop_behind_refuses_streams_with_retry_afters_spread() -> None:
    gate = Admission(max_starting=0, max_lag=0.5, retry_after_max=4)
    gate.lag = 0.7
    waits = set()
    for _ in range(200):
        with pytest.raises(ServerBusyError) as caught, gate.start():
            pass
        waits.add(caught.value.retry_after)
    assert waits == {1, 2, 3, 4}
    gate.lag = 0.1
    with gate.start():
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_arrivals_past_the_rate_are_refused_each_with_its_own_turn() -> None:
    clock = Clock()
    gate = Admission(max_starting=0, max_lag=0, retry_after_max=5, max_rate=4, clock=clock)
    refused = metrics.ADMISSION_REFUSED.tally.values.get(("rate",), [0.0])[0]
    for _ in range(4):  # a second's worth at once
        with gate.start():
            pass
    turns = []
    for _ in range(8):
        with pytest.raises(ServerBusyError) as caught, gate.start():
            pass
        turns.append(caught.value.retry_after)
    # Slots a quarter of a second apart after the first second: the refused come back at the rate.
    assert turns == [2, 2, 2, 2, 3, 3, 3, 3]
    assert metrics.ADMISSION_REFUSED.tally.values.get(("rate",), [0.0])[0] == refused + 8
    clock.now += 0.5  # half a second refills two arrivals
    for _ in range(2):
        with gate.start():
            pass
    with pytest.raises(ServerBusyError), gate.start():
        pass
    clock.now += 60  # the bucket holds one second's worth, however long it stayed unused
    for _ in range(4):
        with gate.start():
            pass
    with pytest.raises(ServerBusyError) as caught, gate.start():
        pass
    assert caught.value.retry_after == 2  # the queue of the refused emptied meanwhile


def test_a_long_queue_of_refused_clients_is_told_at_most_the_longest_wait() -> None:
    clock = Clock()
    gate = Admission(max_starting=0, max_lag=0, retry_after_max=5, max_rate=1, clock=clock)
    with gate.start():
        pass
    turns = []
    for _ in range(100):
        with pytest.raises(ServerBusyError) as caught, gate.start():
            pass
        turns.append(caught.value.retry_after)
    assert turns[:3] == [2, 3, 4] and max(turns) == 30 and turns == sorted(turns)


def test_open_streams_past_the_limit_are_refused_until_one_closes() -> None:
    gate = Admission(max_starting=0, max_lag=0, retry_after_max=5, max_streams=2)
    refused = metrics.ADMISSION_REFUSED.tally.values.get(("streams",), [0.0])[0]
    bodies = []
    for _ in range(2):
        with gate.start():
            bodies.append(gate.holding(iter([b"ping"])))
    waits = set()
    for _ in range(100):
        with pytest.raises(ServerBusyError) as caught, gate.start():
            pass
        waits.add(caught.value.retry_after)
    # Room frees only as streams end: the refused come back later than a busy loop's refusals do.
    assert min(waits) >= 5 and max(waits) <= 30 and len(waits) > 5
    assert metrics.ADMISSION_REFUSED.tally.values.get(("streams",), [0.0])[0] == refused + 100
    closed = bodies.pop()
    closed.close()  # never iterated: its client left before the first byte
    closed.close()  # a second close counts once
    assert gate.open == 1
    with gate.start():
        bodies.append(gate.holding(iter([b"ping"])))
    assert list(bodies[-1]) == [b"ping"] and gate.open == 2
