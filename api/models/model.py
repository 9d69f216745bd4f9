from __future__ import annotations

import datetime
import json
import secrets
import uuid
from typing import Any

from sqlalchemy import DateTime, Float, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .engine import db


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def new_id() -> str:
    return str(uuid.uuid4())


def new_api_key() -> str:
    return "app-" + secrets.token_urlsafe(24)


class App(db.Model):  # type: ignore[name-defined,misc]
    """A workflow application: a name, a mode and a validated workflow graph."""

    __tablename__ = "apps"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(255))
    mode: Mapped[str] = mapped_column(String(32), default="workflow")
    graph_json: Mapped[str] = mapped_column(Text)
    api_key: Mapped[str] = mapped_column(String(64), unique=True, index=True, default=new_api_key)
    #: Public code of the app's web app (``X-App-Code``), exchanged for end-user passports.
    site_code: Mapped[str] = mapped_column(
        String(32), unique=True, index=True, default=lambda: secrets.token_urlsafe(12)
    )
    created_at: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    # Credential generations (api.services.credentials): a passport carries the three it was minted
    # under and is refused once any of them moved on.
    #: Bumped by each rotation or revocation of the API key.
    key_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: Bumped by each rotation of the site code.
    site_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: Bumped by ``flask apps revoke-passports``.
    passport_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: The key a rotation replaced, still accepted until ``retired_key_until`` (epoch seconds): the grace of
    #: a planned rotation (``--grace``), so clients can move to the new key without an outage.
    retired_api_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    retired_key_until: Mapped[float | None] = mapped_column(Float, nullable=True)

    @property
    def graph(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.graph_json)
        return value


class CredentialRevision(db.Model):  # type: ignore[name-defined,misc]
    """One row, bumped in the same transaction as every rotation or revocation of a credential.

    Each process reads it at most every ``CREDENTIAL_CHECK_INTERVAL`` and forgets the credentials it
    trusts when it moved: one primary-key read a second per process, whatever the number of keys.
    """

    __tablename__ = "credential_revisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
