"""Finding where a topic's records after an ordinal are, for a cursor without a stream sequence.

A cursor built from an ordinal (``admin.cursor_after``) has no sequence, and the stream holds every
topic's subject, so a topic's messages are spread over its sequences: the ordinal cannot be turned
into a sequence by arithmetic. It can be bracketed, though. Within an incarnation every ordinal is
one record and one sequence, and markers only add sequences, so between two messages of the subject
with ordinals ``a < k < b`` the record ``k`` lies at least ``k - a`` sequences after the first and
``b - k`` before the second. A probe is one get of the subject's first message from a sequence on;
each one narrows the bracket.

The search need not end on the record itself: a read of a batch from any message a little before it
reaches past it, so it ends on any message of a window of ordinals up to ``k`` (the first retained
message, without a probe, when it is in the window). Probes aim where the window would be if the
topic's share of the sequences between the bracket's ends were even (one probe for a topic alone on
its stream, or evenly mixed with others), and a probe that did not halve the bracket is followed by
one that does: ``n`` sequences take at most about ``2 log2(n / window)`` probes.
"""

from __future__ import annotations

from .jetstream import JetStream
from .messages import StreamMessage

__all__ = ["locate"]


async def locate(
    js: JetStream, subject: str, ordinal: int, window: int, first: StreamMessage, last: StreamMessage
) -> StreamMessage | None:
    """A message of ``subject`` with an ordinal from ``ordinal - window + 1`` to ``ordinal``.

    ``first`` and ``last`` are the subject's first retained and last messages, and ``ordinal`` is
    below the last one's. A batch of more than ``window`` messages after the one found reaches the
    record after ``ordinal``. ``None`` when no retained message is in the window: it is behind
    retention, or the subject changed under the search (another incarnation, or retention removed
    the window meanwhile); a read from the first retained message shows either exactly.
    """
    if first.epoch != last.epoch or not first.ordinal <= ordinal < last.ordinal:
        return None
    lowest = max(ordinal - max(window, 1) + 1, 0)
    if first.ordinal >= lowest:
        return first
    # ``below`` carries an ordinal before the window and ``above`` one after it; ``low..high`` holds
    # every sequence a probe finds the window from.
    below, above = first, last
    low = below.seq + (lowest - below.ordinal)
    high = above.seq - (above.ordinal - ordinal)
    middle = (lowest + ordinal) // 2
    halve = False
    while low <= high:
        span = high - low
        if halve:
            probe = low + span // 2
        else:
            aimed = below.seq + (above.seq - below.seq) * (middle - below.ordinal) // (above.ordinal - below.ordinal)
            probe = min(max(aimed, low), high)
        found = await js.next_message(subject, probe)
        if found is None or found.epoch != first.epoch or found.seq > last.seq:
            return None
        if lowest <= found.ordinal <= ordinal:
            return found
        if found.ordinal < lowest:
            below = found
            low = max(low, found.seq + (lowest - found.ordinal))
        else:
            # Nothing of the subject lies from the probe up to ``found``: the window is before the probe.
            above = found
            high = min(high, probe - 1, found.seq - (found.ordinal - ordinal))
        halve = not halve and (high - low) * 2 > span
    return None
