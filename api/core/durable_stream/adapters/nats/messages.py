"""The messages of a topic's subject as the adapter writes and reads them.

Every message carries headers: ``Ds-O`` (the topic ordinal: a record's own, a marker's the last
ordinal before it), ``Ds-E`` (the topic's epoch), ``Ds-H`` (the digest of the history up to that
ordinal: a record's own digest, a marker's the last record's; see ``_digest``; absent on messages
written before digests existed) and for markers ``Ds-K`` (``c`` created, ``m`` trimmed to empty,
``s`` sealed). The stream's republished copies (see :mod:`.prefetch`) add the
sequence of the subject's previous message.
"""

from __future__ import annotations

import dataclasses

from nats.aio.msg import Msg

from ..._contract import DurableStreamUnavailableError
from .settings import LIVE_SUBJECTS

__all__ = [
    "KIND_CREATED",
    "KIND_PURGED",
    "KIND_RECORD",
    "KIND_SEALED",
    "KIND_TRIMMED",
    "LIVE_PREFIX",
    "StreamMessage",
    "parse_live",
    "parse_message",
]

#: The stream republishes every stored message on ``<LIVE_PREFIX>.<stream>.<token>`` (outside every
#: stream's subjects: ``subject_prefix`` may not start with it).
LIVE_PREFIX = LIVE_SUBJECTS
#: ``Ds-K`` of a core NATS message (never stored) that a trim or delete sends on a live subject.
KIND_PURGED = "x"

KIND_RECORD = ""
KIND_CREATED = "c"
KIND_TRIMMED = "m"
KIND_SEALED = "s"
_KINDS = frozenset({KIND_RECORD, KIND_CREATED, KIND_TRIMMED, KIND_SEALED})


@dataclasses.dataclass(frozen=True, slots=True)
class StreamMessage:
    """One message of a topic's subject as the adapter reads it."""

    seq: int
    ordinal: int
    epoch: str
    kind: str
    payload: bytes
    #: The digest of the history up to ``ordinal`` (``""``: unknown).
    digest: str = ""

    @property
    def is_record(self) -> bool:
        return self.kind == KIND_RECORD


def parse_message(msg: Msg) -> StreamMessage:
    """The message as the adapter wrote it.

    Raises:
        DurableStreamUnavailableError: The message was not written by this library.
    """
    headers = msg.headers or {}
    try:
        return StreamMessage(
            seq=int(headers["Nats-Sequence"]),
            ordinal=int(headers["Ds-O"]),
            epoch=headers["Ds-E"],
            kind=_kind(headers.get("Ds-K", KIND_RECORD)),
            payload=msg.data,
            digest=headers.get("Ds-H", ""),
        )
    except (KeyError, ValueError) as exc:
        raise DurableStreamUnavailableError(
            f"message on {headers.get('Nats-Subject', '?')!r} was not written by this library: {exc!r}"
        ) from exc


def parse_live(msg: Msg) -> tuple[int, StreamMessage] | None:
    """A republished message: ``(the subject's previous sequence, the message)``; ``None`` for a purge notice.

    Raises:
        DurableStreamUnavailableError: The message was not written by this library.
    """
    headers = msg.headers or {}
    if headers.get("Ds-K") == KIND_PURGED:
        return None
    message = parse_message(msg)
    try:
        previous = int(headers["Nats-Last-Sequence"])
    except (KeyError, ValueError) as exc:
        raise DurableStreamUnavailableError(f"a republished message without its predecessor: {exc!r}") from exc
    expected = headers.get("Nats-Expected-Last-Subject-Sequence")
    if expected is not None and expected != str(previous):
        raise DurableStreamUnavailableError("a republished message whose predecessor disagrees with its own check")
    return previous, message


def _kind(value: str) -> str:
    if value not in _KINDS:
        raise ValueError(f"unknown marker {value!r}")
    return value
