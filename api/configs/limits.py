"""Per-tenant limits (429 with Retry-After) and how fast revocations reach every process.

Each limit is counted across every API process: in the app's Redis when there is one (``REDIS_URL`` or
Dify's ``REDIS_*``), else in the app database (the embedded profile). 0 turns a limit off.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

__all__ = ["LimitSettings"]


class LimitSettings(BaseSettings):
    CREDENTIAL_CHECK_INTERVAL: float = Field(
        default=1.0,
        gt=0,
        le=1.0,
        description="Seconds between a process's looks at the credential revision (a row of the app database): "
        "a rotated or revoked API key or passport is refused by every process, open streams included, within "
        "about this long plus a request.",
    )
    LIMIT_RUN_STARTS_PER_SECOND: int = Field(
        default=50,
        ge=0,
        description="Runs one app may start in any second (a sliding window, across every process); more are "
        "answered 429 with Retry-After. 0: no limit.",
    )
    LIMIT_PASSPORTS_PER_MINUTE: int = Field(
        default=60,
        ge=0,
        description="Passports (new web end users) one client address may get in any minute. 0: no limit. Behind "
        "a proxy, set RESPECT_XFORWARD_HEADERS_ENABLED so the address is the client's, not the proxy's.",
    )
    LIMIT_SSE_STREAMS_PER_END_USER: int = Field(
        default=20,
        ge=0,
        description="Event streams one end user of one app may have open at once. 0: no limit.",
    )
    LIMIT_SSE_STREAMS_PER_KEY: int = Field(
        default=5000,
        ge=0,
        description="Event streams one app (its API key and its passports) may have open at once. 0: no limit.",
    )
    LIMIT_SSE_LEASE_SECONDS: float = Field(
        default=30,
        gt=0,
        description="An open stream's slot is renewed every third of this; a process that dies gives its slots "
        "back when their leases run out.",
    )
    LIMIT_GATEWAY_STREAMS_PER_MINUTE: int = Field(
        default=120,
        ge=0,
        description="Gateway streams one API key may create in any minute. 0: no limit.",
    )
    LIMIT_GATEWAY_BYTES_PER_MINUTE: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        description="Bytes one API key may write through the gateway (creates and appends) per minute. 0: no limit.",
    )
    LIMIT_RETRY_AFTER: int = Field(
        default=5,
        ge=1,
        description="Retry-After (seconds) of a refusal by a concurrency limit (active runs, open streams), whose "
        "end nobody can foretell.",
    )
    LIMIT_STORE: Literal["auto", "redis", "database"] = Field(
        default="auto",
        description="Where the limits count: auto (the app's Redis if there is one, else the app database), "
        "redis, or database.",
    )
    RESPECT_XFORWARD_HEADERS_ENABLED: bool = Field(
        default=False,
        description="Trust one proxy's X-Forwarded-For/-Proto/-Host/-Port: the client's address (the passport "
        "limit's key) is then the one the proxy saw.",
        json_schema_extra={"dify": "RESPECT_XFORWARD_HEADERS_ENABLED"},
    )
