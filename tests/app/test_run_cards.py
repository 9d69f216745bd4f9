"""A run's writer keeps a copy of its row for the arrivals at it: only for its app and user, only while
the writer delivers, only for ``CARD_SECONDS`` (one arrival at a time then reads the row again, up to
``CARD_LIMIT``), and never refreshed by its own use."""

from __future__ import annotations

import pytest

from api.models import WorkflowRun
from api.services.delivery import run_cards
from api.services.delivery.run_cards import RunCards

pytestmark = pytest.mark.timeout(30)

KEY = ("workflow:run-1", b"binding")


def a_run() -> WorkflowRun:
    return WorkflowRun(
        id="run-1", task_id="task-1", app_id="app-1", end_user="u1", status="running", stream_epoch="e1", total_steps=3
    )


def test_a_card_answers_by_run_id_and_task_id_with_a_copy_of_every_column() -> None:
    cards = RunCards(lambda key: True)
    cards.remember(KEY, a_run())
    for name in ("run-1", "task-1"):
        copy = cards.recall(name, app_id="app-1", end_user="u1")
        assert copy is not None
        assert (copy.id, copy.task_id, copy.status, copy.stream_epoch, copy.total_steps) == (
            "run-1", "task-1", "running", "e1", 3,
        )  # fmt: skip
    first, second = (
        cards.recall("run-1", app_id="app-1", end_user="u1"),
        cards.recall("run-1", app_id="app-1", end_user="u1"),
    )
    assert first is second  # one copy per card, made once, read by every arrival
    assert len(cards) == 1


def test_another_app_or_user_or_an_unknown_id_gets_nothing() -> None:
    cards = RunCards(lambda key: True)
    cards.remember(KEY, a_run())
    assert cards.recall("run-1", app_id="app-2", end_user="u1") is None
    assert cards.recall("run-1", app_id="app-1", end_user="u2") is None
    assert cards.recall("run-2", app_id="app-1", end_user="u1") is None


def test_a_card_is_given_only_while_its_writer_delivers() -> None:
    delivering = {KEY}
    cards = RunCards(lambda key: key in delivering)
    cards.remember(KEY, a_run())
    assert cards.recall("task-1", app_id="app-1", end_user="u1") is not None
    delivering.clear()
    assert cards.recall("task-1", app_id="app-1", end_user="u1") is None
    cards.forget(KEY)
    delivering.add(KEY)
    assert cards.recall("task-1", app_id="app-1", end_user="u1") is None
    assert len(cards) == 0


def test_a_card_ages_out_and_its_use_does_not_refresh_it(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(run_cards, "_now", lambda: now[0])
    cards = RunCards(lambda key: True)
    cards.remember(KEY, a_run())
    now[0] += run_cards.CARD_SECONDS * 0.9
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is not None
    now[0] += run_cards.CARD_SECONDS * 0.2
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is None
    cards.remember(KEY, a_run())  # a row read again
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is not None


def test_one_arrival_at_a_time_reads_an_aged_card_s_row_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """While one arrival reads the row again, the others keep the card (a herd must not read it each)."""
    now = [100.0]
    monkeypatch.setattr(run_cards, "_now", lambda: now[0])
    cards = RunCards(lambda key: True)
    cards.remember(KEY, a_run())
    now[0] += run_cards.CARD_SECONDS * 1.1
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is None  # sent to read the row
    assert all(cards.recall("task-1", app_id="app-1", end_user="u1") is not None for _ in range(100))
    # That arrival never came back (its request failed): another one is sent a refresh later...
    now[0] += run_cards.CARD_SECONDS
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is None
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is not None
    # ... and past the limit nobody gets the card.
    now[0] = 100.0 + run_cards.CARD_LIMIT + 0.1
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is None
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is None
    cards.remember(KEY, a_run())
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is not None


def test_forgetting_one_writer_keeps_the_card_another_writer_of_the_run_remembered_since() -> None:
    other = ("workflow:run-1", b"other binding")
    cards = RunCards(lambda key: True)
    cards.remember(KEY, a_run())
    cards.remember(other, a_run())
    cards.forget(KEY)
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is not None
    cards.forget(other)
    assert cards.recall("run-1", app_id="app-1", end_user="u1") is None
