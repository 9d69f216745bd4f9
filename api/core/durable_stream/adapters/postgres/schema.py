"""Tables of the PostgreSQL adapter, their creation, and the migration command.

The adapter creates its tables on first use unless ``create_tables=false``; operators who prefer to
run DDL separately (no ``CREATE`` privilege at run time, change review) use the command instead::

    python -m api.core.durable_stream.adapters.postgres.schema postgresql://user@host/db --schema durable_stream
    python -m api.core.durable_stream.adapters.postgres.schema --print-sql --schema durable_stream

Layout (one schema per store, so several stores can share a database):

- ``topics``: one row per topic incarnation. ``last_seq`` is the counter every append increments
  under the row's lock, ``first_seq`` the first retained ordinal, ``epoch`` random per incarnation,
  ``last_digest`` the digest of record ``last_seq`` (the chain every position carries, see ``_digest``).
  ``id`` comes from an identity column and is never reused, so records of a deleted incarnation can
  never be mistaken for a new one's. Every append updates the row; half-empty pages (fillfactor 50)
  keep those updates HOT, so they do not touch the name index.
- ``records``: ``(topic_id, seq)`` is the primary key, so reading a topic in order is one index range;
  ``digest`` is each record's digest (``''`` for records written before schema version 2).
- ``meta``: the store's identity (binds cursors to this store) and the schema version.

Schema version 2 added the digests. A store of version 1 is upgraded in place by the adapter (or the
command below): two ``ADD COLUMN`` with a constant default, which PostgreSQL does without rewriting
the tables; records written before keep an unknown digest, and their cursors resume by ordinal.

Creation is idempotent and safe when several processes start at once: the DDL runs under a
transaction-scoped advisory lock derived from the schema name, and is skipped entirely (no lock, no
``CREATE`` privilege needed) when the tables already exist.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import TYPE_CHECKING

from .settings import DEFAULT_SCHEMA, quote_ident, sqlalchemy_url, validate_schema

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = [
    "SCHEMA_VERSION",
    "ddl_statements",
    "ensure_schema",
    "main",
    "migration_statements",
    "read_identity",
    "read_version",
]

SCHEMA_VERSION = "2"


def ddl_statements(schema: str) -> list[str]:
    s = quote_ident(schema)
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"""CREATE TABLE IF NOT EXISTS {s}.topics (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    epoch text NOT NULL,
    first_seq bigint NOT NULL DEFAULT 1,
    last_seq bigint NOT NULL DEFAULT 0,
    sealed boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_digest text NOT NULL DEFAULT '',
    CHECK (first_seq >= 1 AND first_seq <= last_seq + 1)
) WITH (fillfactor = 50)""",
        f"""CREATE TABLE IF NOT EXISTS {s}.records (
    topic_id bigint NOT NULL,
    seq bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    payload bytea NOT NULL,
    digest text NOT NULL DEFAULT '',
    PRIMARY KEY (topic_id, seq)
)""",
        f"""CREATE TABLE IF NOT EXISTS {s}.meta (
    key text PRIMARY KEY,
    value text NOT NULL
)""",
        # Random per store rather than derived from the URL: the same database reached by another host
        # name must give the same cursor binding, and a dropped and re-created schema must not.
        f"INSERT INTO {s}.meta (key, value) VALUES ('identity', '{uuid.uuid4().hex}') ON CONFLICT (key) DO NOTHING",
        f"INSERT INTO {s}.meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}') ON CONFLICT (key) DO NOTHING",
    ]


def migration_statements(schema: str) -> list[str]:
    """From schema version 1 (no digests) to 2; idempotent."""
    s = quote_ident(schema)
    return [
        f"ALTER TABLE {s}.topics ADD COLUMN IF NOT EXISTS last_digest text NOT NULL DEFAULT ''",
        f"ALTER TABLE {s}.records ADD COLUMN IF NOT EXISTS digest text NOT NULL DEFAULT ''",
        f"UPDATE {s}.meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema_version'",
    ]


def read_version(conn: Connection, schema: str) -> str | None:
    """The schema version recorded in the store, ``None`` when the tables do not exist yet."""
    from sqlalchemy import text

    if read_identity(conn, schema) is None:
        return None
    value = conn.execute(text(f"SELECT value FROM {quote_ident(schema)}.meta WHERE key = 'schema_version'")).scalar()
    return None if value is None else str(value)


def read_identity(conn: Connection, schema: str) -> str | None:
    """Return the store identity, or ``None`` when the tables do not exist yet."""
    from sqlalchemy import text

    exists = conn.execute(text("SELECT to_regclass(:meta) IS NOT NULL"), {"meta": f"{quote_ident(schema)}.meta"})
    if not exists.scalar():
        return None
    value = conn.execute(text(f"SELECT value FROM {quote_ident(schema)}.meta WHERE key = 'identity'")).scalar()
    return None if value is None else str(value)


def ensure_schema(conn: Connection, schema: str) -> str:
    """Create the tables if needed (in the connection's transaction) and return the store identity."""
    from sqlalchemy import text

    identity = read_identity(conn, schema)
    if identity is not None and read_version(conn, schema) == SCHEMA_VERSION:
        return identity
    # Two processes running CREATE ... IF NOT EXISTS (or the upgrade) at the same moment can still
    # collide on the catalog's unique indexes; serialise them on a lock named after the schema.
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": f"durable_stream:{schema}"})
    if identity is None:
        statements = ddl_statements(schema)
    elif read_version(conn, schema) == "1":
        statements = migration_statements(schema)
    else:
        statements = []  # upgraded meanwhile by another process, or a version this code does not know
    for statement in statements:
        conn.execute(text(statement))
    identity = read_identity(conn, schema)
    if identity is None:  # pragma: no cover - the statements above just created it
        raise RuntimeError("schema creation did not record an identity")
    return identity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m api.core.durable_stream.adapters.postgres.schema",
        description="Create (idempotently) the tables of the durable-stream PostgreSQL adapter.",
    )
    parser.add_argument("url", nargs="?", help="postgresql://user[:password]@host[:port]/database")
    parser.add_argument("--schema", default=DEFAULT_SCHEMA, help="schema holding the tables (default: %(default)s)")
    parser.add_argument("--print-sql", action="store_true", help="print the DDL instead of running it")
    args = parser.parse_args(argv)
    schema = validate_schema(args.schema)
    if args.print_sql:
        for statement in ddl_statements(schema):
            print(statement + ";")
        return 0
    if not args.url:
        parser.error("a database URL is required unless --print-sql is given")

    from sqlalchemy import create_engine

    engine = create_engine(sqlalchemy_url(args.url))
    try:
        with engine.begin() as conn:
            identity = ensure_schema(conn, schema)
    finally:
        engine.dispose()
    print(f"durable-stream schema {schema!r} is ready (store identity {identity})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
