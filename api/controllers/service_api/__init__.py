"""The service API (``/v1``), authenticated with an app's API key."""

from __future__ import annotations

from flask import Blueprint

from api.libs.external_api import ExternalApi

bp = Blueprint("service_api", __name__, url_prefix="/v1")
api = ExternalApi(bp)

from . import workflow  # noqa: E402,F401  (registers the resources)
