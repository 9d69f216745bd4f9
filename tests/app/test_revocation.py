"""Revocation takes effect: rotated and revoked API keys, site codes and passports are refused by every
process within ``CREDENTIAL_CHECK_INTERVAL`` plus a request, and live readers end.

Two real gunicorn workers (each with its own cache of resolved keys) refuse a revoked key within 2 s;
a planned rotation keeps the old key for its grace; a passport minted before a site-code rotation, a
key rotation or ``revoke-passports`` is refused; ``credentials.still_valid`` (the check open streams
make) turns false; a gateway long-poll is answered 401 ``key_revoked`` and a gateway SSE reader ends
with an ``error`` event ``key_revoked``.
"""

from __future__ import annotations

import json
import pathlib
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from flask import Flask

from api.app_factory import create_app
from api.configs import AppConfig
from api.durable_streams_app import create_gateway_app
from api.services import credentials
from harness.app_env import base_env
from harness.served_stack import GunicornServer, ServedStack
from harness.sse import SseMessage, parse_sse
from harness.waiting import wait_until
from tests.app import examples

pytestmark = pytest.mark.timeout(120)

GREETING = examples.greeting()
#: A run id no app has: an accepted key gets 404 for it (whatever its code), a refused one 401.
NO_SUCH_RUN = "/v1/workflows/run/00000000-0000-4000-8000-000000000000"


def cli(app: Flask, *args: str) -> dict[str, str]:
    result = app.test_cli_runner().invoke(args=list(args))
    assert result.exit_code == 0, result.output
    answer: dict[str, str] = json.loads(result.output.strip().splitlines()[-1])
    return answer


def new_app(app: Flask, directory: pathlib.Path) -> dict[str, str]:
    path = directory / f"app-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(GREETING))
    return cli(app, "create-app", "--file", str(path))


@pytest.fixture
def local(tmp_path: pathlib.Path) -> Iterator[tuple[Flask, dict[str, str]]]:
    env = base_env(tmp_path, CREDENTIAL_CHECK_INTERVAL="0.2")
    app = create_app(AppConfig(**env))  # type: ignore[arg-type]
    yield app, env
    with app.app_context():
        app.extensions["durable_stream"].close()


def status_and_worker(server: GunicornServer, key: str) -> tuple[int, str]:
    # A new connection each time, so the kernel spreads them over both workers.
    response = requests.get(server.url + NO_SUCH_RUN, headers={"Authorization": f"Bearer {key}"}, timeout=5)
    code = response.json().get("code", "")
    return response.status_code, code


def answers_by_worker(server: GunicornServer, since: int) -> dict[str, set[str]]:
    """The statuses each worker pid gave to the probe, in the access-log lines after the first ``since``."""
    seen: dict[str, set[str]] = {}
    for line in server.access_lines()[since:]:
        pid, _method, path, status = line.split()
        if path == NO_SUCH_RUN:
            seen.setdefault(pid, set()).add(status)
    return seen


def test_a_revoked_key_is_refused_by_every_gunicorn_worker_within_2_seconds(tmp_path: pathlib.Path) -> None:
    env = base_env(tmp_path)  # CREDENTIAL_CHECK_INTERVAL at its default, 1 s
    app = create_app(AppConfig(**env))  # type: ignore[arg-type]  (the tables, before the workers race)
    created = new_app(app, tmp_path)
    key = created["api_key"]
    with GunicornServer(env, tmp_path, workers=2) as server:
        # Both workers resolve the key and keep it in their caches (trusted for KEY_CACHE_SECONDS, 10 s).
        def both_workers_accepted() -> bool:
            assert status_and_worker(server, key)[0] == 404
            return sum("404" in statuses for statuses in answers_by_worker(server, 0).values()) == 2

        wait_until(both_workers_accepted, 30, "both workers to accept the key", interval=0.01)
        before = len(server.access_lines())
        cli(app, "apps", "revoke-key", key)
        revoked_at = time.monotonic()

        # Within 2 s the answers turn; from then on every answer of every worker is 401.
        def refused() -> bool:
            return status_and_worker(server, key)[0] == 401

        wait_until(refused, 2.0, "the revoked key to be refused", interval=0.01)
        time.sleep(max(0.0, revoked_at + 2.0 - time.monotonic()))
        after_bound = len(server.access_lines())

        def both_workers_refused() -> bool:
            assert status_and_worker(server, key) == (401, "key_revoked")
            return sum("401" in statuses for statuses in answers_by_worker(server, after_bound).values()) == 2

        wait_until(both_workers_refused, 30, "both workers to refuse the key", interval=0.01)
        later = answers_by_worker(server, after_bound)
        assert all(statuses == {"401"} for statuses in later.values()), later
        assert len(answers_by_worker(server, before)) == 2
        # The app's new key (printed by the command) works at once, in every worker.
        with app.app_context():
            from api.models import App
            from api.models.engine import db

            new_key = db.session.get(App, created["app_id"]).api_key
        assert new_key != key and status_and_worker(server, new_key)[0] == 404


