"""A row's column values, kept to make copies of it that belong to no session.

A process may trust a row it read for a short while (an API key's app, the run a shared writer
delivers) instead of asking the database for it once per request. A copy made from the values is
transient: each request may change its own, and none holds a session or a pooled connection.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy.orm.instrumentation import ClassManager, manager_of_class

from .engine import Base

__all__ = ["RowCopy"]


class RowCopy[Model: Base]:
    """The values of every column of one loaded row (read once, when it is kept)."""

    __slots__ = ("_manager", "values")

    def __init__(self, row: Model) -> None:
        self._manager: ClassManager[Model] = manager_of_class(type(row))
        self.values: dict[str, Any] = {name: getattr(row, name) for name in _column_keys(type(row))}

    def make(self) -> Model:
        """A new transient instance with the kept values.

        Made as a load would make it, not through the model's constructor: the constructor sets each
        column through its instrumented attribute (17 µs for an app, 31 µs for a run, against about
        5 µs here, on every request that uses a kept row). The values are then the copy's unchanged
        state; a change made to the copy is recorded as on any instance, and no other copy sees it.
        """
        instance = self._manager.new_instance()
        instance.__dict__.update(self.values)
        return instance


@functools.cache
def _column_keys(model: type[Any]) -> tuple[str, ...]:
    return tuple(column.key for column in model.__table__.columns)
