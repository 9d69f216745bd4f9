"""Credentials and their revocation: API keys (with a grace after a rotation), site codes and passports.

Every rotation or revocation bumps one row (``credential_revisions``) in its own transaction. Each
process reads that row at most every ``CREDENTIAL_CHECK_INTERVAL`` (1 s) and, when it moved, forgets
every credential it trusted (the API-key cache of :mod:`.app_service`, the app states kept here), so a
revoked key or passport is refused by every process within that interval plus one request.

For an open stream, :func:`still_valid` is the cheap check: ``Credential`` says what opened it (an API
key, or a passport and the generations it was minted under), and the answer costs a dictionary look-up
except once a second per process (the revision) and once per app after a change (its row). It reads
through short-lived connections of its own, never the caller's session, so a stream that checks
holds no pooled connection in between. If the database cannot be asked, the last answer stands (an
open stream is not ended by an outage); new requests meet the outage on their own.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from flask import current_app
from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError

from api.libs.errors import NotFoundError
from api.models import App, CredentialRevision
from api.models.engine import db
from api.models.model import new_api_key

logger = logging.getLogger(__name__)

__all__ = [
    "Credential",
    "passport_claims",
    "passport_current",
    "refreshed",
    "revoke_key",
    "revoke_passports",
    "rotate_key",
    "rotate_site_code",
    "still_valid",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Credential:
    """What a request proved: an app's API key, or a passport with the generations it carries."""

    app_id: str
    #: The API key (``None`` for a passport).
    api_key: str | None = None
    key_generation: int = 0
    site_generation: int = 0
    passport_generation: int = 0

    @classmethod
    def for_key(cls, app_id: str, api_key: str) -> Credential:
        return cls(app_id, api_key=api_key)

    @classmethod
    def for_passport(cls, app_id: str, claims: Mapping[str, Any]) -> Credential:
        return cls(
            app_id,
            key_generation=_int(claims.get("kg")),
            site_generation=_int(claims.get("sg")),
            passport_generation=_int(claims.get("pg")),
        )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclasses.dataclass(frozen=True, slots=True)
class _AppCredentials:
    api_key: str
    retired_api_key: str | None
    retired_key_until: float | None
    key_generation: int
    site_generation: int
    passport_generation: int

    def accepts(self, credential: Credential, now: float) -> bool:
        if credential.api_key is not None:
            if credential.api_key == self.api_key:
                return True
            return (
                credential.api_key == self.retired_api_key
                and self.retired_key_until is not None
                and now < self.retired_key_until
            )
        return (
            credential.key_generation == self.key_generation
            and credential.site_generation == self.site_generation
            and credential.passport_generation == self.passport_generation
        )


class _ProcessView:
    """What this process knows: the revision it last saw, when, and the apps' credentials since then."""

    def __init__(self) -> None:
        self.revision: int | None = None
        self.checked_at = float("-inf")
        self.apps: dict[str, _AppCredentials | None] = {}
        self.lock = threading.Lock()

    def refresh(self, interval: float) -> bool:
        """Look at the revision if it is due; whether it moved (the caller forgets what it trusted)."""
        now = time.monotonic()
        if now - self.checked_at < interval:
            return False
        self.checked_at = now  # before the query: concurrent callers do not pile onto the database
        try:
            with db.engine.connect() as connection:
                found = connection.execute(
                    select(CredentialRevision.revision).where(CredentialRevision.id == 1)
                ).scalar_one_or_none()
        except SQLAlchemyError as exc:
            logger.warning("credentials: the revision could not be read, the last one stands: %s", exc)
            return False
        revision = int(found or 0)
        with self.lock:
            moved = self.revision is not None and revision != self.revision
            if self.revision is None or moved:
                self.apps = {}
            self.revision = revision
        return moved

    def app(self, app_id: str) -> _AppCredentials | None:
        if app_id in self.apps:
            return self.apps[app_id]
        with db.engine.connect() as connection:
            row = connection.execute(
                select(
                    App.api_key,
                    App.retired_api_key,
                    App.retired_key_until,
                    App.key_generation,
                    App.site_generation,
                    App.passport_generation,
                ).where(App.id == app_id)
            ).one_or_none()
        state = None if row is None else _AppCredentials(*row)
        if len(self.apps) >= _MAX_APPS:
            self.apps = {}
        self.apps[app_id] = state
        return state


