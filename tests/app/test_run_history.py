"""``history_gap``: when a run's topic is provably the run's whole history, case by case (no I/O)."""

from __future__ import annotations

import pytest

from api.core.app.apps.run_history import history_gap, holds_recorded_end
from api.core.durable_stream import TopicInfo
from api.models import WorkflowRun

EPOCH = "e1"
DIGEST = "0123456789abcdef"


def run_row(
    status: str = "succeeded", *, ended: bool = True, final: int | None = 9, digest: str | None = DIGEST
) -> WorkflowRun:
    return WorkflowRun(
        id="r",
        status=status,
        stream_epoch=EPOCH,
        stream_ended=ended,
        stream_final_ordinal=final,
        stream_final_digest=digest,
    )


def topic(*, first: int = 1, last: int = 9, sealed: bool = True, epoch: str = EPOCH, digest: str = DIGEST) -> TopicInfo:
    return TopicInfo("t", last - first + 1, first, last, sealed, epoch, digest)


def test_the_whole_run_sealed_at_its_recorded_end_is_whole() -> None:
    assert history_gap(run_row(), topic()) is None
    assert holds_recorded_end(run_row(), topic())


@pytest.mark.parametrize(
    ("info", "why"),
    [
        (topic(last=7, sealed=True, digest="1111111111111111"), "ends at 7 (sealed)"),  # lost its end, resealed short
        (topic(last=9, sealed=False), "ends at 9, not"),  # lost only the seal
        (topic(last=8, sealed=False, digest="1111111111111111"), "ends at 8, not"),  # lost the end and the seal
        (topic(last=9, digest="2222222222222222"), "ends at 9 (sealed)"),  # as long, other events (a fork)
        (topic(last=12, digest="3333333333333333"), "ends at 12 (sealed)"),  # longer: the end is not where it was
        (topic(epoch="e2"), "not the incarnation"),  # a new incarnation (the store lost everything)
        (None, "not the incarnation"),
        (topic(first=3), "retention removed the run's first 2 events"),
    ],
)
def test_a_stream_that_is_not_provably_the_run_says_why(info: TopicInfo | None, why: str) -> None:
    gap = history_gap(run_row(), info)
    assert gap is not None and why in gap, gap


def test_a_run_not_ended_yet_is_checked_up_to_its_start() -> None:
    running = run_row("running", ended=False, final=None, digest=None)
    assert history_gap(running, topic(last=4, sealed=False)) is None
    assert history_gap(running, topic(epoch="e2")) is not None
    # A finished run whose end is still pending (not written yet) is not held to an end.
    pending = run_row(ended=False, final=None, digest=None)
    assert history_gap(pending, topic(last=4, sealed=False)) is None


def test_rows_from_before_the_final_position_was_recorded_pass() -> None:
    old = run_row(final=None, digest=None)
    assert history_gap(old, topic(last=3)) is None
