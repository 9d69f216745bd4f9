"""In-process reference adapter (``memory://``).

The in-process reference: one private store per backend object, shared by its threads. No
durability, and no other process can see it. It is the executable specification the other adapters
are compared with (it runs the same contract suite) and the fastest backend for unit tests.

Capability card
---------------
- URL: ``memory://``. Every backend object owns one private store shared by all its threads.
- Durability: none; the store lives and dies with the backend object.
- Wake-ups: direct, in-process; no watcher thread.
- Concurrency: one lock per store, which serves its waiters in arrival order (FIFO), so a writer
  waiting behind others in a tight loop gets its turn. Under gevent an append or seal first lets
  the other ready greenlets run, as a write to a real store would while it waits for I/O: a
  greenlet appending in a loop cannot keep the hub to itself.
- Options: ``max_records`` (default unlimited; applied on every append), ``max_age_seconds`` (default
  none; applied by ``admin.enforce_retention()``, which also drops topics idle for longer),
  ``buffer_size`` (records per subscription read, default 128).
- Limits: one process; memory grows with what is retained.
- Failure modes: none of its own; operations on a closed backend raise
  ``DurableStreamUnavailableError``.
- Use: tests, examples, and as the executable specification the other adapters are checked against.

Modules: ``driver`` (the store), ``settings`` (options).
"""
