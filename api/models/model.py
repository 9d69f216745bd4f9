from __future__ import annotations

import datetime
import json
import secrets
import uuid
from typing import Any

from sqlalchemy import DateTime, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from api.extensions.ext_database import db


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

    @property
    def graph(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.graph_json)
        return value
