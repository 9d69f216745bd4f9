"""Hostile input gets a 4xx JSON error, never a 500, and the same answer on SQLite and PostgreSQL.

Every test runs once per app database. The regression tests send the requests that used to fail
(a 1,000-deep body: RecursionError; NUL or 256 characters where PostgreSQL stores a string:
DataError) and spell out the answer each must get; the smoke test sends a few hundred generated
cases (:mod:`harness.hostile`) and compares the answers of the two databases case by case.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from sqlalchemy import select

from api.models import App, WorkflowRun
from api.models.engine import db
from harness.app_database import APP_DATABASES
from harness.hostile import Case, Target, generate_cases
from harness.hostile_check import Report, run_cases
from harness.hostile_target import FAST_WORKFLOW, build_target
from harness.http_transport import Answer, FlaskTransport, HttpRequest, HttpTransport
from harness.served_stack import GunicornServer
from tests.app.conftest import AppHarness

pytestmark = pytest.mark.parametrize("app_database", APP_DATABASES, indirect=True, scope="module")

SMOKE_CASES = 400
SMOKE_SEED = 20261201
#: Answers of the smoke run per database, compared by whichever database runs second.
_SMOKE_ANSWERS: dict[str, dict[int, tuple[str, int, str | None]]] = {}


@pytest.fixture(scope="module")
def target(harness: AppHarness) -> Target:
    config = harness.app.config["APP_CONFIG"]
    return build_target(
        FlaskTransport(harness.client),
        harness.create_app(FAST_WORKFLOW),
        harness.create_app(FAST_WORKFLOW),
        max_body_bytes=config.MAX_REQUEST_BODY_BYTES,
        max_json_depth=config.MAX_JSON_DEPTH,
    )


def send(harness: AppHarness, request: HttpRequest) -> Answer:
    return FlaskTransport(harness.client).send(request)


def post_json(path: str, credential: str, body: bytes | str, *, chunked: bool = False) -> HttpRequest:
    headers = (("Authorization", f"Bearer {credential}"), ("Content-Type", "application/json"))
    return HttpRequest("POST", path, headers, body.encode() if isinstance(body, str) else body, chunked)


def get(path: str, credential: str, *extra: tuple[str, str]) -> HttpRequest:
    return HttpRequest("GET", path, (("Authorization", f"Bearer {credential}"), *extra))


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def assert_answer(answer: Answer, status: int, code: str) -> None:
    assert (answer.status, answer.error_code) == (status, code), answer


# --- bodies ---------------------------------------------------------------------------------------

BODY_ENDPOINTS: dict[str, Callable[[Target], tuple[str, str, dict[str, Any]]]] = {
    "run": lambda t: ("/v1/workflows/run", t.api_key, {"inputs": {"n": "x"}, "user": t.user, "response_mode": "async"}),
    "stop": lambda t: (f"/v1/workflows/tasks/{t.run.task_id}/stop", t.api_key, {"user": t.user}),
    "human-input": lambda t: (f"/v1/workflows/runs/{t.run.run_id}/human-input", t.api_key, {"user": t.user}),
    "web-run": lambda t: ("/api/workflows/run", t.passport, {"inputs": {"n": "x"}, "response_mode": "async"}),
}


@pytest.mark.parametrize("endpoint", list(BODY_ENDPOINTS))
@pytest.mark.parametrize("where", ["top", "field", "user"])
def test_deeply_nested_json_is_400_not_a_recursion_error(
    harness: AppHarness, target: Target, endpoint: str, where: str
) -> None:
    path, credential, body = BODY_ENDPOINTS[endpoint](target)
    for depth in (1000, target.max_json_depth + 1):
        text = nested(depth) if where == "top" else json.dumps({**body, where: "@"}).replace('"@"', nested(depth))
        answer = send(harness, post_json(path, credential, text))
        assert_answer(answer, 400, "invalid_param")
        assert "deeper than" in answer.body["message"]


def test_json_exactly_at_the_depth_limit_is_parsed(harness: AppHarness, target: Target) -> None:
    path, credential, body = BODY_ENDPOINTS["run"](target)
    at_limit = json.dumps({**body, "field": "@"}).replace('"@"', nested(target.max_json_depth - 1))
    assert send(harness, post_json(path, credential, at_limit)).status == 202


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_size_limit_is_413(harness: AppHarness, target: Target, chunked: bool) -> None:
    path, credential, body = BODY_ENDPOINTS["run"](target)
    oversize = json.dumps({**body, "field": "a" * target.max_body_bytes})
    assert_answer(send(harness, post_json(path, credential, oversize, chunked=chunked)), 413, "request_too_large")
    just_fits = json.dumps({**body, "field": ""})
    just_fits = just_fits.replace('""', '"' + "a" * (target.max_body_bytes - len(just_fits.encode())) + '"')
    assert len(just_fits.encode()) == target.max_body_bytes
    assert send(harness, post_json(path, credential, just_fits, chunked=chunked)).status == 202


def test_a_declared_oversize_body_is_413_even_where_no_body_is_read(harness: AppHarness, target: Target) -> None:
    request = HttpRequest(
        "POST",
        f"/api/workflows/tasks/{target.web_run.task_id}/stop",
        (("Authorization", f"Bearer {target.passport}"),),
        b"x" * (target.max_body_bytes + 1),
    )
    assert_answer(send(harness, request), 413, "request_too_large")


# --- identifiers ----------------------------------------------------------------------------------

NUL_USER = "hostile\x00user"
LONG_USER = "u" * 256


def _hostile_identifier_requests(t: Target) -> dict[str, tuple[HttpRequest, int, str]]:
    """name -> (request, status, code): every place a request value reaches a query or a column."""
    run, web = t.run, t.web_run
    key, user = t.api_key, quote(t.user)
    run_body = {"inputs": {"n": "x"}, "response_mode": "async"}
    requests: dict[str, tuple[HttpRequest, int, str]] = {}
    for name, bad in {"nul": NUL_USER, "long": LONG_USER, "control": "a\x1bb", "surrogate": "\ud800"}.items():
        requests |= {
            f"run user {name}": (
                post_json("/v1/workflows/run", key, json.dumps({**run_body, "user": bad})),
                400,
                "invalid_param",
            ),
            f"stop user {name}": (
                post_json(f"/v1/workflows/tasks/{run.task_id}/stop", key, json.dumps({"user": bad})),
                400,
                "invalid_param",
            ),
            f"human-input user {name}": (
                post_json(f"/v1/workflows/runs/{run.run_id}/human-input", key, json.dumps({"user": bad, "inputs": {}})),
                400,
                "invalid_param",
            ),
            f"detail ?user {name}": (
                get(f"/v1/workflows/run/{run.run_id}?user={quote(bad, errors='surrogatepass')}", key),
                400 if name != "surrogate" else 404,  # a query string decodes a lone surrogate to U+FFFD
                "invalid_param" if name != "surrogate" else "not_found",
            ),
            f"events ?user {name}": (
                get(f"/v1/workflow/{run.task_id}/events?user={quote(bad, errors='surrogatepass')}", key),
                400 if name != "surrogate" else 404,
                "invalid_param" if name != "surrogate" else "not_found",
            ),
        }
    for name, bad in {
        "nul": run.run_id[:8] + "\x00" + run.run_id[8:],
        "long": "a" * 3000,
        "upper": run.run_id.upper(),
    }.items():
        segment = quote(bad)
        requests |= {
            f"detail id {name}": (get(f"/v1/workflows/run/{segment}?user={user}", key), 404, "not_found"),
            f"events id {name}": (get(f"/v1/workflow/{segment}/events?user={user}", key), 404, "not_found"),
            # Dify answers a stop of a task it does not know as a success.
            f"stop id {name}": (
                post_json(f"/v1/workflows/tasks/{segment}/stop", key, json.dumps({"user": t.user})),
                200,
                None,
            ),
            f"human-input id {name}": (
                post_json(f"/v1/workflows/runs/{segment}/human-input", key, json.dumps({"user": t.user, "inputs": {}})),
                404,
                "not_found",
            ),
            f"web events id {name}": (get(f"/api/workflow/{segment}/events", t.passport), 404, "not_found"),
            f"web stop id {name}": (
                HttpRequest(
                    "POST", f"/api/workflows/tasks/{segment}/stop", (("Authorization", f"Bearer {t.passport}"),)
                ),
                404,
                "not_found",
            ),
        }
    detail = f"/v1/workflows/run/{run.run_id}?user={user}"
    for name, bad in {"nul": key[:10] + "\x00" + key[10:], "long": key * 60, "latin-1": key + "é"}.items():
        requests[f"api key {name}"] = (get(detail, bad), 401, "unauthorized")
        requests[f"site code {name}"] = (
            HttpRequest("GET", "/api/passport", (("X-App-Code", bad.replace(key, t.site_code)),)),
            404,
            "app_not_found",
        )
        requests[f"passport {name}"] = (
            get(f"/api/workflow/{web.task_id}/events", bad.replace(key, t.passport)),
            401,
            "unauthorized",
        )
    token = run.tokens[1]
    events = f"/v1/workflow/{run.task_id}/events?user={user}"
    requests["Last-Event-ID nul"] = (
        get(events, key, ("Last-Event-ID", token[:9] + "\x00" + token[9:])),
        400,
        "invalid_resume_token",
    )
    requests["?last_event_id nul"] = (
        get(events + "&last_event_id=" + quote(token + "\x00"), key),
        400,
        "invalid_resume_token",
    )
    return requests


def test_hostile_identifiers_are_4xx_never_500(harness: AppHarness, target: Target) -> None:
    wrong = {}
    for name, (request, status, code) in _hostile_identifier_requests(target).items():
        answer = send(harness, request)
        if (answer.status, answer.error_code) != (status, code):
            wrong[name] = (answer.status, answer.body)
    assert not wrong, wrong


def test_a_user_of_255_characters_is_stored(harness: AppHarness, target: Target) -> None:
    user = "é" * 255  # PostgreSQL's varchar(255) counts characters, not bytes
    body = json.dumps({"inputs": {"n": "x"}, "user": user, "response_mode": "async"})
    answer = send(harness, post_json("/v1/workflows/run", target.api_key, body))
    assert answer.status == 202, answer
    detail = send(
        harness, get(f"/v1/workflows/run/{answer.body['workflow_run_id']}?user={quote(user)}", target.api_key)
    )
    assert detail.status == 200, detail


# --- the last line of defence ---------------------------------------------------------------------

REFUSED_VALUES = {
    "sqlite": {"surrogate lookup": ("lookup", "\ud800")},
    "postgresql": {
        "surrogate lookup": ("lookup", "\ud800"),
        "nul lookup": ("lookup", "a\x00b"),
        "over-long insert": ("insert", "u" * 256),
    },
}


def _add_refusal_route(app: Flask, values: dict[str, tuple[str, str]]) -> None:
    """A route that sends a value past validation to the database, as a missing check would."""

    def refused(name: str) -> dict[str, Any]:
        operation, value = values[name]
        if operation == "lookup":
            db.session.execute(select(App).where(App.api_key == value)).scalar_one_or_none()
        else:
            app_id = db.session.execute(select(App.id)).scalars().first()
            db.session.add(WorkflowRun(app_id=app_id, end_user=value, inputs_json="{}"))
            db.session.commit()
        return {"refused": False}

    app.add_url_rule("/test-only/refused/<name>", view_func=refused)


def test_a_value_the_database_refuses_is_400_and_logged(
    make_harness: Callable[..., AppHarness], app_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    harness = make_harness(start_worker=False)
    harness.create_app(FAST_WORKFLOW)
    values = REFUSED_VALUES[app_database]
    _add_refusal_route(harness.app, values)
    for name in values:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="api.libs.external_api"):
            response = harness.client.get(f"/test-only/refused/{quote(name)}")
        assert response.status_code == 400, (name, response.json)
        assert response.json == {
            "code": "invalid_param",
            "message": "a value in the request cannot be stored or looked up",
            "status": 400,
        }
        assert any("refused" in record.getMessage() for record in caplog.records), name


# --- resume tokens --------------------------------------------------------------------------------


def test_other_spellings_of_a_genuine_token_are_400(harness: AppHarness, target: Target) -> None:
    token = next(t for t in target.run.tokens if "-" in t or "_" in t)
    events = f"/v1/workflow/{target.run.task_id}/events?user={quote(target.user)}"
    spellings = {
        "dots": token[:10] + "...." + token[10:],
        "space": token[:10] + " " + token[10:],
        "newline": token[:10] + "\n" + token[10:],
        "standard alphabet": token.replace("-", "+").replace("_", "/"),
        "padding": token + "=" * (-len(token) % 4 or 4),
        "trailing newline": token + "\n",
    }
    for name, spelling in spellings.items():
        answer = send(harness, get(events + "&last_event_id=" + quote(spelling), target.api_key))
        assert (answer.status, answer.error_code) == (400, "invalid_resume_token"), name
    assert send(harness, get(events + "&last_event_id=" + quote(token), target.api_key)).status == 200
    # Spaces around a header value are not part of it (RFC 9110 5.5); every HTTP server drops them.
    assert send(harness, get(events, target.api_key, ("Last-Event-ID", f" {token}\t"))).status == 200


# --- generated cases ------------------------------------------------------------------------------


def test_hostile_smoke_run(harness: AppHarness, target: Target, app_database: str) -> None:
    cases = generate_cases(target, SMOKE_CASES, SMOKE_SEED)
    transport = FlaskTransport(harness.client)

    def deliver(case: Case) -> Answer:
        return transport.send(case.request)

    report = run_cases(cases, deliver, Report(app_database))
    assert not report.problems, report.describe_problems()
    assert len({case.kind for case in cases}) >= 30, "the smoke run covers (almost) every kind"
    _SMOKE_ANSWERS[app_database] = report.answers
    others = {name: answers for name, answers in _SMOKE_ANSWERS.items() if name != app_database}
    for other_answers in others.values():
        differing = [i for i in report.answers if report.answers[i] != other_answers[i]]
        assert not differing, [(i, report.answers[i], other_answers[i]) for i in differing[:10]]


# --- through gunicorn's gevent workers ------------------------------------------------------------


def test_gunicorn_gevent_refuses_chunked_oversize_and_deep_bodies(
    harness: AppHarness, target: Target, module_env: dict[str, str], tmp_path: Any
) -> None:
    with GunicornServer(module_env, tmp_path, workers=1) as server:
        transport = HttpTransport("127.0.0.1", server.port)
        try:
            path, credential, body = BODY_ENDPOINTS["run"](target)
            oversize = json.dumps({**body, "field": "a" * target.max_body_bytes})
            for chunked in (False, True):
                answer = transport.send(post_json(path, credential, oversize, chunked=chunked))
                assert_answer(answer, 413, "request_too_large")
            deep = json.dumps({**body, "field": "@"}).replace('"@"', nested(400_000))
            assert_answer(transport.send(post_json(path, credential, deep, chunked=True)), 400, "invalid_param")
            nul = post_json(path, credential, json.dumps({**body, "user": NUL_USER}))
            assert_answer(transport.send(nul), 400, "invalid_param")
        finally:
            transport.close()
