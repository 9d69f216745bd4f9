"""``GET /api/passport``: a web end user's session token for one app.

The caller names the app by its public site code (``X-App-Code``); the passport binds an end-user
id to that app and is signed with the Flask secret. It carries the app's key, site-code and passport
generations: rotating the key or the site code, or ``flask apps revoke-passports``, refuses every
passport minted before (``api.services.credentials``).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import Any

from flask import current_app, g, request
from flask_restful import Resource
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import select

from api.libs.errors import NotFoundError, UnauthorizedError
from api.models import App
from api.models.engine import db
from api.services import limits
from api.services.credentials import Credential, passport_claims, passport_current
from api.services.validation import MAX_SITE_CODE_LENGTH, could_be_credential, could_be_passport

from .blueprint import api

PASSPORT_MAX_AGE = 30 * 24 * 3600


def _serializer() -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(current_app.config["SECRET_KEY"], salt="web-passport")


class PassportApi(Resource):  # type: ignore[misc]
    def get(self) -> Any:
        code = request.headers.get("X-App-Code") or ""
        limits.check_passport(request.remote_addr or "unknown")
        app = None
        if could_be_credential(code, MAX_SITE_CODE_LENGTH):
            app = db.session.execute(select(App).where(App.site_code == code)).scalar_one_or_none()
        if app is None:
            raise NotFoundError("unknown app code", code="app_not_found")
        end_user = f"web-{uuid.uuid4()}"
        claims = {"app_id": app.id, "end_user": end_user, **passport_claims(app)}
        return {"access_token": _serializer().dumps(claims), "end_user": end_user}


def validate_passport(view: Callable[..., Any]) -> Callable[..., Any]:
    """Resolve ``Authorization: Bearer <passport>`` and pass ``app_model`` and ``end_user``; ``g.credential``
    is the passport's :class:`~api.services.credentials.Credential` (an open stream re-checks it)."""

    @functools.wraps(view)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise UnauthorizedError("missing passport")
        token = token.strip()
        if not could_be_passport(token):
            raise UnauthorizedError("invalid passport")
        try:
            claims = _serializer().loads(token, max_age=PASSPORT_MAX_AGE)
        except BadSignature as exc:
            raise UnauthorizedError("invalid passport") from exc
        app = db.session.get(App, claims.get("app_id"))
        if app is None:
            raise UnauthorizedError("invalid passport")
        if not passport_current(app, claims):
            raise UnauthorizedError("this passport was revoked: get a new one", code="passport_revoked")
        g.credential = Credential.for_passport(app.id, claims)
        return view(*args, app_model=app, end_user=str(claims["end_user"]), **kwargs)

    return decorated


api.add_resource(PassportApi, "/passport")
