"""A Redis failover never forks a reader silently.

A private primary and an asynchronous replica (``harness.failover.RedisFailover``): the replication
link is frozen by a relay, the primary acknowledges ``lost`` more appends the replica never receives,
the primary is SIGKILLed, the replica promoted (``REPLICAOF NO ONE``) and the clients' address moved to
it, and the topic goes on there with ``after`` other records (sealed or not). Every position handed out
before the failover is then resumed: it continues exactly, or fails with ``CursorUnavailableError``
``history_diverged``; never a silent end (``CLOSED``), a skip, or a record of the other history.
``after`` is below, equal to and above ``lost``, so the new history ends before, exactly at and
after the positions of the lost records (see ``failover_cases.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.failover import RedisFailover
from harness.redis_server import redis_available

from .failover_cases import check_every_position

pytestmark = [
    pytest.mark.skipif(not redis_available(), reason="redis-server and redis-cli are needed"),
    pytest.mark.timeout(120),
]


@pytest.fixture
def pair() -> Iterator[RedisFailover]:
    with RedisFailover() as started:
        yield started


@pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
@pytest.mark.parametrize(("lost", "after"), [(1, 0), (1, 1), (1, 3), (3, 2), (3, 3), (3, 5)])
def test_every_position_resumes_exactly_or_is_refused_after_a_failover(
    pair: RedisFailover, lost: int, after: int, sealed: bool
) -> None:
    check_every_position(pair, lost, after, sealed)
