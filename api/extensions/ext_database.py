"""The app database (Flask-SQLAlchemy on SQLAlchemy 2)."""

from __future__ import annotations

from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase

from api.configs import AppConfig


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


def init_app(app: Flask, config: AppConfig) -> None:
    uri = config.database_uri()
    app.config["SQLALCHEMY_DATABASE_URI"] = uri
    options: dict[str, Any] = {"pool_pre_ping": True}
    if uri.startswith("sqlite"):
        config.VAR_DIR.mkdir(parents=True, exist_ok=True)
        options = {"connect_args": {"timeout": 30, "check_same_thread": False}}
    app.config["SQLALCHEMY_ENGINE_OPTIONS"] = options
    db.init_app(app)
    with app.app_context():
        if uri.startswith("sqlite"):
            event.listen(db.engine, "connect", _sqlite_pragmas)
        import api.models  # noqa: F401  (registers the tables)

        # Tables are created on start-up; the schema is small and only ever grows by new tables.
        try:
            db.create_all()
        except OperationalError:  # another process created them at the same moment
            db.create_all()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
