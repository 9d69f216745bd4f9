"""Recent copies of the rows of runs whose writer is open in this process: an arrival without a query.

A herd of clients reconnecting to a live run (after a deploy, every client of every run at once)
asks for the same row thousands of times a second, and the query with its ORM load was the largest
part of an arrival's cost. While a run's writer is open here, this process's run watcher applies the
reaper's checks (``run_recovery.check_run``) to that run every interval and ends the writer's clients
when the run needs it, so an arrival may use a copy of the row read at most :data:`CARD_SECONDS`
ago instead of reading and checking it once more. A copy is handed out only while the writer it was
remembered with is alive (loaded, or still reading its run for the clients waiting on it), only to
the app and user that own the run, and is never extended by its own use: one arrival per run reads
the row again every :data:`CARD_SECONDS`, and while it does, the others keep using the card (up to
:data:`CARD_LIMIT` old). A card is remembered before its arrival waits for a new writer to read its
run. Without both, every arrival that came meanwhile read the row too: in a herd that outran the
worker (1,000 clients a second) those reads kept its loop too busy for the new writers to load, for
14 s. Anything else (no card, another user, a card past its limit) reads the row as before, so
every refusal still comes from that one place.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from api.models import RowCopy, WorkflowRun

__all__ = ["CARD_LIMIT", "CARD_SECONDS", "RunCards"]

#: How old a run's row may be when an arrival uses it instead of reading it. Short beside the run
#: watcher's interval (a third of the lease), which checks the run meanwhile either way.
CARD_SECONDS = 2.0
#: How old it may be while one arrival is reading it again (one that never remembers it, because its
#: request failed, holds the others for at most this long).
CARD_LIMIT = 5 * CARD_SECONDS

WriterKey = tuple[str, bytes]


@dataclasses.dataclass(slots=True)
class _Card:
    writer: WriterKey
    app_id: str
    end_user: str
    #: The copy every arrival reads (made once: building an ORM instance per arrival cost 6% of a
    #: herd's CPU); it belongs to no session, and the read side only reads it.
    row: WorkflowRun
    read_at: float
    #: When an arrival was last sent to read the row again.
    refresh_asked_at: float = 0.0


class RunCards:
    """This process's cards, by run id and by task id (a client names either). Greenlet-safe: no
    method yields, so under gevent each runs whole; not meant for several OS threads."""

    def __init__(self, usable: Callable[[WriterKey], bool]) -> None:
        #: Whether the writer a card was remembered with still delivers its run.
        self._usable = usable
        self._cards: dict[str, _Card] = {}
        self._ids_of: dict[WriterKey, tuple[str, str]] = {}

    def __len__(self) -> int:
        return len(self._ids_of)

    def remember(self, writer: WriterKey, run: WorkflowRun) -> None:
        """Keep a copy of ``run``, a row just read and checked, for the arrivals at ``writer``."""
        card = _Card(writer, run.app_id, run.end_user, RowCopy(run).make(), _now())
        self._cards[run.id] = self._cards[run.task_id] = card
        self._ids_of[writer] = (run.id, run.task_id)

    def recall(self, run_or_task_id: str, *, app_id: str, end_user: str) -> WorkflowRun | None:
        """A copy of the run's row (in no session, shared by the arrivals: read it only) if a fresh card of
        this app and user exists and its writer is usable; ``None`` tells the caller to read the row
        (once a card is older than :data:`CARD_SECONDS`, one caller per :data:`CARD_SECONDS`)."""
        card = self._cards.get(run_or_task_id)
        if card is None or card.app_id != app_id or card.end_user != end_user:
            return None
        now = _now()
        age = now - card.read_at
        if age > CARD_LIMIT or not self._usable(card.writer):
            return None
        if age > CARD_SECONDS and now - card.refresh_asked_at >= CARD_SECONDS:
            card.refresh_asked_at = now  # this caller reads the row again; the others use the card meanwhile
            return None
        return card.row

    def forget(self, writer: WriterKey) -> None:
        """The writer closed: its run's cards go with it."""
        for run_id in self._ids_of.pop(writer, ()):
            card = self._cards.get(run_id)
            if card is not None and card.writer == writer:
                del self._cards[run_id]


def _now() -> float:
    return time.monotonic()
