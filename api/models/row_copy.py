"""A row's column values, kept to make copies of it that belong to no session.

A process may trust a row it read for a short while (an API key's app, the run a shared writer
delivers) instead of asking the database for it once per request. A copy made from the values is
transient: each request may change its own, and none holds a session or a pooled connection.
"""

from __future__ import annotations

import functools
from typing import Any

from .engine import Base

__all__ = ["RowCopy"]


class RowCopy[Model: Base]:
    """The values of every column of one loaded row (read once, when it is kept)."""

    __slots__ = ("_model", "values")

    def __init__(self, row: Model) -> None:
        self._model: type[Model] = type(row)
        self.values: dict[str, Any] = {name: getattr(row, name) for name in _column_keys(type(row))}

    def make(self) -> Model:
        """A new transient instance with the kept values."""
        return self._model(**self.values)


@functools.cache
def _column_keys(model: type[Any]) -> tuple[str, ...]:
    return tuple(column.key for column in model.__table__.columns)
