"""``/health/live`` and ``/health/ready``: for load balancers, orchestrators and the compose healthchecks.

``live`` says the process serves requests (no dependency is asked); ``ready`` says it can do its
work: 200 when the database, the event stream store and the task queue all answer in time, else 503
``not_ready`` naming each one's state (``ok``, ``unavailable``, ``timeout``). Neither needs a key.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from api.libs.external_api import error_response
from api.services.health import readiness

__all__ = ["bp"]

bp = Blueprint("health", __name__, url_prefix="/health")


@bp.get("/live")
def live() -> Response:
    return jsonify({"status": "ok"})


@bp.get("/ready")
def ready() -> Response:
    checks = readiness(current_app._get_current_object())  # type: ignore[attr-defined]
    failing = sorted(name for name, state in checks.items() if state != "ok")
    if failing:
        message = f"not ready: the {', '.join(failing)} did not answer"
        return error_response("not_ready", message, 503, {"checks": checks}, retry_after=5)
    return jsonify({"status": "ok", "checks": checks})
