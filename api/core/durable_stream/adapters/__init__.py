"""The adapters: one sub-package per store, each a :class:`~api.core.durable_stream._driver.Driver`.

:func:`~api.core.durable_stream.connect` picks one by URL scheme and imports its ``driver`` module
only then, so a store's client package (redis-py, psycopg) is imported only when that store is used.
Each sub-package's docstring is its capability card; ``make docs`` renders them to
``docs/adapters/<name>.md``.
"""

#: The adapter sub-packages, in the order their cards are listed.
ADAPTERS = ("memory", "sqlite", "redis", "postgres", "nats")

__all__ = ["ADAPTERS"]
