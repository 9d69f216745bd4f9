"""The app database's SQLAlchemy object, shared by the models and the extension that configures it.

It lives with the models (as in Dify) so that a model never imports an extension:
``api.extensions.ext_database`` imports it from here and binds it to the Flask app.
"""

from __future__ import annotations

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)

__all__ = ["Base", "db", "end_session"]


def end_session() -> None:
    """Close the current session if this context has one (``db.session.close()`` would make one first:
    a request served from what the process keeps, e.g. a herd's arrival, never touched the database)."""
    if db.session.registry.has():
        db.session.close()
