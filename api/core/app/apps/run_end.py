"""Writing a run's end on its topic: ``workflow_finished``, then the seal, idempotently and with retries.

A run has ended for its readers only when its topic ends with ``workflow_finished`` and is sealed.
Three parties write that end: the worker's attempt (the normal path), the repair of a run whose row
is terminal but whose topic is not (the reaper, a reader's idle check, a redelivered task), and the
API when it ends a run itself (a stopped pause, an expired lease, a run that could not be started).
:func:`write_end` is the only code that appends a terminal event and seals a run's topic. It may be
repeated after any failure: an append whose acknowledgement was lost may or may not have been
stored, so a repeat first reads the topic's last record and appends ``workflow_finished`` only if
it is not there yet. Only the attempt's own first try skips that read (``first_try=True``):
nothing of its end can be on the topic before it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from api.core.durable_stream import DurableStreamProducer, RepairingProducer, TopicSealedError

from .event_codec import encode_event, event_name, stamped
from .event_transport import WorkflowEventTransport

logger = logging.getLogger(__name__)


#: First and longest pause between two tries of a retried operation (seconds).
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 2.0


class DeadlinePassedError(Exception):
    """A retried operation still failed when its deadline passed; ``__cause__`` is the last failure."""


def retry_until[T](deadline: float, operation: Callable[[], T], *, what: str) -> T:
    """Call ``operation`` until it returns, backing off exponentially with jitter, until ``deadline``.

    ``deadline`` is a ``time.monotonic()`` value. ``TopicSealedError`` is certain and is never
    retried.

    Raises:
        DeadlinePassedError: The deadline passed; the last failure is its ``__cause__``.
        TopicSealedError: From ``operation``, at once.
    """
    backoff = FIRST_BACKOFF
    attempt = 0
    while True:
        attempt += 1
        try:
            return operation()
        except TopicSealedError:
            raise
        except Exception as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlinePassedError(f"could not {what} after {attempt} tries: {exc}") from exc
            logger.warning("could not %s (try %d, retrying): %s", what, attempt, exc)
            time.sleep(min(remaining, random.uniform(backoff / 2, backoff)))
            backoff = min(backoff * 2, MAX_BACKOFF)


def write_end(
    transport: WorkflowEventTransport,
    name: str,
    finished: dict[str, Any],
    started: dict[str, Any] | None = None,
    *,
    first_try: bool = False,
    producer: DurableStreamProducer | None = None,
) -> None:
    """Make topic ``name`` end with ``finished`` and seal it. Idempotent; safe to repeat after a failure.

    A sealed topic already has its end (only an end seals a run's topic). ``started`` is appended
    first when the topic never held a record, so that every run's history begins with
    ``workflow_started``; it is left out of a topic that had records, even if retention removed them.

    ``first_try`` is for the run's own attempt writing its end for the first time, without
    ``started``: nothing of the end can be on the topic yet, so it is appended and the topic sealed
    without reading first (the common case: one append, one seal). A topic sealed by someone else
    then raises ``TopicSealedError``, since the run was not the attempt's to end. With the attempt's
    ``producer`` (a ``RepairingProducer``), the first try appends and seals through it: it first puts
    back events a store failover lost, so that the end follows the whole run.

    Raises:
        DurableStreamError: The stream store failed; nothing is known to be written.
        TopicSealedError: Only with ``first_try``: the topic was already sealed.
    """
    topic = transport.topic(name)
    if first_try and started is None:
        (producer or topic).append(stamped(encode_event(finished)))
        if isinstance(producer, RepairingProducer):
            producer.seal()
        else:
            topic.seal()
        return
    info = transport.topic_info(name)
    if info is not None and info.sealed:
        return
    last = transport.last_payload(name) if info is not None and info.length else None
    try:
        if started is not None and transport.resumable and (info is None or info.last_ordinal == 0):
            topic.append(stamped(encode_event(started)))
        if last is None or event_name(last) != "workflow_finished":
            topic.append(stamped(encode_event(finished)))
    except TopicSealedError:
        return  # sealed meanwhile by another writer of the end: it is written
    topic.seal()


__all__ = ["DeadlinePassedError", "retry_until", "write_end"]
