"""The app database (Flask-SQLAlchemy on SQLAlchemy 2): binds ``api.models.engine.db`` to the app."""

from __future__ import annotations

from typing import Any

from flask import Flask
from sqlalchemy import Engine, event, inspect, text
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.schema import CreateColumn

from api.configs import AppConfig, ConfigurationError
from api.configs.redis_target import mask_url
from api.models.engine import db

__all__ = ["init_app"]


def init_app(app: Flask, config: AppConfig) -> None:
    """Bind the database and create what is missing of the schema.

    Raises:
        ConfigurationError: The database cannot be reached (one line, the URL's password masked).
    """
    uri = config.database_uri()
    app.config["SQLALCHEMY_DATABASE_URI"] = uri
    # A request that finds the pool empty waits SQLALCHEMY_POOL_TIMEOUT, then is answered 503.
    options: dict[str, Any] = {
        "pool_size": config.SQLALCHEMY_POOL_SIZE,
        "max_overflow": config.SQLALCHEMY_MAX_OVERFLOW,
        "pool_timeout": config.SQLALCHEMY_POOL_TIMEOUT,
        "pool_recycle": config.SQLALCHEMY_POOL_RECYCLE,
    }
    sqlite = uri.startswith("sqlite")
    if sqlite:
        config.VAR_DIR.mkdir(parents=True, exist_ok=True)
        options["connect_args"] = {"timeout": 30, "check_same_thread": False}
    pre_ping = config.SQLALCHEMY_POOL_PRE_PING
    options["pool_pre_ping"] = not sqlite if pre_ping is None else pre_ping
    app.config["SQLALCHEMY_ENGINE_OPTIONS"] = options
    db.init_app(app)
    with app.app_context():
        if sqlite:
            event.listen(db.engine, "connect", _sqlite_pragmas)
        import api.models  # noqa: F401  (registers the tables)

        # Tables are created on start-up; the schema is small and only ever grows, by new tables
        # and by new columns that are nullable or have a server default.
        try:
            _create_schema()
        except OperationalError as exc:
            reason = str(getattr(exc, "orig", exc)).strip().splitlines()
            raise ConfigurationError(
                f"the app database ({mask_url(uri)}) is unreachable: {reason[0] if reason else 'no answer'}"
            ) from None


#: Times a process creates what is missing of the schema while others (gunicorn's workers on a fresh
#: database) do the same: each try finds more made by the others, so a few always suffice.
SCHEMA_TRIES = 5


def _create_schema() -> None:
    for remaining in range(SCHEMA_TRIES - 1, -1, -1):
        try:
            db.create_all()
            _add_missing_columns(db.engine)
            _add_missing_indexes(db.engine)
            return
        except (OperationalError, ProgrammingError):  # another process made the same table a moment before
            db.session.rollback()
            if not remaining:
                raise


def _add_missing_indexes(engine: Engine) -> None:
    """Indexes added to a table after it was created (``create_all`` makes them only with new tables)."""
    for table in db.metadata.sorted_tables:
        for index in table.indexes:
            index.create(engine, checkfirst=True)


def _add_missing_columns(engine: Engine) -> None:
    inspector = inspect(engine)
    for table in db.metadata.sorted_tables:
        present = {column["name"] for column in inspector.get_columns(table.name)}
        missing = [column for column in table.columns if column.name not in present]
        if not missing:
            continue
        with engine.begin() as connection:
            for column in missing:
                spec = CreateColumn(column).compile(dialect=engine.dialect)
                connection.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {spec}"))


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
