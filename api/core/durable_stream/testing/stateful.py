"""A Hypothesis state machine checks an adapter against a plain model of the contract.

Random sequences of append / subscribe / enter / receive / close / seal / trim / delete run
against the adapter and a list-based model side by side. A subscription may return records it
had already buffered before a trim or delete (it read them while they existed), but it must never
return a wrong record, skip one, or report a gap that is not there; and what is due to it (a
record after its position, the end of a sealed topic, a gap) must come within a short wait.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, MultipleResults, RuleBasedStateMachine, consumes, initialize, multiple, rule

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamSubscription,
    TopicSealedError,
)

from .base import ContractBase

#: Seconds within which a record, the end or a gap that is due must reach a subscription.
DUE_WITHIN = 5.0


@dataclasses.dataclass
class _TopicModel:
    incarnation: int = 0
    history: dict[int, list[bytes]] = dataclasses.field(default_factory=lambda: {0: []})
    first: int = 1
    sealed: bool = False
    #: Where each incarnation was sealed: a reader that saw the seal may end there even after a delete.
    sealed_at: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def records(self) -> list[bytes]:
        return self.history[self.incarnation]

    @property
    def last(self) -> int:
        return len(self.records)


@dataclasses.dataclass
class _SubModel:
    subscription: DurableStreamSubscription
    topic: int
    incarnation: int
    position: int
    entered: bool = False
    closed: bool = False


@dataclasses.dataclass(frozen=True)
class _SavedCursor:
    topic: int
    incarnation: int
    position: int
    cursor: str


class StatefulContract(ContractBase):
    stateful_examples = 50

    def test_random_operation_sequences_match_the_model(self) -> None:
        contract = self

        class Machine(_ContractMachine):
            def make_backend(self) -> DurableStreamBackend:
                return contract.make_backend(buffer_size=3)

        Machine.TestCase.settings = settings(
            max_examples=self.stateful_examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        Machine.TestCase().runTest()


class _ContractMachine(RuleBasedStateMachine):
    subscriptions = Bundle("subscriptions")
    cursors = Bundle("cursors")

    def make_backend(self) -> DurableStreamBackend:
        raise NotImplementedError

    @initialize()
    def open(self) -> None:
        self.backend = self.make_backend()
        prefix = uuid.uuid4().hex
        self.names = [f"model-{prefix}-{index}" for index in range(2)]
        self.topics = [_TopicModel(), _TopicModel()]
        self.counter = 0

    def teardown(self) -> None:
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()

    def _topic(self, index: int) -> Any:
        return self.backend.topic(self.names[index])

    @rule(index=st.integers(0, 1), count=st.integers(1, 4))
    def append(self, index: int, count: int) -> None:
        model = self.topics[index]
        for _ in range(count):
            self.counter += 1
            payload = f"{index}:{self.counter}".encode()
            if model.sealed:
                with pytest.raises(TopicSealedError):
                    self._topic(index).append(payload)
            else:
                self._topic(index).append(payload)
                model.records.append(payload)

    @rule(index=st.integers(0, 1))
    def seal(self, index: int) -> None:
        self._topic(index).seal()
        model = self.topics[index]
        model.sealed = True
        model.sealed_at.setdefault(model.incarnation, model.last)

    @rule(index=st.integers(0, 1), keep=st.integers(0, 6))
    def trim(self, index: int, keep: int) -> None:
        model = self.topics[index]
        exists = self.backend.admin.topic_info(self.names[index]) is not None
        removed = self.backend.admin.trim_topic(self.names[index], keep_last=keep)
        expected = max(0, model.last - model.first + 1 - keep) if exists else 0
        assert removed == expected
        model.first += expected

    @rule(index=st.integers(0, 1))
    def delete(self, index: int) -> None:
        self.backend.admin.delete_topic(self.names[index])
        model = self.topics[index]
        model.incarnation += 1
        model.history[model.incarnation] = []
        model.first, model.sealed = 1, False

    @rule(target=subscriptions, index=st.integers(0, 1), from_tail=st.booleans())
    def subscribe(self, index: int, from_tail: bool) -> _SubModel:
        model = self.topics[index]
        topic = self._topic(index)
        subscription = topic.subscribe_from_tail() if from_tail else topic.subscribe_from_beginning()
        position = model.last if from_tail else model.first - 1
        return _SubModel(subscription, index, model.incarnation, position)

    @rule(target=subscriptions, saved=cursors, index=st.integers(0, 1))
    def subscribe_from_cursor(self, saved: _SavedCursor, index: int) -> _SubModel:
        topic = self._topic(index)
        if saved.topic != index:
            with pytest.raises(CursorUnavailableError):
                topic.subscribe_from_cursor(saved.cursor).__enter__()
            closed = topic.subscribe_from_tail()
            closed.close()
            return _SubModel(closed, index, -1, 0, entered=True, closed=True)
        return _SubModel(topic.subscribe_from_cursor(saved.cursor), index, saved.incarnation, saved.position)

    def _resolvable(self, sub: _SubModel) -> bool:
        model = self.topics[sub.topic]
        return sub.incarnation == model.incarnation and sub.position + 1 >= model.first

    def _caught_up(self, sub: _SubModel) -> bool:
        """Nothing is due to ``sub``: no record after its position, no end, no gap."""
        model = self.topics[sub.topic]
        return self._resolvable(sub) and sub.position == model.last and not model.sealed

    @rule(sub=subscriptions)
    def enter(self, sub: _SubModel) -> None:
        if sub.entered:
            return
        sub.entered = True
        if self._resolvable(sub):
            sub.subscription.__enter__()
        else:
            with pytest.raises(CursorUnavailableError):
                sub.subscription.__enter__()
            sub.closed = True

    @rule(target=cursors, sub=subscriptions, count=st.integers(1, 8))
    def receive(self, sub: _SubModel, count: int) -> MultipleResults[_SavedCursor]:
        saved = [cursor for _ in range(count) if (cursor := self._receive_one(sub)) is not None]
        return multiple(*saved)

    def _receive_one(self, sub: _SubModel) -> _SavedCursor | None:
        if not sub.entered:
            return None
        if sub.closed:
            assert sub.subscription.receive(timeout=0) is CLOSED
            return None
        model = self.topics[sub.topic]
        history = model.history[sub.incarnation]
        try:
            result = sub.subscription.receive(timeout=0)
            if result is None and not self._caught_up(sub):
                # The contract bounds a receive's wait, not what a zero wait finds (a record another
                # node's hint has not announced yet): what is due must come within a short wait.
                result = sub.subscription.receive(timeout=DUE_WITHIN)
        except CursorUnavailableError:
            assert not self._resolvable(sub), "a gap was reported where there is none"
            sub.closed = True
            assert sub.subscription.receive(timeout=0) is CLOSED
            return None
        if result is None:
            assert self._caught_up(sub), "a record, the end or a gap was due and none came"
            return None
        if result is CLOSED:
            assert model.sealed_at.get(sub.incarnation) == sub.position, "closed before the end of the topic"
            sub.closed = True
            return None
        assert sub.position < len(history), "a record beyond the end of the topic"
        assert result.payload == history[sub.position], "a wrong or skipped record"
        sub.position += 1
        return _SavedCursor(sub.topic, sub.incarnation, sub.position, result.cursor)

    @rule(sub=consumes(subscriptions))
    def close(self, sub: _SubModel) -> None:
        sub.subscription.close()
        sub.subscription.close()
        if sub.entered:
            assert sub.subscription.receive(timeout=0) is CLOSED


__all__ = ["StatefulContract"]