_MAX_APPS = 4096


def _view() -> _ProcessView:
    """The view of the current app (one per process and database; a forked worker inherits its parent's)."""
    view: _ProcessView | None = current_app.extensions.get("credentials")
    if view is None:
        view = current_app.extensions.setdefault("credentials", _ProcessView())
    return view


def _interval() -> float:
    return float(current_app.config["APP_CONFIG"].CREDENTIAL_CHECK_INTERVAL)


def refreshed() -> bool:
    """Look at the revision if it is due (at most every ``CREDENTIAL_CHECK_INTERVAL``); whether it moved
    since this process last looked, i.e. whether every credential it trusts must be asked for again."""
    return _view().refresh(_interval())


def still_valid(credential: Credential) -> bool:
    """Whether ``credential`` is still accepted: cheap enough to ask for every open stream every second.

    An app that no longer exists accepts nothing. A database that cannot be asked leaves the last
    answer standing.
    """
    view = _view()
    view.refresh(_interval())
    try:
        state = view.app(credential.app_id)
    except SQLAlchemyError as exc:
        logger.warning("credentials: app %s could not be read, assumed unchanged: %s", credential.app_id, exc)
        return True
    return state is not None and state.accepts(credential, time.time())


def passport_claims(app: App) -> dict[str, int]:
    """The generations a new passport of ``app`` carries."""
    return {"kg": app.key_generation or 0, "sg": app.site_generation or 0, "pg": app.passport_generation or 0}


def passport_current(app: App, claims: Mapping[str, Any]) -> bool:
    """Whether a passport with ``claims`` was minted under ``app``'s current generations."""
    return passport_claims(app) == {name: _int(claims.get(name)) for name in ("kg", "sg", "pg")}


def _bump() -> None:
    """Move the revision on, in the caller's transaction (the row is made on first use)."""
    bumped = db.session.execute(
        update(CredentialRevision).where(CredentialRevision.id == 1).values(revision=CredentialRevision.revision + 1)
    )
    if getattr(bumped, "rowcount", 1) == 0:
        db.session.add(CredentialRevision(id=1, revision=1))


def _app(app_id: str) -> App:
    app = db.session.get(App, app_id)
    if app is None:
        raise NotFoundError(f"no app {app_id}", code="app_not_found")
    return app


def rotate_key(app_id: str, grace: float = 0) -> App:
    """Give ``app_id`` a new API key; the old one is accepted ``grace`` more seconds (0: refused at once).
    Passports minted before are refused (their key generation is past)."""
    app = _app(app_id)
    _retire(app, grace)
    _bump()
    db.session.commit()
    return app


def _retire(app: App, grace: float) -> None:
    app.retired_api_key = app.api_key
    app.retired_key_until = time.time() + grace if grace > 0 else None
    app.api_key = new_api_key()
    app.key_generation = (app.key_generation or 0) + 1


def revoke_key(key: str, grace: float = 0) -> App:
    """Revoke ``key``: the app's current key is rotated (see :func:`rotate_key`); a retired key still in
    its grace loses the rest of it (or keeps ``grace`` more seconds, if that is sooner).

    Raises:
        NotFoundError: No app has ``key``, current or in its grace.
    """
    app = db.session.execute(select(App).where(App.api_key == key)).scalar_one_or_none()
    if app is not None:
        _retire(app, grace)
    else:
        app = db.session.execute(select(App).where(App.retired_api_key == key)).scalar_one_or_none()
        now = time.time()
        if app is None or app.retired_key_until is None or app.retired_key_until <= now:
            raise NotFoundError("no app accepts this key", code="key_not_found")
        app.retired_key_until = min(app.retired_key_until, now + grace) if grace > 0 else None
    _bump()
    db.session.commit()
    return app


def revoke_passports(app_id: str) -> App:
    """Refuse every passport of ``app_id`` minted until now (new ones are minted as before)."""
    app = _app(app_id)
    app.passport_generation = (app.passport_generation or 0) + 1
    _bump()
    db.session.commit()
    return app


def rotate_site_code(app_id: str) -> App:
    """Give ``app_id`` a new public site code; passports minted with the old one are refused."""
    app = _app(app_id)
    app.site_code = secrets.token_urlsafe(12)
    app.site_generation = (app.site_generation or 0) + 1
    _bump()
    db.session.commit()
    return app
