"""Creating apps and authenticating their API keys."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select

from api.core.workflow import Graph, WorkflowDefinitionError
from api.libs.errors import InvalidParamError, UnauthorizedError
from api.models import App, RowCopy
from api.models.engine import db

from .validation import MAX_API_KEY_LENGTH, could_be_credential


def create_app(definition: Mapping[str, Any]) -> App:
    """Validate a workflow definition (``{"name", "mode", "graph"}``) and store it as a new app."""
    name = definition.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidParamError("an app needs a 'name'")
    mode = definition.get("mode", "workflow")
    if mode != "workflow":
        raise InvalidParamError("only 'workflow' apps are supported")
    try:
        Graph(definition.get("graph", {}))
    except WorkflowDefinitionError as exc:
        raise InvalidParamError(f"invalid workflow: {exc}") from exc
    app = App(name=name.strip(), mode=mode, graph_json=json.dumps(definition["graph"]))
    db.session.add(app)
    db.session.commit()
    return app


def authenticate(authorization: str | None) -> App:
    """Resolve ``Authorization: Bearer <app api key>`` to its app."""
    if not authorization:
        raise UnauthorizedError("missing Authorization header")
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise UnauthorizedError("the Authorization header must be 'Bearer <api key>'")
    key = key.strip()
    if not could_be_credential(key, MAX_API_KEY_LENGTH):
        raise UnauthorizedError("invalid API key")
    known = _KNOWN_KEYS.get(key)
    if known is not None and known[0] > time.monotonic():
        return known[1].make()  # in no session: every request may change its own
    app = db.session.execute(select(App).where(App.api_key == key)).scalar_one_or_none()
    if app is None:
        raise UnauthorizedError("invalid API key")
    if len(_KNOWN_KEYS) >= _KNOWN_KEYS_MAX:
        _KNOWN_KEYS.clear()
    _KNOWN_KEYS[key] = (time.monotonic() + KEY_CACHE_SECONDS, RowCopy(app))
    return app


#: How long a process trusts an API key it has resolved without asking the database again. A herd of
#: reconnecting clients of one app sends the same key thousands of times a second; an app deleted
#: from the database is refused by every process within this time.
KEY_CACHE_SECONDS = 10.0
_KNOWN_KEYS_MAX = 4096
_KNOWN_KEYS: dict[str, tuple[float, RowCopy[App]]] = {}
