"""The rules of one event-stream reader, as a small state machine with no I/O: items in, decisions out.

Both readers of a run's events drive it — a client reading alone (``message_generator.
stream_topic_events``) and the shared writer of a run (``api.services.delivery.writer``) — so the
rules below are written once and unit-tested event by event (``tests/app/test_read_loop.py``):

- **Pings and idleness.** A ping is due ``ping_interval`` after the last thing sent; the stream ends
  ``idle_timeout`` after the last event. :meth:`ReadLoop.wait` says how long a reader may block. A
  shared writer keeps one loop for all its clients and passes each client's join time as
  ``joined``: a client that joined after the last event is idle from its join, as it would be from
  the start of its own stream.
- **The first event.** A reader from the beginning of a run must find ``workflow_started`` first
  (else :class:`IncompleteRunError`: what is left of a run is not the run).
- **Terminal events.** ``workflow_finished`` ends the stream; so does ``workflow_paused`` for a
  reader that stops at pauses — unless the pause is stale: the topic already shows more after it
  (:data:`Next.LOOK_AHEAD`), or nothing yet but the run's row says it has left that pause
  (:data:`Next.ASK_ROW`: a form answered a moment ago resumes the run before its worker writes).
"""

from __future__ import annotations

import enum

FINISHED, PAUSED = "workflow_finished", "workflow_paused"


class IncompleteRunError(Exception):
    """The retained events do not begin where the run began: its start is no longer retained."""


class Next(enum.Enum):
    """What the reader does with the event it just read."""

    #: Deliver it and read on.
    GO_ON = "go_on"
    #: Deliver it; it ends the stream.
    END = "end"
    #: A pause: say whether anything is ready after it (:meth:`ReadLoop.looked_ahead`).
    LOOK_AHEAD = "look_ahead"
    #: A pause with nothing after it yet: say whether the run's row has left it (:meth:`ReadLoop.row_says`).
    ASK_ROW = "ask_row"


class Idle(enum.Enum):
    """What a reader does when nothing arrived before its wait ended."""

    WAIT = "wait"
    PING = "ping"
    END = "end"


class ReadLoop:
    """One reader's state: when it last sent something, whether it has met its first event, and the
    terminal rules. ``now`` is the caller's monotonic clock, passed in so that tests need no clock."""

    __slots__ = ("_first_event", "_idle_timeout", "_last_event", "_last_sent", "_ping_interval", "_terminal")

    def __init__(
        self,
        *,
        terminal: frozenset[str],
        now: float,
        ping_interval: float = 10.0,
        idle_timeout: float = 300.0,
        first_event: str | None = None,
    ) -> None:
        self._terminal = terminal
        self._ping_interval = ping_interval
        self._idle_timeout = idle_timeout
        self._first_event = first_event
        self._last_event = self._last_sent = now

    @property
    def stops_at_pauses(self) -> bool:
        return PAUSED in self._terminal

    def wait(self, now: float, *, joined: float = 0.0) -> float:
        """Seconds the reader may block for its next item before a ping or its idle end is due."""
        idle_end = max(self._last_event, joined) + self._idle_timeout
        return max(min(self._last_sent + self._ping_interval, idle_end) - now, 0.0)

    def nothing(self, now: float) -> Idle:
        """Nothing arrived: end the idle stream, ping (counted as sent), or wait on."""
        if self.idle_over(now):
            return Idle.END
        return Idle.PING if self.ping_due(now) else Idle.WAIT

    def idle_over(self, now: float, *, joined: float = 0.0) -> bool:
        """Whether a stream (one that joined at ``joined``) has gone ``idle_timeout`` without an event."""
        return now - max(self._last_event, joined) >= self._idle_timeout

    def ping_due(self, now: float) -> bool:
        """Whether a ping is due; if so it counts as sent now."""
        if now - self._last_sent < self._ping_interval:
            return False
        self._last_sent = now
        return True

    def event(self, name: str | None, now: float) -> Next:
        """An event was read (it will be sent).

        Raises:
            IncompleteRunError: It is not the event the reader had to find first.
        """
        if self._first_event is not None:
            if name != self._first_event:
                raise IncompleteRunError(f"the retained events begin with {name!r}, not {self._first_event!r}")
            self._first_event = None
        self._last_event = self._last_sent = now
        if name not in self._terminal:
            return Next.GO_ON
        return Next.LOOK_AHEAD if name == PAUSED else Next.END

    @staticmethod
    def looked_ahead(*, ready: bool, closed: bool) -> Next:
        """After a pause: more is ready (the pause is stale), the topic ended, or nothing yet."""
        if ready:
            return Next.GO_ON
        return Next.END if closed else Next.ASK_ROW

    @staticmethod
    def row_says(*, moved_past: bool) -> Next:
        """After a pause with nothing after it: the run's row has left it (stale), or still waits there."""
        return Next.GO_ON if moved_past else Next.END
