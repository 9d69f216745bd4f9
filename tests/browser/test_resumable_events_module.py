"""The module as a browser runs it: its SSE parser against crafted streams split at every byte, its
resume loop against crafted answers (a stream cut in the middle of a message, a start cut before its
answer or before its first event, a first attach, a form submitted by its token), and what a
production server serves.

The server here is a real ``gunicorn -k gevent`` on production settings (``DEPLOY_ENV`` unset, its own
``SECRET_KEY``, no ``DEMO_PAGE_ENABLED``): it serves the module, and ``/demo`` is a 404.
"""

from __future__ import annotations

import json
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from playwright.sync_api import Page

from api.app_factory import create_app
from api.configs import AppConfig
from api.controllers.browser import MODULE_PATH
from harness.app_env import base_env
from harness.served_stack import GunicornServer

SOURCE = pathlib.Path(__file__).resolve().parents[2] / "api" / "controllers" / "browser" / "static"
DEPLOYMENT_SECRET = "a-deployment-secret-" + "x" * 32


@pytest.fixture(scope="module")
def production_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornServer]:
    var_dir = tmp_path_factory.mktemp("production")
    env = base_env(var_dir, SECRET_KEY=DEPLOYMENT_SECRET)
    with GunicornServer(env, var_dir, workers=1, name="production") as server:
        yield server


@pytest.fixture
def module_page(page: Page, production_server: GunicornServer) -> Page:
    """A page on the server's origin, so the module is imported from where the API serves it."""
    page.goto(f"{production_server.url}{MODULE_PATH}")
    return page


def message(data: str, event: str = "message", last_event_id: str = "", has_id: bool = False) -> dict[str, Any]:
    return {"event": event, "data": data, "lastEventId": last_event_id, "hasId": has_id}


# (name, stream, expected messages, expected retry values, expected final lastEventId)
CASES: list[tuple[str, str, list[dict[str, Any]], list[int], str]] = [
    ("multi-line data", "data: a\ndata: b\ndata\ndata:c\n\n", [message("a\nb\n\nc")], [], ""),
    (
        "CRLF",
        "id: 1\r\ndata: x\r\n\r\ndata: y\r\n\r\n",
        [message("x", "message", "1", True), message("y", "message", "1")],
        [],
        "1",
    ),
    ("CR alone", "data: x\rdata: y\r\rdata: z\r\r", [message("x\ny"), message("z")], [], ""),
    ("mixed line ends", "data: a\r\ndata: b\rdata: c\n\r\n", [message("a\nb\nc")], [], ""),
    ("comments", ": hello\n:\ndata: z\n: between fields\n\n:only a comment\n\n", [message("z")], [], ""),
    (
        "event types",
        "event: ping\n\nevent: notice\ndata: {}\n\ndata: plain\n\n",
        [message("{}", "notice"), message("plain")],
        [],
        "",
    ),
    ("one space dropped, not two", "data:a\ndata:  b\n\n", [message("a\n b")], [], ""),
    ("an empty data line", "data\n\n", [message("")], [], ""),
    (
        "ids persist; NUL ids are ignored; an empty id resets",
        "id: 7\ndata: a\n\ndata: b\n\nid: 8\u0000x\ndata: c\n\nid\ndata: d\n\n",
        [
            message("a", "message", "7", True),
            message("b", "message", "7"),
            message("c", "message", "7"),
            message("d", "message", "", True),
        ],
        [],
        "",
    ),
    ("an id without data moves the position", "id: 9\n\ndata: e\n\n", [message("e", "message", "9")], [], "9"),
    ("retry: digits only", "retry: 1500\nretry: 1.5\nretry: x\nretry:\ndata: r\n\n", [message("r")], [1500], ""),
    ("one leading BOM is dropped", "\ufeffdata: bom\n\n", [message("bom")], [], ""),
    ("a second BOM is data", "\ufeff\ufeffdata: no\n\ndata: yes\n\n", [message("yes")], [], ""),
    ("unknown fields", "foo: bar\nidx: 3\ndata: x\n\n", [message("x")], [], ""),
    ("multi-byte UTF-8", "data: héllo ✓ 😀\n\n", [message("héllo ✓ 😀")], [], ""),
    (
        "an unfinished message at the end is dropped",
        "id: 1\ndata: done\n\nid: 2\ndata: partial\n",
        [message("done", "message", "1", True)],
        [],
        "1",
    ),
    (
        "the server's shape",
        "event: ping\n\n"
        'id: AQNk-_1\ndata: {"event":"workflow_started"}\n\n'
        'id: AQNk-_2\ndata: {"event":"text_chunk"}\n\nid: AQNk-_3\ndata: {"event":"workflow_finished"}\n\n',
        [
            message('{"event":"workflow_started"}', "message", "AQNk-_1", True),
            message('{"event":"text_chunk"}', "message", "AQNk-_2", True),
            message('{"event":"workflow_finished"}', "message", "AQNk-_3", True),
        ],
        [],
        "AQNk-_3",
    ),
]

