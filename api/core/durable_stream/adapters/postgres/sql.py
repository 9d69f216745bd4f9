"""The SQL statements of the PostgreSQL adapter, compiled once per schema."""

from __future__ import annotations

from sqlalchemy import text

from .settings import quote_ident

__all__ = ["APPEND_TRIM_WINDOW", "Statements"]

#: Rows below the first retained ordinal that one append deletes at most; the rest is left to
#: ``enforce_retention`` so that lowering ``max_records`` never makes one append slow.
APPEND_TRIM_WINDOW = 32


class Statements:
    """The statements of one schema, compiled once."""

    def __init__(self, schema: str, max_records: int | None) -> None:
        s = quote_ident(schema)
        advance = ""
        trim = ""
        if max_records is not None:
            advance = ", first_seq = GREATEST(first_seq, last_seq + 2 - %(max_records)s)"
            trim = f""",
            d AS (
                DELETE FROM {s}.records x USING t
                WHERE x.topic_id = t.id AND x.seq >= t.first_seq - {APPEND_TRIM_WINDOW} AND x.seq < t.first_seq
            )"""
        # The hot statements (append, head, read) are psycopg-style strings run on the pooled DBAPI
        # connection; the rest are SQLAlchemy ``text()`` constructs.
        #
        # One statement: the UPDATE takes the counter row's lock, which is held until this statement's
        # transaction commits, so appenders of one topic commit in ordinal order.
        # The digest is computed in the same UPDATE, under the row's lock, from the previous one (the
        # SET expressions see the row as it was): SHA-256, which PostgreSQL has without an extension.
        counter = f"""
                UPDATE {s}.topics SET last_seq = last_seq + 1, updated_at = clock_timestamp(),
                    last_digest = substr(encode(sha256(convert_to(last_digest, 'UTF8') || %(payload)s), 'hex'), 1, 16)
                    {advance}
                WHERE name = %(name)s AND NOT sealed"""
        rest = f"""
                RETURNING id, last_seq, first_seq, updated_at, last_digest, epoch
            ), r AS (
                INSERT INTO {s}.records (topic_id, seq, created_at, payload, digest)
                SELECT id, last_seq, updated_at, %(payload)s, last_digest FROM t
            ){trim}
            SELECT last_seq, last_digest, epoch FROM t"""
        self.append = f"WITH t AS ({counter}{rest}"
        #: The same, only if the head is the expected one (a conditional append).
        self.append_if = f"WITH t AS ({counter} AND last_seq = %(last)s AND last_digest = %(digest)s{rest}"
        self.create = f"INSERT INTO {s}.topics (name, epoch) VALUES (%(name)s, %(epoch)s) ON CONFLICT (name) DO NOTHING"
        self.head = f"SELECT epoch, first_seq, last_seq, sealed, id, last_digest FROM {s}.topics WHERE name = %(name)s"
        self.read = f"""
            SELECT t.epoch, t.first_seq, t.last_seq, t.sealed, r.seq, r.payload, t.last_digest, r.digest
            FROM {s}.topics t
            LEFT JOIN LATERAL (
                SELECT seq, payload, digest FROM {s}.records
                WHERE topic_id = t.id AND seq > %(after)s AND seq >= t.first_seq AND seq <= t.last_seq
                ORDER BY seq LIMIT %(limit)s
            ) r ON true
            WHERE t.name = %(name)s
            ORDER BY r.seq"""
        self.seal = text(f"""
            INSERT INTO {s}.topics AS t (name, epoch, sealed) VALUES (:name, :epoch, true)
            ON CONFLICT (name) DO UPDATE SET sealed = true, updated_at = clock_timestamp() WHERE NOT t.sealed""")
        self.head_core = text(
            f"SELECT epoch, first_seq, last_seq, sealed, id, last_digest FROM {s}.topics WHERE name = :name"
        )
        # The first retained ordinal moves in the same statement (so the same transaction) as the
        # deletion, and never past the last assigned ordinal.
        self.drop_prefix = text(f"""
            WITH adv AS (
                UPDATE {s}.topics SET first_seq = GREATEST(first_seq, :hi) WHERE id = :id AND last_seq + 1 >= :hi
            )
            DELETE FROM {s}.records WHERE topic_id = :id AND seq >= :lo AND seq < :hi""")
        self.delete_topic = text(f"DELETE FROM {s}.topics WHERE name = :name RETURNING id")
        self.delete_records = text(f"DELETE FROM {s}.records WHERE topic_id = :id")
        self.retention_scan = text(f"""
            SELECT t.id, t.name, t.first_seq, t.last_seq,
                   COALESCE(t.updated_at < now() - make_interval(secs => CAST(:age AS double precision)), false),
                   (SELECT min(seq) FROM {s}.records WHERE topic_id = t.id),
                   COALESCE((SELECT created_at FROM {s}.records
                             WHERE topic_id = t.id AND seq >= t.first_seq ORDER BY seq LIMIT 1)
                            < now() - make_interval(secs => CAST(:age AS double precision)), false)
            FROM {s}.topics t WHERE t.id > :after ORDER BY t.id LIMIT :page""")
        self.first_young = text(f"""
            SELECT seq FROM {s}.records
            WHERE topic_id = :id AND seq >= :first AND created_at >= now() - make_interval(secs => :age)
            ORDER BY seq LIMIT 1""")
        self.delete_idle = text(f"""
            DELETE FROM {s}.topics
            WHERE id = :id AND first_seq > last_seq AND updated_at < now() - make_interval(secs => :age)
            RETURNING id""")
        self.poll = f"SELECT name, epoch, first_seq, last_seq, sealed, last_digest FROM {s}.topics WHERE name = ANY(%s)"
