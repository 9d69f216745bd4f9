"""The PostgreSQL adapter's one translation point: driver exceptions become contract errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
import sqlalchemy.exc

from ..._contract import DurableStreamError, DurableStreamUnavailableError

__all__ = ["describe_error", "translated"]


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """The one place where driver exceptions become contract errors."""
    try:
        yield
    except DurableStreamError:
        raise
    except (sqlalchemy.exc.SQLAlchemyError, psycopg.Error, OSError) as exc:
        raise DurableStreamUnavailableError(f"PostgreSQL {what} failed: {describe_error(exc)}") from exc


def describe_error(exc: BaseException) -> str:
    """The first line of the driver's message, with the exception's class name."""
    original = getattr(exc, "orig", None)
    message = str(original if original is not None else exc).strip().splitlines()
    return f"{type(original or exc).__name__}: {message[0] if message else ''}"
