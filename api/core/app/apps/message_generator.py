"""Where a reader of a run's events starts (Dify's ``MessageGenerator.retrieve_events``).

:meth:`MessageGenerator.retrieve_events` is the one place that decides where a reader's subscription
starts:

- ``StartAt.TAIL``: a blocking request, fixed *before* its run is dispatched, so every event of the
  run arrives (and Dify's event-stream reader without a cursor or a snapshot: what happens next);
- a ``TopicCursor``: a reconnecting client, strictly after the last event it received;
- ``StartAt.BEGINNING``: from the beginning of what is retained of the run (a snapshot, a streaming
  start, a run's shared writer).

How a client then reads (pings, idleness, terminal events, batches) is the delivery service's
(``api.services.delivery.reading``).
"""

from __future__ import annotations

import enum

from api.core.durable_stream import TopicCursor

from .event_transport import EventSubscription, WorkflowEventTransport

__all__ = ["MessageGenerator", "StartAt"]


class StartAt(enum.Enum):
    """Where a reader without a cursor starts."""

    #: The current end of the topic: everything appended after the subscription is made.
    TAIL = "tail"
    #: The first retained record of the topic.
    BEGINNING = "beginning"


class MessageGenerator:
    @staticmethod
    def retrieve_events(
        transport: WorkflowEventTransport, topic_name: str, start: StartAt | TopicCursor
    ) -> EventSubscription:
        """The subscription of a reader of ``topic_name`` that starts at ``start`` (not yet entered).

        On a live-only transport every reader gets what is published from now on, whatever ``start`` says.
        """
        if start is StartAt.TAIL:
            return transport.subscribe_live(topic_name)
        if start is StartAt.BEGINNING:
            return transport.subscribe_resume(topic_name, None)
        return transport.subscribe_resume(topic_name, start)
