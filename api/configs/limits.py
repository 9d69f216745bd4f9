"""Per-tenant limits (429 with Retry-After) and how fast revocations reach every process."""

from __future__ import annotations

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
