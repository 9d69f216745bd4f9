"""End users (Dify's ``GET /end-users/<id>``): recorded the first time a ``user`` starts a run or uploads."""

from __future__ import annotations

import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError

from api.core.workflow.events import end_user_id
from api.libs.errors import NotFoundError
from api.models import App, EndUser
from api.models.engine import db

from .validation import could_be_our_id


def ensure(app: App, user: str, kind: str = "service-api") -> str:
    """The id of ``user`` as an end user of ``app``, recorded if it is not yet (in a transaction of its own,
    committed: two first requests of one user at once both find the row afterwards)."""
    user_id = end_user_id(app.id, user)
    if db.session.get(EndUser, user_id) is not None:
        return user_id
    db.session.add(EndUser(id=user_id, app_id=app.id, session_id=user, type=kind))
    try:
        db.session.commit()
    except IntegrityError:  # the same user's other request recorded it first
        db.session.rollback()
    return user_id


def _iso(value: datetime.datetime) -> str:
    aware = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    return aware.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def detail(app: App, end_user: str) -> dict[str, Any]:
    """``EndUserDetail`` of the app's end user ``end_user`` (an id).

    Raises:
        NotFoundError: (404 ``end_user_not_found``) no such end user of this app.
    """
    row = db.session.get(EndUser, end_user) if could_be_our_id(end_user) else None
    if row is None or row.app_id != app.id:
        raise NotFoundError("End user not found.", code="end_user_not_found")
    return {
        "id": row.id,
        # A deployment here is one workspace per app: the app's id stands for it.
        "tenant_id": row.app_id,
        "app_id": row.app_id,
        "type": row.type,
        "external_user_id": row.session_id,
        "name": None,
        "is_anonymous": False,
        "session_id": row.session_id,
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
    }


def summary(app_id: str, user: str, kind: str = "service-api") -> dict[str, Any]:
    """``EndUserSummary``: how a log names the end user who started a run."""
    return {"id": end_user_id(app_id, user), "type": kind, "is_anonymous": False, "session_id": user}