# Runs in the page: every case whole, split in two at every byte, split in three at every pair of
# bytes (short cases), and one byte per chunk; returns what differs from the expectation.
PARSE_EVERY_WAY = """
async ([modulePath, cases]) => {
  const { parseSse } = await import(modulePath);
  const failures = [];
  let parses = 0;
  for (const [name, stream, messages, retries, lastEventId] of cases) {
    const want = JSON.stringify({ messages, retries, lastEventId });
    const bytes = new TextEncoder().encode(stream);
    const check = (how, chunks) => {
      parses++;
      const got = JSON.stringify(parseSse(chunks));
      if (got !== want) failures.push({ name, how, got, want });
    };
    check("whole", [bytes]);
    check("as text", [stream]);
    check("one byte per chunk", Array.from(bytes, (b) => Uint8Array.of(b)));
    for (let i = 0; i <= bytes.length; i++) check(`split at ${i}`, [bytes.slice(0, i), bytes.slice(i)]);
    if (bytes.length <= 80) {
      for (let i = 0; i <= bytes.length; i++)
        for (let j = i; j <= bytes.length; j++)
          check(`split at ${i} and ${j}`, [bytes.slice(0, i), bytes.slice(i, j), bytes.slice(j)]);
    }
  }
  return { failures: failures.slice(0, 5), count: failures.length, parses };
}
"""


def test_the_parser_follows_the_standard_however_the_stream_is_split(module_page: Page) -> None:
    result = module_page.evaluate(PARSE_EVERY_WAY, [MODULE_PATH, CASES])
    assert result["count"] == 0, result["failures"]
    assert result["parses"] == sum(map(ways_to_split, (case[1] for case in CASES)))  # every split really ran


