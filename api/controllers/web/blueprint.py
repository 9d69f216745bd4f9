"""The web app's blueprint and its flask-restful ``Api``, which every resource module registers on."""

from __future__ import annotations

from flask import Blueprint

from api.libs.external_api import ExternalApi

bp = Blueprint("web", __name__, url_prefix="/api")
api = ExternalApi(bp)