def test_a_planned_rotation_keeps_the_old_key_for_its_grace(local: tuple[Flask, dict[str, str]]) -> None:
    app, env = local
    created = new_app(app, pathlib.Path(env["VAR_DIR"]))
    old = created["api_key"]
    client = app.test_client()

    def status(key: str) -> tuple[int, str]:
        response = client.get(NO_SUCH_RUN, headers={"Authorization": f"Bearer {key}"})
        return response.status_code, "accepted" if response.status_code == 404 else response.json["code"]

    assert status(old) == (404, "accepted")
    rotated = cli(app, "apps", "rotate-key", created["app_id"], "--grace", "2")
    graced_until = time.monotonic() + 2
    assert rotated["api_key"] != old and status(rotated["api_key"]) == (404, "accepted")
    assert status(old) == (404, "accepted"), "still accepted during its grace"
    time.sleep(max(0.0, graced_until - time.monotonic()))
    assert status(old) == (401, "key_revoked")
    assert status(rotated["api_key"]) == (404, "accepted")


def test_revoking_a_key_in_its_grace_ends_the_grace(local: tuple[Flask, dict[str, str]]) -> None:
    app, env = local
    created = new_app(app, pathlib.Path(env["VAR_DIR"]))
    cli(app, "apps", "rotate-key", created["app_id"], "--grace", "3600")
    with app.app_context():
        key = credentials.Credential.for_key(created["app_id"], created["api_key"])
        assert credentials.still_valid(key)
    cli(app, "apps", "revoke-key", created["api_key"])
    response = app.test_client().get(NO_SUCH_RUN, headers={"Authorization": f"Bearer {created['api_key']}"})
    assert response.status_code == 401 and response.json["code"] == "key_revoked"
    result = app.test_cli_runner().invoke(args=["apps", "revoke-key", "app-no-such-key"])
    assert result.exit_code == 1 and "no app accepts this key" in result.output


def passport(client: Any, site_code: str) -> str:
    response = client.get("/api/passport", headers={"X-App-Code": site_code})
    assert response.status_code == 200, response.json
    token: str = response.json["access_token"]
    return token


def web_status(client: Any, token: str) -> tuple[int, str]:
    """404 (the task does not exist) once the passport is accepted, 401 and its code when it is not."""
    response = client.post(
        "/api/workflows/tasks/00000000-0000-4000-8000-000000000000/stop", headers={"Authorization": f"Bearer {token}"}
    )
    return response.status_code, "accepted" if response.status_code == 404 else response.json["code"]


@pytest.mark.parametrize("change", ["rotate-site-code", "revoke-passports", "rotate-key"])
def test_a_passport_minted_before_a_rotation_is_refused(local: tuple[Flask, dict[str, str]], change: str) -> None:
    app, env = local
    created = new_app(app, pathlib.Path(env["VAR_DIR"]))
    client = app.test_client()
    token = passport(client, created["site_code"])
    assert web_status(client, token) == (404, "accepted")
    changed = cli(app, "apps", change, created["app_id"])
    assert web_status(client, token) == (401, "passport_revoked")
    if change == "rotate-site-code":
        assert changed["site_code"] != created["site_code"]
        old_code = client.get("/api/passport", headers={"X-App-Code": created["site_code"]})
        assert old_code.status_code == 404
    fresh = passport(client, changed["site_code"])
    assert web_status(client, fresh) == (404, "accepted")
    with app.app_context():
        from itsdangerous import URLSafeTimedSerializer

        claims = URLSafeTimedSerializer(env["SECRET_KEY"], salt="web-passport").loads(token)
        assert not credentials.still_valid(credentials.Credential.for_passport(created["app_id"], claims))


def test_still_valid_turns_false_within_the_check_interval(local: tuple[Flask, dict[str, str]]) -> None:
    app, env = local
    created = new_app(app, pathlib.Path(env["VAR_DIR"]))
    credential = credentials.Credential.for_key(created["app_id"], created["api_key"])
    with app.app_context():
        assert credentials.still_valid(credential)
        assert credentials.still_valid(credential), "asked again at once: answered from this process's view"
    # Another process revokes it (here: the command, through its own session and transaction).
    cli(app, "apps", "rotate-key", created["app_id"])
    revoked_at = time.monotonic()
    interval = float(env["CREDENTIAL_CHECK_INTERVAL"])
    with app.app_context():
        wait_until(lambda: not credentials.still_valid(credential), interval + 1, "still_valid to turn false")
    assert time.monotonic() - revoked_at <= interval + 1


@pytest.fixture
def gateway(local: tuple[Flask, dict[str, str]]) -> Iterator[tuple[Flask, Flask, dict[str, str]]]:
    app, env = local
    config = AppConfig(**{**env, "DURABLE_STREAMS_GATEWAY_LONG_POLL_SECONDS": "20"})  # type: ignore[arg-type]
    served = create_gateway_app(config)
    yield app, served, env
    with served.app_context():
        served.extensions["durable_stream"].close()


