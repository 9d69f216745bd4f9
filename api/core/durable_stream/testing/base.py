"""The factory hooks an adapter's test class implements, and the fixtures every capability uses.

An adapter's test module subclasses :class:`~api.core.durable_stream.testing.DurableStreamContract`
once and implements :meth:`ContractBase.make_backend`; nothing here is collected by itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from api.core.durable_stream import (
    DurableStreamBackend,
    DurableStreamTopic,
)

from .helpers import closing_all


class ContractBase:
    """The factory hooks an adapter provides, and the helpers every capability uses."""

    #: Whether the store lives inside the test process (the memory adapter): tests that measure
    #: this process's memory while records pile up in the store do not apply.
    store_in_process: ClassVar[bool] = False

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        """Open a new backend object on this adapter's store (each call a new connection)."""
        raise NotImplementedError

    def backend_url(self, **options: Any) -> str | None:
        """A URL another process can pass to ``connect()`` to reach the same store, if any."""
        return None

    def lose_last_records(self, backend: DurableStreamBackend, name: str, count: int) -> None:
        """Make the store forget topic ``name``'s last ``count`` records (and its seal), keeping its epoch.

        What a failover to a replica that had not received them leaves behind: the topic as it was
        ``count`` appends ago. The history tests that fork a topic need it; an adapter that cannot
        provoke it leaves this as it is, and those tests are skipped.
        """
        pytest.skip("this adapter's tests cannot make its store forget records")

    @pytest.fixture
    def open_backend(self) -> Iterator[Callable[..., DurableStreamBackend]]:
        with closing_all(self.make_backend) as open_:
            yield open_

    @pytest.fixture
    def backend(self, open_backend: Callable[..., DurableStreamBackend]) -> DurableStreamBackend:
        return open_backend()

    @pytest.fixture
    def topic_name(self) -> str:
        return f"contract-{uuid.uuid4().hex}"

    @pytest.fixture
    def topic(self, backend: DurableStreamBackend, topic_name: str) -> DurableStreamTopic:
        return backend.topic(topic_name)
