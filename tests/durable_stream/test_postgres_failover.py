"""A PostgreSQL failover never forks a reader silently.

A private primary and an asynchronous streaming replica made with ``pg_basebackup``
(``harness.failover.PostgresFailover``), its WAL coming through a relay that is frozen before the last
``lost`` appends: the primary commits them alone, is SIGKILLed, and the replica is promoted
(``pg_ctl promote``) with what it had replayed, the clients' address moved to it. The topic goes on
there; every position handed out before resumes exactly or is refused with ``history_diverged``
(``failover_cases.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.failover import PostgresFailover
from harness.postgres_server import postgres_available

from .failover_cases import check_every_position, check_repair

pytestmark = [
    pytest.mark.skipif(not postgres_available(), reason="PostgreSQL server binaries are needed"),
    pytest.mark.timeout(240),
]


@pytest.fixture
def pair() -> Iterator[PostgresFailover]:
    with PostgresFailover() as started:
        yield started


@pytest.mark.parametrize(("lost", "after", "sealed"), [(2, 1, True), (2, 2, True), (2, 2, False), (2, 4, False)])
def test_every_position_resumes_exactly_or_is_refused_after_a_failover(
    pair: PostgresFailover, lost: int, after: int, sealed: bool
) -> None:
    check_every_position(pair, lost, after, sealed)


@pytest.mark.parametrize(("lost", "after"), [(1, 0), (3, 2)])
def test_a_producer_that_outlives_the_failover_repairs_it_for_every_reader(
    pair: PostgresFailover, lost: int, after: int
) -> None:
    check_repair(pair, lost, after)
