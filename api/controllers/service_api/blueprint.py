"""The service API's blueprint and its flask-restful ``Api``, which every resource module registers on."""

from __future__ import annotations

from flask import Blueprint

from api.libs.external_api import ExternalApi

bp = Blueprint("service_api", __name__, url_prefix="/v1")
api = ExternalApi(bp)
