"""What a real gunicorn answers at the edge: JSON even for what gunicorn refuses itself, 413 for any body
over the limit however it is sent, and a control socket of each master's own."""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests

from harness.app_env import base_env
from harness.processes import ROOT
from harness.served_stack import GunicornServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornServer]:
    directory: pathlib.Path = tmp_path_factory.mktemp("edge")
    with GunicornServer(base_env(directory), directory, workers=1) as served:
        yield served


def raw(server: GunicornServer, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_an_over_long_uri_is_a_json_414(server: GunicornServer) -> None:
    # Over gunicorn's 4,094 bytes, within what it reads at once (so that it closes without unread bytes: no RST).
    status, headers, body = raw(server, b"GET /v1/" + b"a" * 4200 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 414 and headers["content-type"] == "application/json"
    answer = json.loads(body)
    assert answer["code"] == "uri_too_long" and answer["status"] == 414 and "Request Line" in answer["message"]


def test_a_malformed_request_is_a_json_400(server: GunicornServer) -> None:
    status, headers, body = raw(server, b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\x01: y\r\n\r\n")
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["code"] == "bad_request"


@pytest.mark.parametrize("path", ["/v1/form/human_input/some-token", "/api/form/human_input/some-token"])
def test_a_chunked_body_over_the_limit_is_413_not_400(server: GunicornServer, path: str) -> None:
    def two_mebibytes() -> Iterator[bytes]:
        for _ in range(32):
            yield b"a" * 65536

    answer = requests.post(
        server.url + path, data=two_mebibytes(), headers={"Content-Type": "application/json"}, timeout=30
    )
    assert answer.status_code == 413 and answer.json()["code"] == "request_too_large", answer.text


def test_each_master_has_a_control_socket_of_its_own() -> None:
    script = "import os, api.gunicorn_conf as c; print(os.getpid(), c.control_socket)"
    paths = set()
    for _ in range(2):
        printed = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
        pid, path = printed.stdout.split()
        assert pid in path and len(path) < 100, path  # a Unix socket's path has room for ~107 bytes
        paths.add(path)
    assert len(paths) == 2