def _stream(served: Flask, key: str, app_id: str) -> tuple[str, str]:
    path = f"/apps/{app_id}/notes"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "text/plain"}
    created = served.test_client().put(path, headers=headers, data=b"first")
    assert created.status_code == 201, created.get_data(as_text=True)
    return path, created.headers["Stream-Next-Offset"]


def test_a_gateway_long_poll_is_answered_401_key_revoked(
    gateway: tuple[Flask, Flask, dict[str, str]],
) -> None:
    app, served, env = gateway
    created = new_app(app, pathlib.Path(env["VAR_DIR"]))
    path, tail = _stream(served, created["api_key"], created["app_id"])
    answers: queue.Queue[Any] = queue.Queue()

    def long_poll() -> None:
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        answers.put(served.test_client().get(f"{path}?offset={tail}&live=long-poll", headers=headers))

    thread = threading.Thread(target=long_poll, daemon=True)
    thread.start()
    time.sleep(0.3)  # the long-poll is waiting (it would wait 20 s for data)
    assert answers.empty()
    cli(app, "apps", "revoke-key", created["api_key"])
    revoked_at = time.monotonic()
    interval = float(env["CREDENTIAL_CHECK_INTERVAL"])
    response = answers.get(timeout=10 * interval + 1)
    assert time.monotonic() - revoked_at <= 10 * interval, "within a few credential checks"
    assert response.status_code == 401 and response.get_data(as_text=True).startswith("key_revoked")


def test_a_gateway_sse_reader_ends_with_key_revoked(gateway: tuple[Flask, Flask, dict[str, str]]) -> None:
    app, served, env = gateway
    created = new_app(app, pathlib.Path(env["VAR_DIR"]))
    path, _tail = _stream(served, created["api_key"], created["app_id"])
    chunks: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        response = served.test_client().get(f"{path}?offset=-1&live=sse", headers=headers, buffered=False)
        try:
            for chunk in response.response:
                chunks.put(chunk if isinstance(chunk, bytes) else chunk.encode())
        finally:
            chunks.put(None)

    threading.Thread(target=read, daemon=True).start()
    first = chunks.get(timeout=10)
    assert first is not None and b"event: data" in first and b"first" in first
    cli(app, "apps", "rotate-key", created["app_id"])
    revoked_at = time.monotonic()
    rest = b""
    while (chunk := chunks.get(timeout=5)) is not None:
        rest += chunk
    interval = float(env["CREDENTIAL_CHECK_INTERVAL"])
    assert time.monotonic() - revoked_at <= 10 * interval, "within a few credential checks"
    assert rest.endswith(
        b'event: error\ndata:{"code":"key_revoked","message":"the API key of this reader was revoked"}\n\n'
    )


@pytest.mark.parametrize("shared_writer", [True, False], ids=["writer", "alone"])
def test_open_event_streams_of_a_revoked_key_end_with_key_revoked(tmp_path: pathlib.Path, shared_writer: bool) -> None:
    """Streams served by their run's shared writer and streams reading alone: each ends with an ``error``
    event ``key_revoked`` within the check interval once its key is revoked; a stream of another app
    stays open."""
    interval = 0.2
    env = base_env(
        tmp_path,
        CREDENTIAL_CHECK_INTERVAL=str(interval),
        SSE_SHARED_WRITER=str(shared_writer).lower(),
        SSE_PING_INTERVAL="0.5",
    )
    with ServedStack(env, tmp_path / "stack", servers=1, workers_per_server=1, celery_concurrency=2) as served:
        url = served.urls[0]
        keys = [served.create_app(GREETING) for _ in range(2)]  # the second one's stream must stay open
        opened: list[tuple[requests.Response, Iterator[SseMessage]]] = []
        try:
            for key in keys:
                run = requests.post(
                    f"{url}/v1/workflows/run",
                    json={"inputs": {"name": "Rev", "mood": "formal"}, "user": "u1", "response_mode": "blocking"},
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=60,
                ).json()
                assert run["data"]["status"] == "paused", run  # a paused run keeps its streams open
                for query in ("&include_state_snapshot=true&continue_on_pause=true", ""):  # a replay and a tail
                    response = requests.get(
                        f"{url}/v1/workflow/{run['task_id']}/events?user=u1{query}",
                        headers={"Authorization": f"Bearer {key}"},
                        stream=True,
                        timeout=30,
                    )
                    assert response.status_code == 200, response.text
                    messages = parse_sse(response.iter_content(None))
                    assert next(messages).is_ping
                    opened.append((response, messages))
            cli(served.app, "apps", "revoke-key", keys[0])
            for _, messages in opened[:2]:
                last = None
                for message in messages:  # to the end of the response
                    if not message.is_ping:
                        last = message
                assert last is not None and last.event == "error", last
                assert (last.json["code"], last.json["status"]) == ("key_revoked", 401)
            # The other app's streams are still open: their next ping comes.
            for _, messages in opened[2:]:
                assert next(messages).event in ("ping", None)
        finally:
            for response, _ in opened:
                response.close()
        assert 500 not in served.statuses()
