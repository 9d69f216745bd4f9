"""The browser client: the resumable-events ES module and the demo page that uses it.

``/static/durable-workflow/resumable-events.js`` is the product (always served); ``/demo`` and its
assets are a development aid behind ``DEMO_PAGE_ENABLED`` and answer 404 when it is off, the same
JSON 404 as any unknown path.
"""

from __future__ import annotations

import pathlib

from flask import Blueprint, Response, current_app, send_from_directory

from api.configs import AppConfig
from api.libs.errors import NotFoundError

__all__ = ["DEMO_ASSETS", "MODULE_PATH", "bp"]

HERE = pathlib.Path(__file__).resolve().parent
DEMO_DIR = HERE / "demo"
#: Where the module is served, also the path the demo page imports it from.
MODULE_PATH = "/static/durable-workflow/resumable-events.js"
#: The demo's files besides its page, served under ``/demo/``.
DEMO_ASSETS = frozenset({"demo.js", "demo.css"})

# The page loads only its own files and talks only to this origin: a key typed into it goes nowhere else.
DEMO_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

bp = Blueprint("browser", __name__, static_folder="static", static_url_path=MODULE_PATH.rsplit("/", 1)[0])


def _require_demo() -> None:
    config: AppConfig = current_app.config["APP_CONFIG"]
    if not config.demo_page_enabled():
        raise NotFoundError("the demo page is disabled (DEMO_PAGE_ENABLED)", code="not_found")


def _demo_file(name: str) -> Response:
    response = send_from_directory(DEMO_DIR, name)
    response.headers.update(DEMO_HEADERS)
    return response


@bp.get("/demo")
def demo_page() -> Response:
    _require_demo()
    return _demo_file("index.html")


@bp.get("/demo/<string:name>")
def demo_asset(name: str) -> Response:
    _require_demo()
    if name not in DEMO_ASSETS:
        raise NotFoundError(f"no demo file {name!r}", code="not_found")
    return _demo_file(name)
