"""Redis Streams adapter (``redis://``, ``rediss://``, ``redis+sentinel://``, ``redis+cluster://``).

Standalone Redis (also the primary Redis Sentinel names) and Redis Cluster, Redis ≥ 7.0 (sharded
pub/sub), redis-py ≥ 6.1 with hiredis. The
whole suite passes with redis-py 6.1.0 (the floor ``pyproject.toml`` declares, which Celery's kombu
also requires) and 8.1.0 (what a fresh install resolves today); the adapter's own tests also pass
with 5.2.1.

Capability card
---------------
- URL: ``redis://[user:password@]host:port/db``, ``rediss://…`` (TLS),
  ``redis+sentinel://[user:password@]s1:p1,s2:p2,…/service[/db]`` (the primary the sentinels name),
  or ``redis+cluster://[user:password@]host1:port1,host2:port2,…`` (any reachable nodes of one
  cluster; the rest is discovered).
- Storage: per topic a stream and a metadata hash under one hash tag (one cluster slot); every
  operation is one Lua script (``EVALSHA``): atomic ordinals, seal, trims and reads from one
  snapshot. See "Storage".
- Durability: whatever the server is configured for (RDB/AOF, ``appendfsync``, replicas). A server
  that restarts without its data gives every topic a new epoch: old cursors fail with
  ``CursorUnavailableError`` instead of silently reading a different history.
- Wake-ups: sharded pub/sub hints read by one change feed per backend object (one connection per
  node), with a prefetch of just-appended records for readers at the tail, and a check of all
  watched topics' heads every ``poll_interval`` (1 s), 64 topics per round trip. See "Wake-ups and
  the shared reader".
- Options: see the list under "Connecting"; every pool serves waiting callers in arrival order
  (FIFO), so a ``seal()`` behind appenders in a tight loop gets its turn, in threads and under gevent.
- Failure modes: every Redis error (refused or reset connection, timeout, ``CLUSTERDOWN``, ``OOM``)
  surfaces as ``DurableStreamUnavailableError``; an ``append`` that fails may or may not have been
  stored. A link of the change feed that breaks wakes all its topics' subscriptions at once.
- Limits: a topic is one stream, so one topic's throughput is bounded by one node. See "Limits".

Connecting
----------

- ``redis://[user:password@]host:port/db``: one server (or a primary behind a proxy)
- ``rediss://…``: the same over TLS (``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
  ``ssl_cert_reqs``)
- ``redis+sentinel://[user:password@]s1:p1,s2:p2,…/service[/db]``: the primary that these Redis
  Sentinels name for ``service`` (``rediss+sentinel://`` reaches it over TLS); the user information
  is the primary's, and the sentinels' own credentials are the options ``sentinel_username`` and
  ``sentinel_password``. Every new connection asks the sentinels (each question waits at most
  ``sentinel_socket_timeout``, default 0.5 s), so after a failover connections are replaced by ones
  to the new primary: a command on a connection to the old one fails (refused, reset, or
  ``READONLY`` from a demoted primary) as on a dead server, and the next connection finds the new
  one. What a failover may lose is the server's business (see "Guarantees and what breaks them").
- ``redis+cluster://[user:password@]h1:p1,h2:p2,…``: a Redis Cluster; any reachable nodes, the rest
  is discovered

Options (keyword arguments of ``connect()`` or URL query parameters):

- ``key_prefix`` (default ``ds:``): namespace of every key; part of the cursor binding (no ``{`` or
  ``}``)
- ``max_records`` (default: none): exact ``MAXLEN =`` on every append and in
  ``admin.enforce_retention()``
- ``max_age_seconds`` (default: none): ``MINID =`` trim on every append and in
  ``enforce_retention()``, plus a key TTL refreshed by appends and seals: a topic idle that long
  disappears entirely
- ``buffer_size`` (default 128): records a subscription holds (and reads per round trip)
- ``read_connections`` (default 3): connections shared by every subscription's reads (per node in a
  cluster)
- ``max_connections`` (default 16): connections for appends, seals, heads and admin calls (per
  node); like the read pool, it serves waiting callers in arrival order
- ``socket_timeout`` / ``socket_connect_timeout`` (default 5 s / 2 s): every command; a timed-out
  append may or may not be stored
- ``prefetch`` (default true): hand records carried by hints to readers at the tail without a read
- ``hint_payload_limit`` (default 16384): largest payload copied into the wake-up hint (0: wake-ups
  only)
- ``poll_interval`` (default 1 s): how often the listener checks the heads of all watched topics for
  changes that sent no hint (see below); a subscription's own re-read without any wake-up happens
  only every ``max(15 s, 10 x poll_interval)``
- ``wait_replicas`` (default 0) / ``wait_timeout_ms`` (default 1000): after every append and seal,
  ``WAIT wait_replicas wait_timeout_ms`` on the same connection; fewer acknowledgements raise
  ``DurableStreamUnavailableError`` (the primary stored it; a failover could lose it). A failover to
  an acknowledging replica then loses no acknowledged append, for a replication round trip per append;
  with no replica attached every append fails. Standalone only (refused with ``redis+cluster://``).

Every connection has redis-py's retries switched off: a retried append could be stored twice
without anyone knowing, and a dead server must surface within seconds. Connections are named
``durable-stream-<id>:read|write|feed`` in ``CLIENT LIST``.

Storage
-------

Per topic, sharing one hash tag (so one cluster slot):

- ``{<prefix><topic>}:m`` — hash: ``e`` epoch (random, per incarnation), ``l`` last ordinal, ``i`` stream ID
  of the last record (the stream's last generated ID), ``h`` the last record's digest, ``s`` = ``1``
  when sealed;
- ``{<prefix><topic>}:s`` — stream, one entry per record: ``o`` ordinal, ``p`` payload, ``h`` digest
  (16 hexadecimal characters of ``SHA1(previous digest .. payload)``, computed by the append script;
  entries written before digests existed have none);
- ``{<prefix><topic>}:n`` — the sharded pub/sub channel of its hints (not a key).

Topic names containing ``{``/``}`` or starting with ``#`` use ``#<blake2b of the name>`` in the tag instead.
Every operation is one Lua script run by ``EVALSHA`` (the append checks the seal, creates the epoch,
assigns ``last + 1``, ``XADD``s, trims, refreshes the TTL and publishes its hint atomically). Reads are
one ``MULTI``/``EXEC`` snapshot (``HMGET`` + ``XLEN`` + ``XRANGE`` from the reader's stream ID) in standalone
mode and the ``READ`` script in a cluster. Nothing ever sends ``XDEL``, ``$`` or ``0-0``; retention only
trims a prefix; the first retained ordinal is ``last - XLEN + 1``.

**Do not delete or rename these keys by hand** except as a whole topic (both keys): deleting only
the stream under a surviving hash is reported to readers as an error, not repaired.

Guarantees and what breaks them
-------------------------------

- Ordinals are dense and assigned in the append script, so every gap is detected exactly: a trim
  past a reader, an expired or deleted topic, or a server that lost its data (restart without
  persistence, ``FLUSHALL``, failover to a replica that had not received the writes) gives
  ``CursorUnavailableError``, never a silent skip or a replay of another history (the epoch differs).
- Durability is the server's: with ``appendonly yes`` + ``appendfsync always`` an acknowledged append
  survives a crash; with ``everysec`` up to a second can be lost, which readers then see as an epoch
  or ordinal mismatch only if the metadata was lost too. Asynchronous replication can lose
  acknowledged appends on failover while keeping the epoch: every position carries the digest of the
  record it follows, so a reader who received a lost record gets ``CursorUnavailableError``
  ``history_diverged`` wherever the promoted replica's history ends (before, at or after its position,
  sealed or not); a reader before the lost records continues exactly. A producer that outlives the
  failover (``as_producer(repair_window=…)``) appends the lost records again, after which every
  reader continues exactly; ``wait_replicas`` bounds the loss instead. A stream ID read after a failover
  may belong to the other history: a read whose stream ID does not lead to the next ordinal locates
  the ordinal instead, and the digests decide.
- Every redis-py exception becomes ``DurableStreamUnavailableError`` in one place (``_translate`` in ``driver``).

Wake-ups and the shared reader
------------------------------

Append, seal, trim and delete scripts ``SPUBLISH`` a hint on the topic's channel. One listener thread
(a greenlet under gevent) per backend object holds one dedicated connection per node, subscribed to
the channels of the watched topics only, pinged every 5 s when idle. A hint wakes the topic's
subscriptions; an append hint also carries the record (up to ``hint_payload_limit``), which readers
at the tail use instead of a read when its predecessor's stream ID equals their position (exact:
stream IDs grow, ordinals are dense; the subscription still checks epoch and ordinals). Before a
topic's first record the position is the pseudo ID ``e:<epoch>``, which the first append's hint names
as its predecessor, so even the first record of a fresh topic needs no read.

In plain threads a waiting subscription may read the hints itself. The links have one reader at a
time (a lock, the "baton"): a subscription about to wait takes it when nobody reads, or asks the
listener for it when it is the only subscription waiting, and then reads in its own thread until its
own wake-up comes, waking other topics' subscriptions on the way as the listener would. Its record
thus reaches it after one thread wake-up, as a raw blocking ``XREAD`` does, not two (listener, then
subscription). It leaves subscribing, reconnecting and topology refreshes to the listener and hands
the baton back for them, and the listener takes the baton back at once when the reading subscription
stops while others still wait (with several waiting, the listener keeps reading). A wake-up set by
another thread (a local append, ``close()``, the head check) interrupts its ``select()`` through the
listener's wake-up socket. Under gevent only the listener greenlet reads: passing a hint to another
greenlet costs no thread wake-up.

Beside the listener, a second thread (greenlet) checks the heads of all watched topics every
``poll_interval``: ``HMGET`` + ``XLEN`` per topic, 64 topics per round trip (one ``MULTI``/``EXEC``; a
pipeline per node in a cluster), yielding between chunks. A topic whose head differs from what its
hints announced is woken: that is how changes that send no hint (key expiry, keys deleted by hand,
``FLUSHALL``) and a hint lost in transit reach waiting readers within about ``poll_interval``, for every
subscription at once. A check that overlapped a hint proves nothing and is ignored. Subscriptions
therefore need no fallback polls of their own (their last-resort re-read is every
``max(15 s, 10 x poll_interval)``): 10,000 idle subscriptions cost one pipelined round trip per 64
topics per second instead of 10,000 wake-ups and reads.

The same checks, the subscriptions' reads and the hints keep a mirror of each topic's head: a
subscription already at it (its last-resort re-read) is answered without a round trip for up to
``3 x poll_interval`` after the last confirmation. A link that breaks forgets its topics' mirrors and
prefetched records and wakes all their subscriptions at once, so a dead server reaches every waiting
``receive()`` within a round trip; the link reconnects with back-off and re-subscribes. With
``max_age_seconds``, prefetched records older than a quarter of it (at most 1 s) are not handed out
either.

A batch built from hints is shared by every subscription of the topic at the same position, and so
is the public record (with its encoded cursor) of each of its records; the batch leaves the cache
50 ms after it was built. Keeping per-delivery objects short-lived matters under gevent with
thousands of subscriptions in one process: objects that survive the cyclic GC's young generations
make its full collections, which stop every greenlet, more frequent (see ``docs/benchmarks.md``).

Why pub/sub and not one ``XREAD BLOCK`` over the watched streams: in Redis Cluster a multi-key ``XREAD``
must keep all keys in one hash slot (``CROSSSLOT`` otherwise, even for keys on the same node), so a
per-node ``XREAD`` over many topics cannot exist, while one connection can ``SSUBSCRIBE`` channels of
every slot its node serves. Hints also carry seals, trims and deletes made by other processes, which
``XREAD`` never sees, and a newly watched topic costs one ``SSUBSCRIBE`` write on the open connection,
not an interrupted blocking call. When a slot migrates, the server unsubscribes its channels and the
listener re-subscribes on the new owner.

Limits
------

- One topic is one stream: its throughput is bounded by one node (thousands to tens of thousands of
  appends per second).
- Hints are pub/sub messages: a listener that falls behind by more than the server's
  ``client-output-buffer-limit pubsub`` is disconnected and reconnects (its readers re-read).
- Hints are replicated within a cluster shard; with large payloads set ``hint_payload_limit`` lower.
- The append command is encoded by hand (per topic, once) in standalone mode; a cluster goes
  through redis-py's cluster client, which costs more per append on the client side.

Modules
-------
- ``driver``: the driver (keys, scripts' replies, retention), ``open_driver``.
- ``deployment``: standalone and cluster deployments, the fair connection pools, the hand-packed
  append command; ``sentinel``: connections to the primary Redis Sentinel names.
- ``feed``: the change feed (listener thread, baton hand-over, periodic head check);
  ``links``: its per-node connections and the hints read from them.
- ``prefetch``: records and heads seen in hints, handed to readers at the tail.
- ``scripts``: the Lua scripts and the key layout; ``settings``: URL and options.
"""