def ways_to_split(stream: str) -> int:
    size = len(stream.encode())
    return 3 + (size + 1) + ((size + 1) * (size + 2) // 2 if size <= 80 else 0)


# A streaming POST cut in the middle of its third event, then a GET that resumes after the second:
# served by a fetch the test hands to the module, so the bytes on the wire are exactly these.
CUT_MID_MESSAGE = """
async (modulePath) => {
  const { streamRun } = await import(modulePath);
  const bodies = [
    ["event: ping\\n\\n", "retry: 40\\n\\n",
     'id: a\\ndata: {"event":"workflow_started"}\\n\\nid: b\\ndata: {"event":"te',
     'xt_chunk","data":{"text":"1"}}\\r\\n\\r', '\\nid: c\\ndata: {"event":"text_chunk","data":{"te'],
    [": resumed\\n\\nevent: ping\\n\\n", 'id: c\\ndata: {"event":"text_chunk","data":{"text":"2"}}\\n\\n',
     'id: d\\ndata: {"event":"workflow_finished","data":{"status":"succeeded"}}\\n\\n',
     'id: e\\ndata: {"event":"after_the_end"}\\n\\n'],
  ];
  const requests = [];
  const craftedFetch = async (url, init) => {
    requests.push({ url, method: init.method || "GET", headers: init.headers, body: init.body || null });
    const chunks = bodies[requests.length - 1];
    const encoder = new TextEncoder();
    const body = new ReadableStream({
      start(c) { for (const chunk of chunks) c.enqueue(encoder.encode(chunk)); c.close(); },
    });
    // Only the start's answer names the run, in its headers.
    const ids = requests.length === 1 ? { "X-Task-Id": "t1", "X-Workflow-Run-Id": "r1" } : {};
    return new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream", ...ids } });
  };
  const events = [];
  const reconnects = [];
  const run = streamRun({
    apiKey: "app-k", user: "u 1", inputs: { name: "Ada" }, fetch: craftedFetch,
    onEvent: (event, meta) => events.push([meta.id, event.event, meta.connection]),
    onReconnect: (info) => reconnects.push(info),
  });
  const outcome = await run.done;
  return { events, reconnects, requests, outcome, lastEventId: run.lastEventId, state: run.state };
}
"""


def test_a_stream_cut_mid_message_resumes_after_the_last_whole_event(module_page: Page) -> None:
    result = module_page.evaluate(CUT_MID_MESSAGE, MODULE_PATH)
    assert result["events"] == [
        ["a", "workflow_started", 0],
        ["b", "text_chunk", 0],
        ["c", "text_chunk", 1],
        ["d", "workflow_finished", 1],
    ]
    post, resume = result["requests"]
    assert post["method"] == "POST" and post["url"] == "/v1/workflows/run"
    assert post["headers"]["Authorization"] == "Bearer app-k"
    assert uuid.UUID(post["headers"]["Idempotency-Key"]).version == 4, "a fresh random key by default"
    assert post["body"] == '{"inputs":{"name":"Ada"},"response_mode":"streaming","user":"u 1"}'
    # Resumed by the run's workflow run id from the headers, strictly after the last whole event.
    assert resume["url"] == "/v1/workflow/r1/events?user=u+1"
    assert resume["headers"]["Last-Event-ID"] == "b" and resume["headers"]["Authorization"] == "Bearer app-k"
    (reconnect,) = result["reconnects"]
    assert reconnect["reason"] == "eof" and reconnect["lastEventId"] == "b" and reconnect["attempt"] == 1
    assert 20 <= reconnect["delayMs"] <= 40, "the server's retry: 40 is the backoff's base, jittered down to half"
    assert result["outcome"]["status"] == "finished" and result["outcome"]["lastEventId"] == "d"
    assert result["outcome"]["taskId"] == "t1" and result["outcome"]["workflowRunId"] == "r1"
    assert result["lastEventId"] == "d" and result["state"] == "finished"


# Runs in the page: ``scenario`` drives the module against answers scripted per request (``script``,
# in order: ``{status, headers, chunks, cut}`` or ``{reject: true}``); returns what it sent and got.
SCRIPTED = """
async ([modulePath, script, scenario, options]) => {
  const module = await import(modulePath);
  const requests = [];
  const encoder = new TextEncoder();
  const scriptedFetch = async (url, init = {}) => {
    requests.push({ url, method: init.method || "GET", headers: init.headers || {}, body: init.body || null });
    const answer = script[requests.length - 1];
    if (!answer || answer.reject) throw new TypeError("Failed to fetch");
    const body = new ReadableStream({
      start(c) {
        for (const chunk of answer.chunks || []) c.enqueue(encoder.encode(chunk));
        // A cut discards what was queued: the reader sees only the error.
        if (answer.cut) c.error(new TypeError("network error")); else c.close();
      },
    });
    return new Response(body, { status: answer.status || 200, headers: answer.headers || {} });
  };
  const events = [];
  const common = { apiKey: "app-k", user: "u1", fetch: scriptedFetch, initialDelayMs: 1, ...options,
                   onEvent: (event) => events.push(event.event) };
  try {
    if (scenario === "form") return { result: await module.submitForm(common), requests };
    const stream = scenario === "run" ? module.streamRun({ inputs: {}, ...common }) : module.followRun(common);
    const outcome = await stream.done;
    return { status: outcome.status, events, requests, taskId: stream.taskId, runId: stream.workflowRunId,
             replayed: stream.replayed, key: stream.idempotencyKey };
  } catch (error) {
    return { error: { name: error.name, message: error.message, status: error.status ?? null }, events, requests };
  }
}
"""
SSE = {"Content-Type": "text/event-stream"}
IDS = {**SSE, "X-Task-Id": "t1", "X-Workflow-Run-Id": "r1"}
STARTED = 'id: s\ndata: {"event":"workflow_started","data":{"reason":"initial"}}\n\n'
FINISHED = 'id: f\ndata: {"event":"workflow_finished","data":{"status":"succeeded"}}\n\n'


def scripted(page: Page, script: list[dict[str, Any]], scenario: str, **options: Any) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate(SCRIPTED, [MODULE_PATH, script, scenario, options])
    return result


def test_a_start_cut_before_its_first_event_resumes_from_the_beginning_by_the_header_ids(module_page: Page) -> None:
    script: list[dict[str, Any]] = [
        {"headers": IDS, "chunks": ["event: ping\n\n"], "cut": True},
        {"headers": SSE, "chunks": [STARTED, FINISHED]},
    ]
    result = scripted(module_page, script, "run")
    assert result["status"] == "finished" and result["events"] == ["workflow_started", "workflow_finished"]
    assert (result["taskId"], result["runId"]) == ("t1", "r1")
    _, resume = result["requests"]
    assert resume["url"] == "/v1/workflow/r1/events?user=u1&include_state_snapshot=true"
    assert "Last-Event-ID" not in resume["headers"]


def test_a_start_cut_before_its_answer_is_sent_again_with_the_same_key(module_page: Page) -> None:
    answer = {"headers": {**IDS, "Idempotent-Replayed": "true"}, "chunks": [STARTED, FINISHED]}
    result = scripted(module_page, [{"reject": True}, {"reject": True}, answer], "run")
    assert result["status"] == "finished" and result["replayed"] is True
    posts = result["requests"]
    assert [request["method"] for request in posts] == ["POST"] * 3
    assert {request["headers"]["Idempotency-Key"] for request in posts} == {result["key"]}

    # A key of the caller's own is sent as given; without one a start that may have arrived is not repeated.
    mine = scripted(module_page, [{"reject": True}, answer], "run", idempotencyKey="order-42")
    assert [request["headers"]["Idempotency-Key"] for request in mine["requests"]] == ["order-42"] * 2
    unkeyed = scripted(module_page, [{"reject": True}, answer], "run", idempotencyKey=False)
    assert unkeyed["error"]["name"] == "TypeError" and len(unkeyed["requests"]) == 1
    assert "Idempotency-Key" not in unkeyed["requests"][0]["headers"]


def test_a_first_attach_asks_for_the_run_from_its_beginning(module_page: Page) -> None:
    whole = [{"headers": SSE, "chunks": [STARTED, FINISHED]}]
    first = scripted(module_page, whole, "follow", workflowRunId="r1")
    assert first["requests"][0]["url"] == "/v1/workflow/r1/events?user=u1&include_state_snapshot=true"
    tail = scripted(module_page, whole, "follow", workflowRunId="r1", fromStart=False)
    assert tail["requests"][0]["url"] == "/v1/workflow/r1/events?user=u1"
    after = scripted(module_page, whole, "follow", taskId="t1", lastEventId="s", passport="pp")
    assert after["requests"][0]["url"] == "/api/workflow/t1/events?"
    assert after["requests"][0]["headers"]["Last-Event-ID"] == "s"


def test_a_form_is_submitted_by_its_token_with_its_first_action_by_default(module_page: Page) -> None:
    form = {"form_content": "", "inputs": [], "user_actions": [{"id": "yes", "title": "Yes"}, {"id": "no"}]}
    script: list[dict[str, Any]] = [
        {"headers": {"Content-Type": "application/json"}, "chunks": [json.dumps(form)]},
        {"chunks": ["{}"]},
    ]
    result = scripted(module_page, script, "form", formToken="tok/1", inputs={"approved": True})
    get, post = result["requests"]
    assert (get["method"], get["url"]) == ("GET", "/v1/form/human_input/tok%2F1")
    assert (post["method"], post["url"]) == ("POST", "/v1/form/human_input/tok%2F1")
    assert json.loads(post["body"]) == {"inputs": {"approved": True}, "action": "yes", "user": "u1"}
    web = scripted(module_page, [{"chunks": ["{}"]}], "form", formToken="t", inputs={}, action="no", passport="pp")
    (only,) = web["requests"]
    assert only["url"] == "/api/form/human_input/t" and json.loads(only["body"]) == {"inputs": {}, "action": "no"}


def test_the_module_is_served_and_the_demo_is_off_in_production(production_server: GunicornServer) -> None:
    module = requests.get(f"{production_server.url}{MODULE_PATH}", timeout=10)
    assert module.status_code == 200
    assert module.headers["Content-Type"].split(";")[0] in ("text/javascript", "application/javascript")
    assert module.content == (SOURCE / "resumable-events.js").read_bytes()
    for path in ("/demo", "/demo/demo.js", "/demo/demo.css"):
        answer = requests.get(f"{production_server.url}{path}", timeout=10)
        assert answer.status_code == 404, path
        assert answer.json()["code"] == "not_found"


def test_the_demo_is_a_404_page_in_the_browser_too(module_page: Page, production_server: GunicornServer) -> None:
    response = module_page.goto(f"{production_server.url}/demo")
    assert response is not None and response.status == 404
    assert "DEMO_PAGE_ENABLED" in module_page.content()


@pytest.mark.parametrize(
    ("settings", "served"),
    [
        ({"DEPLOY_ENV": "DEVELOPMENT"}, True),  # make run
        ({"DEPLOY_ENV": "DEVELOPMENT", "DEMO_PAGE_ENABLED": "false"}, False),
        ({"SECRET_KEY": DEPLOYMENT_SECRET}, False),  # production, the default
        ({"SECRET_KEY": DEPLOYMENT_SECRET, "DEPLOY_ENV": "TESTING"}, False),
        ({"SECRET_KEY": DEPLOYMENT_SECRET, "DEMO_PAGE_ENABLED": "true"}, True),
    ],
)
def test_the_demo_default_is_on_only_in_development(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], served: bool
) -> None:
    for name in ("SECRET_KEY", "DEMO_PAGE_ENABLED", "DEPLOY_ENV"):
        monkeypatch.delenv(name, raising=False)
    embedded = {
        "SQLALCHEMY_DATABASE_URI": f"sqlite:///{tmp_path / 'app.db'}",
        "DURABLE_STREAM_URL": f"sqlite:///{tmp_path / 'streams.db'}",
        "CELERY_BROKER_URL": "filesystem://",
    }
    config = AppConfig(VAR_DIR=tmp_path, **embedded, **settings)  # type: ignore[arg-type]
    assert config.demo_page_enabled() is served
    app = create_app(config)

    def status(path: str) -> int:
        with app.test_client().get(path) as response:  # a file response holds its file until closed
            return response.status_code

    try:
        assert status("/demo") == (200 if served else 404)
        assert status("/demo/demo.js") == (200 if served else 404)
        assert status("/demo/index.html") == 404  # only the listed assets
        assert status(MODULE_PATH) == 200
    finally:
        with app.app_context():
            app.extensions["durable_stream"].close()
