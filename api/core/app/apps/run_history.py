"""Whether a run's topic is provably the run's whole history, for a reader that starts from its beginning.

A late reader (``include_state_snapshot=true``) is served a run only when what the store holds is
provably the run: the incarnation its first event went to (``stream_epoch``), from its first record
(retention has not cut its start), and, for a run whose end was written, sealed exactly at the
position recorded then (``stream_final_ordinal`` / ``stream_final_digest``: the digest names every
record before it). A store that failed over to a replica missing the run's last events, its end or its
seal does not pass, and the reader gets 410 ``run_events_lost`` with the run row instead of a partial
run that looks whole or never ends. No I/O here: the caller brings the row and the topic's info.
"""

from __future__ import annotations

from api.core.durable_stream import TopicInfo
from api.models import WorkflowRun

__all__ = ["history_gap", "holds_recorded_end"]


def history_gap(run: WorkflowRun, info: TopicInfo | None) -> str | None:
    """Why ``info`` (the run's topic as the store has it now) is not provably the run's whole history,
    or ``None`` when it is (as far as the row can tell: a run not ended yet is checked up to its start).
    """
    if run.stream_epoch is not None and (info is None or info.epoch != run.stream_epoch):
        return "the topic is not the incarnation the run started on"
    if info is None:
        return None  # nothing was ever written (the caller answers from the row)
    if info.length and info.first_ordinal > 1:
        return f"retention removed the run's first {info.first_ordinal - 1} events"
    if run.run_status.is_terminal and run.stream_ended and not holds_recorded_end(run, info):
        return (
            f"the topic ends at {info.last_ordinal}{' (sealed)' if info.sealed else ''}, not at the run's end "
            f"recorded at {run.stream_final_ordinal}"
        )
    return None


def holds_recorded_end(run: WorkflowRun, info: TopicInfo) -> bool:
    """Whether the topic is sealed at the end recorded in the row (rows from before it was recorded pass)."""
    if run.stream_final_ordinal is None:
        return True
    if not info.sealed or info.last_ordinal != run.stream_final_ordinal:
        return False
    return not run.stream_final_digest or not info.last_digest or info.last_digest == run.stream_final_digest
