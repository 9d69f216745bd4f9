"""SQLite adapter (``sqlite:///path/streams.db``): the embedded default.

An embedded, durable store shared by every process that opens the same file.

Capability card
---------------
- URL: ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (percent-escapes are
  decoded; missing parent directories are created). ``:memory:`` is refused: use ``memory://``.
- Options:
  ``max_records`` (int >= 1; applied inside each append's transaction, and by ``enforce_retention()``),
  ``max_age_seconds`` (float; applied by ``admin.enforce_retention()``: drops records older than this and
  whole topics with no activity for this long, so their old cursors fail by epoch),
  ``synchronous`` (``full``, the default, or ``normal``), ``busy_timeout`` (seconds to wait for another
  writer's lock, default 30), ``poll_interval`` (seconds between ``PRAGMA data_version`` checks of the
  change feed, default 0.05), ``buffer_size`` (records per subscription read, default 128).
- Durability: WAL journal. With ``synchronous=full`` an append returns only after its commit is
  fsynced, so it survives a power loss; ``normal`` may lose the last commits on power loss (never on
  a process crash) and never corrupts the file.
- Ordering: every write is one ``BEGIN IMMEDIATE`` transaction, so ordinals are dense and commit
  order equals ordinal order across processes. A read is one read transaction: the head and the
  records it returns are a single snapshot.
- Wake-ups: appends in this process wake subscriptions directly. Other processes' commits are noticed
  by one poller thread per backend object (the change feed) that checks ``PRAGMA data_version`` every
  ``poll_interval`` (50 ms by default) while at least one topic is watched (it sleeps on an event
  otherwise) and compares every watched topic's state when it moves, so no change is missed; a
  subscription also re-reads on its own every 15 s, as a last resort.
- Concurrency: one writer connection behind a lock plus a small pool of reader connections, so reads
  are not held up by a writer's fsync. The lock and the pool serve their waiters in arrival order
  (FIFO), so a ``seal()`` waiting behind appenders in a tight loop gets its turn, in threads and
  under gevent. Under gevent every SQLite call runs in the hub's threadpool, so a slow fsync or a
  lock wait never stalls the hub, and errors come back to the caller without the hub printing them;
  locks are taken in the calling greenlet.
- Identity: the file's resolved absolute path, so cursors from one process resume in another.
- Limits: one host (SQLite locking needs a local file system, not NFS); writes are serialised across
  all topics. Open a new backend after ``fork()`` rather than sharing one across it.
- Failure modes: every SQLite or file-system error (a corrupt or unwritable file, a lock not won
  within ``busy_timeout``, a schema of another version) surfaces as ``DurableStreamUnavailableError``;
  a failing change feed backs off (up to 1 s) and wakes every watched topic so that the subscriptions'
  own reads report the error.
- Retention: ``max_records`` is applied inside each append; ``max_age_seconds`` by
  ``backend.admin.enforce_retention()`` (records older than the age, and whole topics idle for
  longer: their old cursors then fail by epoch), 100 topics per write transaction. Run it
  periodically.

Schema (created idempotently on open; ``PRAGMA user_version`` = 2; a version 1 file, from before
digests, is upgraded in place with two ``ADD COLUMN``; any other version is refused rather than
guessed at)::

    topics(id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, epoch TEXT NOT NULL,
           first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, sealed INTEGER NOT NULL,
           updated_at REAL NOT NULL, last_digest TEXT NOT NULL DEFAULT '')
    records(topic_id INTEGER, seq INTEGER, created_at REAL, payload BLOB, digest TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (topic_id, seq)) WITHOUT ROWID

``digest`` is each record's digest in its topic's chain (``SHA1(previous digest || payload)``, 16
hexadecimal characters), computed in the append's transaction; positions carry it.

``records`` is clustered on ``(topic_id, seq)``: a read is one range scan, a prefix trim one range
delete, and an append one b-tree insert (no separate index to maintain). The counter row in
``topics`` is the authority for ``first_seq``/``last_seq``; retention keeps it equal to the retained
range.

Tests: ``tests/durable_stream/test_contract_sqlite.py`` (the shared contract),
``tests/durable_stream/test_sqlite_adapter.py`` (two OS processes on one file, the poller's CPU cost,
the gevent hub never blocked, corrupt and unwritable files, options, concurrent schema creation).

Modules: ``driver`` (connections, transactions, retention), ``feed`` (the change feed),
``settings`` (URL and options).
"""
