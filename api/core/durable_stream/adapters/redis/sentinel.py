"""Connections to the primary that Redis Sentinel names (``redis+sentinel://``).

Each new connection asks the sentinels where the primary is, so after a failover the adapter's pools
reach the new primary as their connections are replaced: a connection to a primary that went away
fails (``DurableStreamUnavailableError``, like any broken connection), and one to a primary that was
demoted answers ``READONLY``, which redis-py turns into a connection error and a disconnect. The
sentinels are asked again for every connection made after that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

if TYPE_CHECKING:
    from redis.sentinel import SentinelConnectionPool

    from .settings import SentinelSettings

__all__ = ["SentinelConnection", "SentinelSSLConnection", "sentinel_template"]


class SentinelConnection(SentinelManagedConnection):
    """A connection that asks the sentinels for the primary before it connects, whichever path connects it.

    redis-py's own class resolves the primary only in ``connect()``, which its pools call; a
    connection used outside them (as the adapter's own pools and the change feed's links use theirs)
    connects from ``send_command`` through ``connect_check_health`` and would reach its last host, or
    ``localhost:6379`` before its first connection.
    """

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self._sock:
            return
        self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


class SentinelSSLConnection(SentinelConnection, SentinelManagedSSLConnection):
    pass


def sentinel_template(settings: SentinelSettings, common: dict[str, Any]) -> SentinelConnectionPool:
    """A redis-py sentinel pool used only as a template: its connection class and keyword arguments
    make the adapter's connections (the pool must be kept: its connections refer to it weakly).

    ``common`` holds the options of every connection to the primary (timeouts, TLS, no retries).
    """
    from redis.sentinel import Sentinel, SentinelConnectionPool

    sentinel_kwargs: dict[str, Any] = {"socket_timeout": settings.sentinel_socket_timeout}
    if settings.sentinel_username:
        sentinel_kwargs["username"] = settings.sentinel_username
    if settings.sentinel_password:
        sentinel_kwargs["password"] = settings.sentinel_password
    manager = Sentinel(list(settings.nodes), sentinel_kwargs=sentinel_kwargs)
    pool_class: Any = SentinelConnectionPool  # untyped in redis-py
    pool: SentinelConnectionPool = pool_class(
        settings.service,
        manager,
        connection_class=SentinelSSLConnection if settings.tls else SentinelConnection,
        username=settings.username,
        password=settings.password,
        db=settings.db,
        **common,
    )
    return pool
