"""The module as a browser runs it: its SSE parser against crafted streams split at every byte, its
resume loop against a stream cut in the middle of a message, and what a production server serves.

The server here is a real ``gunicorn -k gevent`` on production-like settings (its own
``SECRET_KEY``, no ``DEMO_PAGE_ENABLED``): it serves the module, and ``/demo`` is a 404.
"""

from __future__ import annotations

import pathlib
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


@pytest.fixture(scope="module")
def production_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornServer]:
    var_dir = tmp_path_factory.mktemp("production")
    env = base_env(var_dir, SECRET_KEY="a-deployment-secret")
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
        "event: ping\n\nevent: run_created\ndata: {}\n\ndata: plain\n\n",
        [message("{}", "run_created"), message("plain")],
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
        'event: run_created\ndata: {"task_id":"t"}\n\nevent: ping\n\n'
        'id: AQNk-_1\ndata: {"event":"workflow_started"}\n\n'
        'id: AQNk-_2\ndata: {"event":"text_chunk"}\n\nid: AQNk-_3\ndata: {"event":"workflow_finished"}\n\n',
        [
            message('{"task_id":"t"}', "run_created"),
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
    ['event: run_created\\ndata: {"event":"run_created","task_id":"t1","workflow_run_id":"r1"}\\n\\n',
     "retry: 40\\n\\n", 'id: a\\ndata: {"event":"workflow_started"}\\n\\nid: b\\ndata: {"event":"te',
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
    return new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } });
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
    assert post["body"] == '{"inputs":{"name":"Ada"},"response_mode":"streaming","user":"u 1"}'
    assert resume["url"] == "/v1/workflow/t1/events?user=u+1"
    assert resume["headers"]["Last-Event-ID"] == "b" and resume["headers"]["Authorization"] == "Bearer app-k"
    (reconnect,) = result["reconnects"]
    assert reconnect["reason"] == "eof" and reconnect["lastEventId"] == "b" and reconnect["attempt"] == 1
    assert 20 <= reconnect["delayMs"] <= 40, "the server's retry: 40 is the backoff's base, jittered down to half"
    assert result["outcome"]["status"] == "finished" and result["outcome"]["lastEventId"] == "d"
    assert result["outcome"]["taskId"] == "t1" and result["outcome"]["workflowRunId"] == "r1"
    assert result["lastEventId"] == "d" and result["state"] == "finished"


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
        ({}, True),  # make run: the built-in development SECRET_KEY
        ({"DEMO_PAGE_ENABLED": "false"}, False),
        ({"SECRET_KEY": "a-deployment-secret"}, False),
        ({"SECRET_KEY": "a-deployment-secret", "DEMO_PAGE_ENABLED": "true"}, True),
    ],
)
def test_the_demo_default_is_on_only_with_the_development_secret(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], served: bool
) -> None:
    for name in ("SECRET_KEY", "DEMO_PAGE_ENABLED"):
        monkeypatch.delenv(name, raising=False)
    config = AppConfig(VAR_DIR=tmp_path, **settings)  # type: ignore[arg-type]
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
