"""Who may do what through the gateway.

Paths (after the gateway's prefix):

- ``/runs/<run id>``: a workflow run's events, read-only, for the API key of the run's app;
- ``/apps/<app id>/...``: streams an app owns; its API key may create, read, append to and delete them;
- anything else: open streams, only when anonymous access is on (it is off by default).

An API key never reaches another app's streams or runs: another app's run is 404 (its existence is
not disclosed), another app's namespace 403. Without a key and with anonymous access off, 401.
"""

from __future__ import annotations

import dataclasses

from sqlalchemy import select

from api.core.app.apps.topics import workflow_run_topic
from api.libs.errors import UnauthorizedError
from api.models import App, WorkflowRun, WorkflowRunStatus
from api.models.engine import db
from api.services import app_service
from api.services.credentials import Credential
from api.services.validation import could_be_our_id

from .errors import GatewayError, bad_request, not_found

__all__ = ["Target", "authorize"]

RUNS_PREFIX = "/runs/"
APPS_PREFIX = "/apps/"
MAX_PATH_LENGTH = 400


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    path: str
    #: A workflow run's topic (read-only), or ``None`` for a gateway stream.
    run_topic: str | None = None
    #: The API key the request proved, if any: live readers re-check it while they wait.
    credential: Credential | None = None
    #: The run is accepted and has not started its stream yet (no epoch recorded, not ended): its
    #: topic is created empty when missing, so that a reader that comes at once waits for its events
    #: instead of being told (404) that there are none.
    run_pending: bool = False


def authorize(path: str, authorization: str | None, *, write: bool, anonymous: bool) -> Target:
    """Check the caller's right to ``path``; raise a 400/401/403/404 :class:`GatewayError` if it has none."""
    validate_path(path)
    app = _caller(authorization)
    credential = None if app is None else Credential.for_key(app.id, app_service.bearer_key(authorization))
    if path.startswith(RUNS_PREFIX):
        if app is None:
            raise GatewayError(401, "reading a workflow run needs its app's API key")
        if write:
            raise GatewayError(403, "workflow runs are read-only through the gateway")
        topic, pending = _run_topic(app, path[len(RUNS_PREFIX) :])
        return Target(path, topic, credential, pending)
    if path.startswith(APPS_PREFIX):
        owner = path[len(APPS_PREFIX) :].split("/", 1)[0]
        if app is None:
            raise GatewayError(401 if not anonymous else 403, "an app's streams need its API key")
        if owner != app.id:
            raise GatewayError(403, "these streams belong to another app")
        return Target(path, credential=credential)
    if app is not None:
        if write:
            raise GatewayError(403, f"an API key writes only under {APPS_PREFIX}{app.id}/")
        if not anonymous:
            raise GatewayError(403, "open streams are not served (anonymous access is off)")
        return Target(path, credential=credential)
    if not anonymous:
        raise GatewayError(401, "an API key is required (Authorization: Bearer <app api key>)")
    return Target(path)


def validate_path(path: str) -> None:
    if not path.startswith("/") or len(path) > MAX_PATH_LENGTH or path == "/":
        raise bad_request("invalid stream path")
    if any(ord(char) < 0x20 or char == "\x7f" for char in path) or "//" in path:
        raise bad_request("invalid stream path")
    if any(segment in {".", ".."} for segment in path.split("/")):
        raise bad_request("invalid stream path")
    if not path.isascii():
        try:
            path.encode()
        except UnicodeEncodeError as exc:  # lone surrogates: no store could name a topic after them
            raise bad_request("invalid stream path") from exc


def _caller(authorization: str | None) -> App | None:
    if not authorization:
        return None
    try:
        return app_service.authenticate(authorization)
    except UnauthorizedError as exc:
        raise GatewayError(
            401, f"{exc.code}: this API key was revoked" if exc.code == "key_revoked" else "invalid API key"
        ) from exc


def _run_topic(app: App, run_id: str) -> tuple[str, bool]:
    """The run's topic, and whether the run is accepted but has not started its stream (see ``Target``)."""
    if not could_be_our_id(run_id):
        raise not_found("no such run")
    query = select(WorkflowRun.app_id, WorkflowRun.status, WorkflowRun.stream_epoch).where(WorkflowRun.id == run_id)
    row = db.session.execute(query).one_or_none()
    if row is None or row[0] != app.id:
        raise not_found("no such run")
    pending = row[2] is None and not WorkflowRunStatus(row[1]).is_terminal
    return workflow_run_topic(app.mode, run_id), pending
