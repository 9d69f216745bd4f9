"""A real HTTP service on loopback for the http-request examples: it answers greetings, or fails."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Greeter(BaseHTTPRequestHandler):
    failing = False

    def do_GET(self) -> None:
        if self.failing:
            self.send_error(500, "the service is failing on purpose")
            return
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        body = json.dumps({"greeting": f"Hello {query.get('name', ['?'])[0]} from the service"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # the tests' output stays quiet
        return


class _Failing(_Greeter):
    failing = True


@contextmanager
def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/greeting?name={{{{#start.name#}}}}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def greeting_service() -> Iterator[str]:
    """The URL (with the start node's ``name``) of a service answering ``{"greeting": "Hello <name> …"}``."""
    with _serve(_Greeter) as url:
        yield url


@contextmanager
def failing_service() -> Iterator[str]:
    """The URL of a service that answers every request with a 500."""
    with _serve(_Failing) as url:
        yield url
