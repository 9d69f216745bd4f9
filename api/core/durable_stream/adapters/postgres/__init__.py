"""PostgreSQL adapter (``postgresql://``, ``postgresql+psycopg://``, ``postgres://``).

PostgreSQL ≥ 12 (tested on 15), SQLAlchemy 2 Core with psycopg 3 (≥ 3.1.14), never psycopg2.
SQLAlchemy provides the URL handling, the connection pool and the admin/retention statements; the
three statements every append and read runs go straight to the pooled psycopg connection
(server-side prepared after a few uses), which halves their client-side cost.

Capability card
---------------
- URL: ``postgresql://user[:password]@host[:port]/database`` (``postgresql+psycopg://`` and
  ``postgres://`` are accepted too).
- Storage: tables in one schema per store (see "Tables and migration"), created on first use
  (idempotent, safe when several processes start at once) or by
  ``python -m api.core.durable_stream.adapters.postgres.schema URL --schema NAME``.
- Ordering: an append is one statement (hence one transaction) that increments the topic row's
  ``last_seq`` under its row lock and inserts the record: appenders of one topic commit in ordinal
  order, so no reader can ever see ordinal ``n + 1`` without ``n``. Ordinals are dense.
- Reads: one statement (one snapshot) returns the topic's head and the next records.
- Durability: whatever the server's ``synchronous_commit``/replication settings give a committed row.
- Wake-ups: after commit, a ``pg_notify`` hint (payload: topic name) on one of ``notify_channels``
  channels hashed from the topic name; one dedicated connection per backend object (outside the
  pool, the change feed) sends the hints (coalesced), ``LISTEN``-s for other processes' hints and
  re-reads the heads of all watched topics every ``poll_interval`` seconds, so a lost hint delays
  delivery, never loses it.
- Options: see the list under "Connecting".
- Connections per backend object: at most ``pool_size + max_overflow`` pooled ones (opened on
  demand) plus one for hints, however many topics and subscriptions are open. Without overflow the
  count is fixed, so bursts of reads queue for a connection (up to ``pool_timeout``) instead of
  opening more. The queue is served in arrival order (FIFO), so a ``seal()`` behind appenders in a
  tight loop gets its turn, in threads and under gevent.
- Failure modes: a terminated connection is replaced transparently; when the server is unreachable,
  ``connect``/``append``/``receive``/``subscribe_*`` raise ``DurableStreamUnavailableError`` (a
  waiting subscription within about ``poll_interval``). See "Faults".
- Limits: a server that stops answering without closing its sockets blocks the calls in flight until
  TCP gives up; create the backend after forking. See "Faults".

Connecting
----------

- ``postgresql://user[:password]@host[:port]/database``: psycopg 3 through SQLAlchemy (never
  psycopg2)
- ``postgresql+psycopg://…``, ``postgres://…``: the same

Options (keyword arguments of ``connect()`` or URL query parameters; anything else is refused):

- ``schema`` (default ``durable_stream``): schema of the tables; one schema = one store (part of the
  cursor binding through the store identity)
- ``max_records`` (default: none): applied by every append (first retained ordinal advances in the
  same statement) and by ``enforce_retention()``
- ``max_age_seconds`` (default: none): applied by ``admin.enforce_retention()``; topics idle that
  long are deleted once empty
- ``buffer_size`` (default 128): records a subscription holds, and reads per query
- ``pool_size`` / ``max_overflow`` (default 8 / 0): pooled connections for appends, reads and admin
  calls, opened on demand
- ``pool_timeout`` (default 10 s): wait for a pooled connection before
  ``DurableStreamUnavailableError``; waiting callers are served in arrival order
- ``poll_interval`` (default 1.0 s): fallback poll of the watched topics' heads (one query per
  backend object)
- ``notify`` / ``listen`` (default true / true): send / receive ``NOTIFY`` hints
- ``notify_channels`` (default 16): hint channels per schema (a topic's channel is a hash of its
  name)
- ``create_tables`` (default true): create the tables on first use; ``false`` requires the migration
  command
- ``retention_batch_size`` (default 1000): rows deleted per retention transaction
- ``synchronous_commit`` (default server's): per-connection ``synchronous_commit`` for appends
  (``off`` trades the last few hundred ms of acknowledged appends on a server crash for throughput)
- ``connect_timeout`` (default 5 s): libpq connect timeout
- ``application_name`` (default ``durable_stream``): shown in ``pg_stat_activity``
- ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey`` (default libpq's): TLS

Connections carry TCP keepalives (30 s idle, 3 x 10 s probes).

Tables and migration
--------------------

::

    python -m api.core.durable_stream.adapters.postgres.schema postgresql://user@host/db --schema durable_stream
    python -m api.core.durable_stream.adapters.postgres.schema --print-sql --schema durable_stream   # review the DDL


- ``topics(id identity, name unique, epoch, first_seq, last_seq, sealed, updated_at, last_digest)`` — one
  row per topic incarnation. ``id`` is never reused, so rows of a deleted incarnation can never be read
  as a new one's. ``last_digest`` is the digest of record ``last_seq``.
- ``records(topic_id, seq, created_at, payload bytea, digest, primary key (topic_id, seq))`` — reading a
  topic in order is one index range. ``digest``: 16 hexadecimal characters of ``SHA-256(previous digest
  || payload)``, computed by the append statement under the counter row's lock; every position carries
  it, so a replica promoted without the last appends (asynchronous streaming replication) is told
  apart from the history readers received (``history_diverged``).
- ``meta(key, value)`` — the store identity (random, binds cursors to this store) and schema version
  (2; a store of version 1, without digests, is upgraded in place on ``connect()`` or by the command:
  two ``ADD COLUMN`` with a constant default, no table rewrite; with ``create_tables=false`` a version
  1 store is refused with the command to run).

Without the command, the first ``connect()`` creates them: ``CREATE … IF NOT EXISTS`` under a
transaction-scoped advisory lock named after the schema, so processes starting together are safe;
when the tables exist nothing is locked and no ``CREATE`` privilege is needed. ``connect()`` talks to the
server (schema check, identity), so an unreachable server fails there already.

Guarantees and how they are kept
--------------------------------

- **Commit order = ordinal order.** An append is one statement, hence one transaction:
  ``UPDATE topics SET last_seq = last_seq + 1 … WHERE name = … AND NOT sealed RETURNING …`` feeding an
  ``INSERT INTO records``. The UPDATE holds the topic row's lock until commit, so the appender of
  ``n + 1`` cannot even get its ordinal before the appender of ``n`` has committed: no reader can see
  ``n + 1`` without ``n``, however long a transaction stays open (the test suite holds some open with a
  ``pg_sleep`` trigger while 16 threads append and 4 subscriptions read). Ordinals are dense. A missing
  topic row is created with ``INSERT … ON CONFLICT DO NOTHING`` and the append retried; a sealed one
  gives ``TopicSealedError``.
- **Seal** is an upsert through the same row, so it is ordered with appends.
- **Reads** are one statement — the topic row joined laterally to the next ``buffer_size`` records — so
  head and records come from one snapshot.
- **Retention** only removes a prefix: ``first_seq`` advances and the rows below it are deleted in the
  same statement. With ``max_records``, each append advances ``first_seq`` and deletes the rows just
  below it (at most 32, so lowering ``max_records`` never makes one append slow; rows it leaves below
  ``first_seq`` are invisible and ``enforce_retention()`` removes them). ``enforce_retention()`` walks the
  topics in pages, and for each works in batches of ``retention_batch_size`` rows, each one statement
  and its own short transaction (delete the batch, advance ``first_seq`` past it); the topic row's lock
  is held at most for one batch, so appends to the same topic are barely delayed. The test slows
  deletion down to ~2.5 s for 50,000 rows, appends throughout (p99 ~2-5 ms, bound 250 ms) and checks
  that other connections see ``first_seq`` advance in steps of the batch size. A reader behind the
  removed prefix gets ``CursorUnavailableError`` (the shared core checks every batch's ordinals).
- **Delete** removes the topic row and its records in one transaction; the next append creates a new
  incarnation with a new epoch, and old cursors are refused.
- **No driver exception escapes:** SQLAlchemy, psycopg and socket errors become
  ``DurableStreamUnavailableError`` in one place (``errors.translated``).
- **Durability** is the server's: an append returns after its commit, under the connection's
  ``synchronous_commit`` (the server default unless the option is given) and replication settings.

Wake-ups: one hint connection per backend object
------------------------------------------------

A single thread (a greenlet under gevent) per backend object owns one dedicated psycopg connection,
outside the pool:

- After an append, seal, trim or delete commits, the topic name is queued; the thread sends the
  queue as one ``SELECT pg_notify(channel, topic) FROM unnest(…)`` — a hint after a quiet spell goes
  out at once, under a stream of appends batches are at least 2 ms apart, so one hint transaction
  covers many appends. Hints run with ``synchronous_commit=off`` (they need no durability) and the
  appenders never take PostgreSQL's global notify lock themselves, which would serialise all their
  commits.
- It ``LISTEN``s on the channels of the topics this process's subscriptions watch, and wakes them when
  another process hints (its own hints are ignored: those subscriptions were woken in-process).
  After a new ``LISTEN`` it wakes the newly watched topics once, closing the window between a
  subscription's first read and the ``LISTEN``.
- Every ``poll_interval`` (1 s) it reads the heads of all watched topics in one query and wakes those
  that changed. A lost hint (or ``notify=false``/``listen=false``) therefore delays delivery by at most
  about a second and never loses a record. Each subscription additionally re-reads on its own every
  15 s as a last safety net.
- Hint payloads are never trusted: a hint only makes subscriptions read.

So a process with 2,000 subscriptions on 200 topics uses ``pool_size`` connections for reads and one
for hints (measured in ``docs/benchmarks.md``).

Faults (each has a test in `tests/durable_stream/test_postgres_faults.py`)
--------------------------------------------------------------------------

- **A connection terminated by the server** (``pg_terminate_backend``, idle timeouts, a proxy
  restart): **transparent reconnect**. Pooled connections are checked at checkout with a
  zero-timeout peek at the socket (an idle connection has nothing to read unless the server reported
  an error or closed it), so dead ones are replaced without a ``SELECT 1`` round trip (not under TLS,
  where the socket can carry records that are not PostgreSQL messages; there a dead idle connection
  is found by the call that uses it: a read retries, an append fails once). Reads (which
  are idempotent) are retried once on a fresh connection if theirs dies mid-query. The hint
  connection reconnects with back-off and wakes every watched topic. A subscription keeps its exact
  position across all this and the shared core checks the ordinals of every batch, so a reconnect
  provably skips nothing: the test terminates every backend of the reading process while records
  keep arriving and checks ordinals 1..15 in order and NOTIFY latency back under a second.
- **An append whose connection dies mid-call** raises ``DurableStreamUnavailableError``; the record may
  or may not be stored (the contract's ambiguity) and is never retried behind the caller's back.
- **Server down or unreachable**: ``connect()``, ``append()``, ``seal()``, ``subscribe_*()`` and admin calls
  raise ``DurableStreamUnavailableError``; a subscription waiting in ``receive()`` raises it within about
  a second (the hint connection's failure wakes every watched topic, whose reads then fail) and then
  returns ``CLOSED`` for good. When the server is back, the same backend object works again.
- **Limits.** A server that stops answering without closing its sockets (paused process, network
  partition) blocks the calls in flight until TCP gives up (keepalives help idle connections only);
  ``receive(timeout)`` can then overrun its timeout. Create backend objects after ``fork()`` (pooled
  connections must not be shared between processes). psycopg is cooperative under gevent only when
  gevent patched the process before psycopg was imported.

gevent
------

psycopg ≥ 3.1.14 picks a gevent-friendly wait function when ``select`` is monkey-patched (checked by a
test: 50 subscriptions blocked in ``receive()`` while another greenlet keeps ticking every 10 ms). The
hint thread is then a greenlet; its wait uses ``selectors`` (patched) over the connection's socket and
a wake-up pipe, so ``close()`` stops it at once. The whole contract suite, the adapter tests and the
fault tests pass under ``python -m gevent.monkey --module pytest``.

Operating it
------------

- Watch ``pg_stat_activity`` by ``application_name``; ``records`` grows by one row per append and shrinks
  only through retention or deletes — schedule ``admin.enforce_retention()`` (e.g. every minute) when
  ``max_age_seconds`` is set, and let autovacuum keep up (the topics table sees one row update per
  append; it is created with fillfactor 50 so those updates stay HOT).
- The hot ``topics`` row of a busy topic serialises that topic's appends (by design: it is the ordering
  guarantee); different topics append in parallel.
- PgBouncer: session pooling only (the hint connection needs ``LISTEN``; psycopg prepares statements).

Modules
-------
- ``driver``: the driver (pooled connections, appends, shared reads, retention), ``open_driver``.
- ``feed``: the change feed (the hint connection: ``NOTIFY`` out, ``LISTEN`` and head checks in).
- ``sql``: the statements; ``schema``: the tables and the migration command; ``errors``: the
  translation of driver errors; ``settings``: URL and options.
"""
