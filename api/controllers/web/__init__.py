"""The web app API (``/api``): end users of a published app, authenticated by a passport token."""

from __future__ import annotations

from flask import Blueprint

from api.libs.external_api import ExternalApi

bp = Blueprint("web", __name__, url_prefix="/api")
api = ExternalApi(bp)

from . import passport, workflow  # noqa: E402,F401  (registers the resources)
