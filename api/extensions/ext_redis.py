"""The app's Redis clients: the event bus's (the broadcast channel's) and the app's own, when configured.

Each is built from a :class:`~api.configs.RedisTarget`, however it was given (``REDIS_URL``,
``EVENT_BUS_REDIS_URL`` or Dify's ``REDIS_*``): one server, the primary Redis Sentinel names (every
new connection asks the sentinels, so connections made after a failover reach the new primary), or a
Redis Cluster.

The pool of a server or a Sentinel primary is a blocking one of ``REDIS_MAX_CONNECTIONS`` connections:
every open broadcast event stream holds one for its whole life, so the pool bounds the streams one
process can serve. When it is exhausted a caller waits at most ``REDIS_POOL_TIMEOUT`` seconds for a
connection and then gets a ``redis.ConnectionError`` that the event transport turns into a 503
``event_stream_busy`` (redis-py's default pool would instead fail at once, at 100 connections, with
an error the API answered as 500).
"""

from __future__ import annotations

from typing import Any

from flask import Flask, current_app
from redis import BlockingConnectionPool, Redis, SSLConnection

from api.configs import AppConfig, ConfigurationError, RedisTarget

__all__ = ["app_redis", "check_reachable", "client_for", "init_app"]


def client_for(
    target: RedisTarget, *, max_connections: int, pool_timeout: float, socket_timeout: float | None = None
) -> Any:
    """A ``redis.Redis`` (a ``RedisCluster`` for a cluster) for ``target``; no I/O happens here."""
    timeouts: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
    ssl: dict[str, Any] = target.client_ssl_kwargs()
    # redis-py's pools and cluster client are untyped (or typed too narrowly for keyword dicts).
    blocking_pool: Any = BlockingConnectionPool
    if target.mode == "cluster":
        from redis.cluster import ClusterNode, RedisCluster

        node_class: Any = ClusterNode
        cluster_class: Any = RedisCluster
        return cluster_class(
            startup_nodes=[node_class(host, port) for host, port in target.nodes],
            username=target.username,
            password=target.password,
            ssl=target.tls,
            max_connections=max_connections,
            **ssl,
            **timeouts,
        )
    if target.mode == "sentinel":
        from redis.sentinel import Sentinel, SentinelConnectionPool

        from api.core.durable_stream.adapters.redis.sentinel import SentinelConnection, SentinelSSLConnection

        sentinel_kwargs: dict[str, Any] = {"socket_timeout": target.sentinel_socket_timeout}
        if target.sentinel_username:
            sentinel_kwargs["username"] = target.sentinel_username
        if target.sentinel_password:
            sentinel_kwargs["password"] = target.sentinel_password
        # Used only for its connection class and arguments (which name it, weakly: the pool keeps it).
        template_class: Any = SentinelConnectionPool
        template = template_class(
            target.service,
            Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs),
            connection_class=SentinelSSLConnection if target.tls else SentinelConnection,
            username=target.username,
            password=target.password,
            db=target.db,
            **ssl,
            **timeouts,
        )
        pool = blocking_pool(max_connections=max_connections, timeout=pool_timeout, **template.connection_kwargs)
        pool.connection_class = template.connection_class
        pool.sentinel_template = template
        return Redis(connection_pool=pool)
    options: dict[str, Any] = {
        "host": target.host,
        "port": target.port,
        "db": target.db,
        "username": target.username,
        "password": target.password,
        **timeouts,
    }
    if target.tls:
        options |= {"connection_class": SSLConnection, **ssl}
    return Redis(connection_pool=blocking_pool(max_connections=max_connections, timeout=pool_timeout, **options))


def check_reachable(target: RedisTarget, source: str, timeout: float = 5.0) -> None:
    """Ping ``target`` once.

    Raises:
        ConfigurationError: It does not answer within ``timeout`` (one line, naming ``source``).
    """
    from redis.exceptions import RedisError

    client = client_for(target, max_connections=2, pool_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except RedisError as exc:
        reason = str(exc).strip().splitlines()
        raise ConfigurationError(
            f"the Redis of {source} ({target.describe()}) is unreachable: {reason[0] if reason else type(exc).__name__}"
        ) from None
    finally:
        client.close()


def init_app(app: Flask, config: AppConfig) -> None:
    """``extensions["redis"]``: the event bus's client (or ``None``); ``extensions["app_redis"]``: the app's."""
    main = config.redis()
    bus = config.event_bus_redis()

    def build(target: RedisTarget | None) -> Any:
        if target is None:
            return None
        return client_for(target, max_connections=config.REDIS_MAX_CONNECTIONS, pool_timeout=config.REDIS_POOL_TIMEOUT)

    app.extensions["app_redis"] = build(main)
    app.extensions["redis"] = app.extensions["app_redis"] if bus == main else build(bus)


def app_redis() -> Any:
    """The app's Redis client (``REDIS_URL`` or Dify's ``REDIS_*``), or ``None`` without one."""
    return current_app.extensions.get("app_redis")
