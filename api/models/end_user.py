"""End users and their uploaded files: the rows behind Dify's ``/end-users/<id>`` and ``/files/upload``."""

from __future__ import annotations

import datetime

from sqlalchemy import DateTime, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from .engine import db
from .model import new_id, utc_now


class EndUser(db.Model):  # type: ignore[name-defined,misc]
    """An app's end user: the ``user`` of its requests (``session_id``), under a stable id of its own.

    The id is derived from the app and the user (``api.core.workflow.events.end_user_id``), so that a
    worker can name a run's end user (``created_by``) without reading this table.
    """

    __tablename__ = "end_users"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    app_id: Mapped[str] = mapped_column(String(36), ForeignKey("apps.id"), index=True)
    session_id: Mapped[str] = mapped_column(String(255))
    #: ``service-api`` (an API key's request) or ``browser`` (a web app passport's).
    type: Mapped[str] = mapped_column(String(32), default="service-api")
    created_at: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    updated_at: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class UploadFile(db.Model):  # type: ignore[name-defined,misc]
    """A file an end user uploaded (``POST /files/upload``), usable as a file input of the app's runs."""

    __tablename__ = "upload_files"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    app_id: Mapped[str] = mapped_column(String(36), ForeignKey("apps.id"), index=True)
    #: The uploader (``end_users.id``).
    end_user_id: Mapped[str] = mapped_column(String(36))
    name: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(Integer)
    #: Without its dot, lower case (``pdf``); empty when the name has none.
    extension: Mapped[str] = mapped_column(String(32))
    mime_type: Mapped[str] = mapped_column(String(255))
    #: Where the storage keeps the bytes, relative to its root.
    key: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
