"""What delivery needs of the wire format, which the HTTP edge provides: the bytes of an item, and of a chunk.

The shared writer frames each event once for all its clients, so framing and the sealing of resume
tokens happen inside delivery's loop; *how* an event becomes bytes (SSE, its ``id:`` a sealed token)
is the HTTP edge's, which hands a :class:`Framer` in (``api.controllers.common.sse.SseFramer``).
The delivery-lag sample is taken here, once per write, whatever the wire format.
"""

from __future__ import annotations

from typing import Protocol

from api.core.app.apps.event_codec import stamp_of
from api.libs import metrics

from .reading import StreamEvent, StreamItem


class Framer(Protocol):
    """The bytes of what one response sends; bound to the response's run and user."""

    #: What sets apart the readers whose events frame alike (the sealer's binding: run, app, user):
    #: only such readers may share a writer.
    binding: bytes
    #: A keep-alive message.
    ping: bytes
    #: When the response's request began: events appended before it are replayed, not live.
    since: float

    def event(self, event: StreamEvent) -> bytes:
        """One event of the run, its position sealed into its id (none for an event without one)."""
        ...

    def item(self, item: StreamItem) -> bytes:
        """Any item a reader yields, as one write (a batch in one chunk); takes the lag sample."""
        ...

    def message(self, payload: bytes) -> bytes:
        """A message without an id (an event built from the run's row)."""
        ...

    def retry(self, milliseconds: int) -> bytes:
        """The last message of a drained stream: come back in ``milliseconds``."""
        ...

    def wire(self, data: bytes, chunked: bool) -> bytes:
        """``data`` as a writer writes it to the client's socket itself: one HTTP/1.1 chunk (``chunked``),
        or bare for HTTP/1.0, as the server would have written it."""
        ...


def observe_write(event: StreamEvent, since: float = 0.0, events: int = 1) -> None:
    """One sample for a write of ``events`` events led by ``event`` (call only when metrics are on): of
    the delivery lag when it was appended after ``since`` (the client's request began: it is live), of
    the replay otherwise (how many, and how old), so that resumes and late joins never read as lag."""
    assert event.stored is not None
    stamp = stamp_of(event.stored)
    if stamp is None:
        return
    transport = "broadcast_channel" if event.cursor is None else "durable_stream"
    if stamp >= since:
        metrics.observe_lag(transport, stamp)
    else:
        metrics.observe_replay(transport, stamp, events)
