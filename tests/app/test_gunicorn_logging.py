"""The access logger of ``api.gunicorn_conf`` writes the lines gunicorn's own would, atom for atom."""

from __future__ import annotations

import json
import pathlib
import re
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from gunicorn import glogging
from gunicorn.config import Config

from api.gunicorn_logging import AccessLogger

EVERY_ATOM = " ".join(
    f"%({name})s" for name in ("h", "l", "u", "r", "s", "m", "U", "q", "H", "b", "B", "f", "a", "T", "D", "M", "L", "p")
)
HEADERS_AND_ENVIRON = '%({user-agent}i)s %({X-Trace}i)s %({content-type}o)s %({remote_addr}e)s %(zz)s "%(U)s"'


def _request(path: str = '/v1/workflow/a"b/events') -> tuple[Any, Any, dict[str, Any], timedelta]:
    environ = {
        "REMOTE_ADDR": "127.0.0.1",
        "REQUEST_METHOD": "GET",
        "RAW_URI": f"{path}?user=u",
        "PATH_INFO": path,
        "QUERY_STRING": "user=u",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_USER_AGENT": 'curl/8 "quoted"',
    }
    req = SimpleNamespace(headers=[("USER-AGENT", 'curl/8 "quoted"'), ("X-TRACE", "t-1")])
    resp = SimpleNamespace(status="200 OK", sent=1234, headers=[("Content-Type", "text/event-stream")])
    return resp, req, environ, timedelta(seconds=2, microseconds=345_678)


@pytest.fixture(autouse=True)
def _plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    # The access lines themselves are compared with gunicorn's: plain text unless a test asks for JSON.
    monkeypatch.setenv("LOG_FORMAT", "text")


def _line(logger_class: type[glogging.Logger], directory: pathlib.Path, fmt: str, request: Any) -> str:
    path = directory / f"{logger_class.__name__}.log"
    config = Config()
    config.set("accesslog", str(path))
    config.set("access_log_format", fmt)
    logger = logger_class(config)
    try:
        logger.access(*request)
    finally:
        for handler in logger.access_log.handlers:
            handler.close()
        logger.access_log.handlers.clear()
    return path.read_text()


def _redacted(request: tuple[Any, Any, dict[str, Any], timedelta]) -> tuple[Any, Any, dict[str, Any], timedelta]:
    """What gunicorn's own logger would write had the query's values been redacted before it."""
    resp, req, environ, took = request
    query = "&".join(f"{part.split('=')[0]}=[redacted]" for part in environ["QUERY_STRING"].split("&"))
    return resp, req, {**environ, "QUERY_STRING": query, "RAW_URI": f"{environ['PATH_INFO']}?{query}"}, took


@pytest.mark.parametrize("fmt", [EVERY_ATOM, HEADERS_AND_ENVIRON, '%(h)s "%(m)s %(U)s" %(s)s %(B)s %(M)sms'])
def test_access_lines_are_gunicorns_with_the_query_redacted(tmp_path: pathlib.Path, fmt: str) -> None:
    request = _request()
    ours = _line(AccessLogger, tmp_path, fmt, request)
    assert ours == _line(glogging.Logger, tmp_path, fmt, _redacted(request))
    assert ours.count("\n") == 1 and '\\"' in ours  # quotes escaped, as gunicorn does
    assert "user=u" not in ours


def test_the_time_atom_and_a_status_given_as_a_number(tmp_path: pathlib.Path) -> None:
    resp, req, environ, took = _request("/health")
    resp.status = 503
    line = _line(AccessLogger, tmp_path, "%(t)s %(s)s %(b)s", (resp, req, environ, took))
    assert re.fullmatch(r"\[\d{2}/\w{3}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4}\] 503 1234\n", line), line


def test_a_broken_format_fails_the_line_not_the_request(tmp_path: pathlib.Path) -> None:
    # A number format for a text atom: logging reports it on stderr, as with gunicorn's logger.
    assert _line(AccessLogger, tmp_path, "%(h)d", _request()) == ""
    assert _line(glogging.Logger, tmp_path, "%(h)d", _request()) == ""


def test_with_json_logs_an_access_line_is_a_json_object_around_gunicorns(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = _request()
    plain = _line(glogging.Logger, tmp_path, EVERY_ATOM, _redacted(request))
    monkeypatch.setenv("LOG_FORMAT", "json")
    line = json.loads(_line(AccessLogger, tmp_path, EVERY_ATOM, request))
    assert line["logger"] == "gunicorn.access" and line["level"] == "INFO"
    assert line["message"] == plain.rstrip("\n")


def test_a_json_access_line_has_its_fields_as_fields_and_never_a_form_token(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOG_FORMAT", "json")
    resp, req, environ, took = _request("/v1/form/human_input/secret-form-token")
    environ["QUERY_STRING"] = "user=someone&last_event_id=a-resume-token"
    raw = _line(AccessLogger, tmp_path, '%(h)s "%(r)s" %(s)s', (resp, req, environ, took))
    line = json.loads(raw)
    assert {key: line[key] for key in ("method", "path", "status", "bytes", "remote")} == {
        "method": "GET",
        "path": "/v1/form/human_input/[redacted]",
        "status": 200,
        "bytes": 1234,
        "remote": "127.0.0.1",
    }
    assert line["duration_ms"] == 2345.678 and line["query"] == "user=[redacted]&last_event_id=[redacted]"
    assert "secret-form-token" not in raw and "a-resume-token" not in raw and "someone" not in raw
    monkeypatch.setenv("LOG_FORMAT", "text")
    text = _line(AccessLogger, tmp_path, "%(U)s %(r)s %(q)s", (resp, req, environ, took))
    assert "secret-form-token" not in text and "a-resume-token" not in text
