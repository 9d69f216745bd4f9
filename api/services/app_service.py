"""Creating apps and authenticating their API keys."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from flask import current_app
from sqlalchemy import or_, select

from api.configs import AppConfig
from api.core.workflow import WorkflowDefinitionError, load_app, parse
from api.libs.errors import InvalidParamError, UnauthorizedError
from api.models import App, RowCopy
from api.models.engine import db

from . import credentials
from .validation import MAX_API_KEY_LENGTH, could_be_credential


def read_definition(text: str) -> Mapping[str, Any]:
    """An app file's content: a Dify DSL export (YAML), or the JSON format of earlier versions.

    Raises:
        InvalidParamError: neither.
    """
    try:
        return parse(text)
    except WorkflowDefinitionError as exc:
        raise InvalidParamError(f"invalid workflow: {exc}") from exc


def create_app(definition: Mapping[str, Any]) -> App:
    """Check a Dify workflow DSL (``kind: app``, ``mode: workflow``) and store it as a new app.

    A definition in the JSON format of earlier versions (``{"name", "mode", "graph"}``) is converted
    into a Dify graph first; the app keeps only the Dify graph.
    """
    config: AppConfig = current_app.config["APP_CONFIG"]
    hosts = frozenset(host.strip() for host in config.WORKFLOW_HTTP_ALLOWED_HOSTS.split(",") if host.strip())
    try:
        loaded = load_app(definition, allowed_hosts=hosts)
    except WorkflowDefinitionError as exc:
        raise InvalidParamError(f"invalid workflow: {exc}") from exc
    app = App(name=loaded.name, mode=loaded.mode, graph_json=json.dumps(loaded.graph))
    db.session.add(app)
    db.session.commit()
    return app


def bearer_key(authorization: str | None) -> str:
    """The API key of ``Authorization: Bearer <app api key>``.

    Raises:
        UnauthorizedError: The header is missing, of another scheme, or not a possible key.
    """
    if not authorization:
        raise UnauthorizedError("missing Authorization header")
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise UnauthorizedError("the Authorization header must be 'Bearer <api key>'")
    key = key.strip()
    if not could_be_credential(key, MAX_API_KEY_LENGTH):
        raise UnauthorizedError("invalid API key")
    return key


def authenticate(authorization: str | None) -> App:
    """Resolve ``Authorization: Bearer <app api key>`` to its app: its current key, or the key a rotation
    retired while its grace lasts.

    Raises:
        UnauthorizedError: No such key (``unauthorized``), or a retired key past its grace (``key_revoked``).
    """
    key = bearer_key(authorization)
    if credentials.refreshed():  # a key was rotated or revoked somewhere: trust nothing resolved before
        _KNOWN_KEYS.clear()
    known = _KNOWN_KEYS.get(key)
    if known is not None and known[0] > time.monotonic():
        return known[1].make()  # in no session: every request may change its own
    app = db.session.execute(
        select(App).where(or_(App.api_key == key, App.retired_api_key == key))
    ).scalar_one_or_none()
    if app is None:
        raise UnauthorizedError("invalid API key")
    trusted_for = KEY_CACHE_SECONDS
    if app.api_key != key:
        left = (app.retired_key_until or 0) - time.time()
        if left <= 0:
            raise UnauthorizedError("this API key was revoked", code="key_revoked")
        trusted_for = min(trusted_for, left)
    if len(_KNOWN_KEYS) >= _KNOWN_KEYS_MAX:
        _KNOWN_KEYS.clear()
    _KNOWN_KEYS[key] = (time.monotonic() + trusted_for, RowCopy(app))
    return app


#: How long a process trusts an API key it has resolved without asking the database again. A herd of
#: reconnecting clients of one app sends the same key thousands of times a second. A rotation or
#: revocation (api.services.credentials) makes every process forget them within CREDENTIAL_CHECK_INTERVAL;
#: an app deleted from the database by hand is refused by every process within this time.
KEY_CACHE_SECONDS = 10.0
_KNOWN_KEYS_MAX = 4096
_KNOWN_KEYS: dict[str, tuple[float, RowCopy[App]]] = {}
