"""A kept row's copies (``RowCopy.make``): transient, every column's value, each request's own to change."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, inspect, select
from sqlalchemy.orm import Session

from api.models import App, RowCopy
from api.models.engine import Base

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def engine() -> Iterator[Engine]:
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def a_loaded_app(engine: Engine) -> App:
    """An app as a request finds it: inserted, then read back (every column has its value)."""
    with Session(engine) as session:
        session.add(App(id="app-1", name="Greeting", graph_json="{}"))
        session.commit()
    with Session(engine, expire_on_commit=False) as session:
        row = session.execute(select(App).where(App.id == "app-1")).scalar_one()
        session.expunge(row)
        return row


def columns(row: App) -> dict[str, object]:
    return {column.key: getattr(row, column.key) for column in App.__table__.columns}


def test_a_copy_is_transient_with_every_column_of_the_row(engine: Engine) -> None:
    row = a_loaded_app(engine)
    copy = RowCopy(row).make()
    assert type(copy) is App and copy is not row
    assert inspect(copy).transient
    assert columns(copy) == columns(row) and copy.created_at is not None and copy.key_generation == 0


def test_a_change_to_one_copy_is_its_own_and_recorded(engine: Engine) -> None:
    kept = RowCopy(a_loaded_app(engine))
    first, second = kept.make(), kept.make()
    first.name = "Changed"
    assert second.name == "Greeting" and kept.make().name == "Greeting"
    assert inspect(first).attrs.name.history.added == ["Changed"]


def test_a_copy_flushes_as_a_constructed_row_would(engine: Engine) -> None:
    copy = RowCopy(a_loaded_app(engine)).make()
    copy.id, copy.api_key, copy.site_code = "app-2", "app-key-2", "site-2"
    expected = columns(copy)
    with Session(engine) as session:
        session.add(copy)
        session.commit()
    with Session(engine) as session:
        stored = session.execute(select(App).where(App.id == "app-2")).scalar_one()
        assert columns(stored) == expected
