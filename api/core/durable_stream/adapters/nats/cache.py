"""Messages that batched reads brought in, shared by every later read of the same stretch.

A batch of direct gets returns a subject's messages in order, so each message's successor in its
subject is known. Kept per subject (most recently read subjects first, bounded in total), the
chain lets the next subscription that reads the same stretch (another subscription of the topic, a
resumed one) take it from memory. A chain is used only after the read confirmed the subject's first
retained sequence is not beyond it: every removal in this adapter's model is a prefix (trims, deletes,
limits; single messages cannot be deleted), so everything from there up to the last message still
exists. Epochs are checked by the caller, which covers a stream deleted and re-created (sequences
restart).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from .messages import StreamMessage

__all__ = ["ReadCache"]


class _Chain:
    __slots__ = ("messages", "successor")

    def __init__(self) -> None:
        self.messages: dict[int, StreamMessage] = {}
        self.successor: dict[int, int] = {}


class ReadCache:
    """Per-subject chains of messages read in order; at most ``capacity`` messages in total."""

    def __init__(self, capacity: int = 8192) -> None:
        self._capacity = capacity
        self._size = 0
        self._chains: collections.OrderedDict[str, _Chain] = collections.OrderedDict()

    def clear(self) -> None:
        self._chains.clear()
        self._size = 0

    def drop(self, subject: str) -> None:
        chain = self._chains.pop(subject, None)
        if chain is not None:
            self._size -= len(chain.messages)

    def store(self, subject: str, previous: int | None, messages: Sequence[StreamMessage]) -> None:
        """Remember ``messages``, consecutive in ``subject`` (after the message ``previous``, if known)."""
        if not messages:
            return
        chain = self._chains.get(subject)
        if chain is None:
            chain = self._chains[subject] = _Chain()
        self._chains.move_to_end(subject)
        if previous is not None:
            chain.successor[previous] = messages[0].seq
        for index, message in enumerate(messages):
            if message.seq not in chain.messages:
                self._size += 1
            chain.messages[message.seq] = message
            if index + 1 < len(messages):
                chain.successor[message.seq] = messages[index + 1].seq
        while self._size > self._capacity and self._chains:
            _, evicted = self._chains.popitem(last=False)
            self._size -= len(evicted.messages)

    def follows(self, subject: str, previous: int) -> bool:
        """Whether the successor of the message ``previous`` of ``subject`` is cached."""
        chain = self._chains.get(subject)
        return chain is not None and chain.successor.get(previous) in chain.messages

    def follow(self, subject: str, start: int | None, after: int | None, last: int, limit: int) -> list[StreamMessage]:
        """Cached messages from ``start`` (or from the successor of ``after``) up to ``last``, at most ``limit``."""
        chain = self._chains.get(subject)
        if chain is None:
            return []
        seq = start if start is not None else chain.successor.get(after if after is not None else -1)
        found: list[StreamMessage] = []
        while seq is not None and seq <= last and len(found) < limit:
            message = chain.messages.get(seq)
            if message is None:
                break
            found.append(message)
            seq = chain.successor.get(seq)
        return found
