"""The demo page in a real headless Chromium against the app as deployed: ``gunicorn -k gevent`` (two
workers) and a Celery worker, reached through a TCP relay the test controls.

A run is started from the page; its connection is dropped three ways while the LLM node streams
(the page's button, the network cutting every connection, the API worker serving the stream killed);
the run pauses, the page's form (built from the event's field definitions and actions) is filled in
and submitted by its token, and the run resumes. What the page rendered must be the stored run
exactly: the same events in the same order, each id sealing that event's own position. The page can
also follow an existing run from its beginning, and a start cut before its answer is sent again with
the same ``Idempotency-Key`` and makes one run.
"""

from __future__ import annotations

import json
import pathlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import requests
from playwright.sync_api import Browser, Page, Request
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from sqlalchemy import select

from api.controllers.browser import MODULE_PATH
from api.models import App
from api.models.engine import db
from harness.app_env import base_env
from harness.served_stack import GunicornServer, ServedStack
from harness.tcp_relay import TcpRelay, http_response
from tests.app import examples
from tests.app.test_service_api import slow_greeting
from tests.browser.conftest import open_tokens, runs_with_input, stored_events, trim_topic

#: Long enough an LLM stream (12 s or more) for three cuts (about 1.5 s in all), each followed by more of it,
#: however far the page's rendering lags behind the server on a loaded machine (4 s was not: the run paused,
#: its stream ended, before the second cut).
TOKENS = 400
TOKEN_DELAY = 0.03
#: A deadline, not a pause: on a loaded 2-core machine the 400 tokens alone take well over their 12 s.
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedStack]:
    var_dir = tmp_path_factory.mktemp("browser")
    env = base_env(var_dir, DEMO_PAGE_ENABLED="true", SSE_PING_INTERVAL="1")
    with ServedStack(env, var_dir / "stack", servers=1, workers_per_server=2, celery_concurrency=4) as served:
        yield served


@pytest.fixture(scope="module")
def relay(stack: ServedStack) -> Iterator[TcpRelay]:
    with TcpRelay([("127.0.0.1", stack.servers[0].port)]) as relay:
        yield relay


def rendered_count(page: Page) -> int:
    count: int = page.eval_on_selector_all("#events li", "rows => rows.length")
    return count


def page_state(page: Page) -> str:
    """What the page shows, for a failure message."""
    notes = page.eval_on_selector_all("#notes li", "rows => rows.map(r => r.textContent)")
    return (
        f"state={page.text_content('#state')} events={rendered_count(page)} "
        f"reconnects={page.text_content('#reconnects')} notes={notes}"
    )


def wait_in_page(page: Page, condition: str, arg: Any, what: str) -> None:
    try:
        page.wait_for_function(condition, arg=arg, timeout=WAIT_MS)
    except PlaywrightTimeoutError:
        raise AssertionError(f"timed out after {WAIT_MS} ms waiting for {what}; {page_state(page)}") from None


def wait_for_events(page: Page, at_least: int) -> int:
    wait_in_page(page, "n => document.querySelectorAll('#events li').length >= n", at_least, f"{at_least} events")
    return rendered_count(page)


def wait_for_text(page: Page, selector: str, text: str) -> None:
    condition = "([selector, text]) => document.querySelector(selector).textContent === text"
    wait_in_page(page, condition, [selector, text], f"{selector} to read {text!r}")


def worker_holding(server: GunicornServer, client_ports: list[int]) -> int:
    """The gunicorn worker with an accepted connection from one of these (the relay's) ports."""
    for pid in server.worker_pids():
        for connection in psutil.Process(pid).net_connections("tcp"):
            if connection.raddr and connection.raddr.port in client_ports and connection.laddr.port == server.port:
                return pid
    raise AssertionError(f"no worker of {server.url} holds a connection from {client_ports}")


def test_the_demo_survives_three_cuts_and_renders_the_stored_run_exactly(
    page: Page, stack: ServedStack, relay: TcpRelay, tmp_path: pathlib.Path
) -> None:
    words = " ".join(f"word{i}" for i in range(TOKENS))
    key = stack.create_app(examples.shown_before_the_form(examples.greeting(), response=words, token_delay=TOKEN_DELAY))
    sent: list[str] = []
    page.on("request", lambda request: sent.append(f"{request.method} {request.url.removeprefix(relay.url)}"))
    page.goto(f"{relay.url}/demo")
    page.fill("#api-key", key)
    page.fill("#inputs", json.dumps({"name": "Ada", "mood": "formal"}))
    page.click("#start")

    # 1. The page's own button cuts the connection.
    seen = wait_for_events(page, 20)
    page.click("#drop")
    wait_for_text(page, "#reconnects", "1")
    seen = wait_for_events(page, seen + 20)
    # 2. The network cuts every connection the browser has, in the middle of the response.
    assert relay.cut_all() >= 1
    wait_for_text(page, "#reconnects", "2")
    seen = wait_for_events(page, seen + 20)
    # 3. The API worker serving the stream dies; the other one serves the reconnect.
    server = stack.servers[0]
    killed = server.kill_worker(worker_holding(server, relay.upstream_ports("/events")))
    wait_for_text(page, "#reconnects", "3")
    wait_for_events(page, seen + 20)

    # The run pauses for its human-input node; the page shows the form and resumes the run.
    wait_for_text(page, "#state", "paused")
    assert page.is_visible("#human-form")
    assert page.text_content("#pause-title") == "Approve the greeting"
    # Dify's form input types: the select's options, the paragraph's text.
    options = page.eval_on_selector_all("#human-approved option", "options => options.map(o => o.value)")
    assert options == ["true", "false"]
    assert page.eval_on_selector("#human-note", "e => e.tagName") == "TEXTAREA"
    page.select_option("#human-approved", "true")
    page.fill("#human-note", "fine")
    page.click("#human-action-submit")
    wait_for_text(page, "#state", "finished")

    run_id = page.text_content("#run-id")
    assert run_id and stack.run_row(run_id) is not None
    rows: list[list[str]] = page.eval_on_selector_all(
        "#events li", "rows => rows.map(r => [r.dataset.id, r.dataset.payload, r.dataset.connection])"
    )
    stored = stored_events(stack, run_id)
    assert [json.loads(payload) for _, payload, _ in rows] == [event for _, event in stored], (
        "the page shows other events than the stored run: lost, repeated or reordered"
    )
    assert open_tokens(stack, run_id, [token for token, _, _ in rows]) == [cursor for cursor, _ in stored]
    paused_at = next(i for i, (_, event) in enumerate(stored) if event["event"] == "workflow_paused")
    # Each cut happened while the LLM streamed: the first stream's events came over four connections.
    assert {connection for _, _, connection in rows[: paused_at + 1]} == {"0", "1", "2", "3"}
    assert stored[-1][1]["event"] == "workflow_finished" and stored[-1][1]["data"]["status"] == "succeeded"
    chunks = "".join(event["data"]["text"] for _, event in stored if event["event"] == "text_chunk")
    assert page.text_content("#text") == chunks and chunks.startswith("word0 word1")
    assert json.loads(page.text_content("#outputs") or "null") == stored[-1][1]["data"]["outputs"]
    notes = page.eval_on_selector_all("#notes li.reconnect", "rows => rows.map(r => r.textContent)")
    assert len(notes) == 3 and "(dropped)" in notes[0], notes
    assert killed not in server.worker_pids()
    # The form went by its token (the human_input_required event's), with the button's action.
    (form,) = [event for _, event in stored if event["event"] == "human_input_required"]
    assert f"POST /v1/form/human_input/{form['data']['form_token']}" in sent
    (filled,) = [event for _, event in stored if event["event"] == "human_input_form_filled"]
    assert filled["data"]["action_id"] == "submit"

    screenshot = tmp_path / "demo-page.png"
    page.screenshot(path=str(screenshot), full_page=True)
    print(f"\nscreenshot of the demo page: {screenshot}")


# Runs in the page: follow or start a run with the module and report how it ended.
SETTLE = """
async ([modulePath, call, { dropAfter = [], ...options }]) => {
  const module = await import(modulePath);
  const reconnects = [];
  const events = [];
  const stream = module[call]({
    ...options,
    onEvent: (event, meta) => {
      events.push([meta.id, event]);
      if (dropAfter.includes(events.length)) setTimeout(() => stream.drop(), 0);
    },
    onReconnect: (info) => reconnects.push({ reason: info.reason, delayMs: info.delayMs, attempt: info.attempt }),
  });
  try {
    const outcome = await stream.done;
    return { status: outcome.status, events, reconnects, taskId: stream.taskId, runId: stream.workflowRunId };
  } catch (error) {
    return {
      error: { name: error.name, status: error.status, code: error.code, run: error.run ?? null,
               attempts: error.attempts ?? null, cause: error.cause ? error.cause.name : null },
      events, reconnects,
    };
  }
}
"""


def site_code(stack: ServedStack, key: str) -> str:
    with stack.app.app_context():
        try:
            code: str = db.session.execute(select(App.site_code).where(App.api_key == key)).scalar_one()
            return code
        finally:
            db.session.remove()


def settle(page: Page, call: str, **options: Any) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate(SETTLE, [MODULE_PATH, call, options])
    return result


def test_errors_are_typed_and_retries_honour_retry_after(page: Page, stack: ServedStack, relay: TcpRelay) -> None:
    key = stack.create_app(slow_greeting(delay=0.001, tokens=5))
    page.goto(f"{relay.url}/demo")
    user = "typed-errors"

    wrong = settle(page, "streamRun", apiKey="app-wrong", user=user, inputs={"name": "Ada"})
    assert wrong["error"]["name"] == "UnauthorizedError" and wrong["error"]["status"] == 401

    run = settle(page, "streamRun", apiKey=key, user=user, inputs={"name": "Ada"})
    assert run["status"] == "finished" and run["reconnects"] == []
    stored = stored_events(stack, run["runId"])
    assert [event for _, event in run["events"]] == [event for _, event in stored]
    first_id = run["events"][0][0]
    follow = {"apiKey": key, "user": user, "taskId": run["taskId"], "workflowRunId": run["runId"]}

    unknown = settle(page, "followRun", **{**follow, "taskId": str(uuid.uuid4()), "workflowRunId": str(uuid.uuid4())})
    assert unknown["error"]["name"] == "NotFoundError" and unknown["error"]["status"] == 404
    forged = settle(page, "followRun", **follow, lastEventId="not-a-resume-token")
    assert forged["error"]["name"] == "BadRequestError" and forged["error"]["code"] == "invalid_resume_token"

    # A proxy in front answers 503 with Retry-After: the client waits that long, then resumes exactly.
    relay.refuse("/events", 1, http_response(503, "Service Unavailable", b"busy", {"Retry-After": "1"}))
    resumed = settle(page, "followRun", **follow, lastEventId=first_id)
    assert [event for _, event in resumed["events"]] == [event for _, event in stored[1:]]
    (retry,) = resumed["reconnects"]
    assert retry["reason"] == "http-503" and 1000 <= retry["delayMs"] <= 1500  # Retry-After, spread

    # Answered 503 every time: the budget (2 retries) runs out with a typed error.
    refused = relay.refused
    relay.refuse("/events", 3, http_response(503, "Service Unavailable", b"busy", {"Retry-After": "0"}))
    exhausted = settle(page, "followRun", **follow, lastEventId=first_id, maxRetries=2, initialDelayMs=10)
    assert exhausted["error"]["name"] == "RetryBudgetExceededError" and exhausted["error"]["attempts"] == 3
    assert exhausted["error"]["cause"] == "HttpError" and exhausted["events"] == []
    assert relay.refused == refused + 3

    # Retention removed the position: 410, carrying the run row so the outcome can still be shown.
    trim_topic(stack, run["runId"], keep_last=1)
    gone = settle(page, "followRun", **follow, lastEventId=first_id)
    assert gone["error"]["name"] == "RunGoneError" and gone["error"]["code"] == "resume_cursor_expired"
    assert gone["error"]["run"]["id"] == run["runId"] and gone["error"]["run"]["status"] == "succeeded"
    assert gone["events"] == []


def test_the_web_app_flavour_follows_a_run_with_a_passport(page: Page, stack: ServedStack, relay: TcpRelay) -> None:
    key = stack.create_app(slow_greeting(delay=0.005, tokens=200))
    page.goto(f"{relay.url}/demo")
    passport = page.evaluate(
        "async ([path, siteCode]) => (await (await import(path)).fetchPassport({ siteCode })).access_token",
        [MODULE_PATH, site_code(stack, key)],
    )
    run = settle(page, "streamRun", passport=passport, inputs={"name": "Ada"}, dropAfter=[10, 80])
    assert run["status"] == "finished", run.get("error")
    assert [info["reason"] for info in run["reconnects"]] == ["dropped", "dropped"]
    stored = stored_events(stack, run["runId"])
    assert [event for _, event in run["events"]] == [event for _, event in stored]
    assert open_tokens(stack, run["runId"], [token for token, _ in run["events"]]) == [cursor for cursor, _ in stored]
    row = stack.run_row(run["runId"])
    assert row is not None and row["end_user"].startswith("web-")


def test_the_demo_follows_an_existing_run_from_its_beginning(page: Page, stack: ServedStack, relay: TcpRelay) -> None:
    key = stack.create_app(slow_greeting(delay=0.001, tokens=20))
    answer = requests.post(
        f"{stack.urls[0]}/v1/workflows/run",
        json={"inputs": {"name": "Attach"}, "user": "demo-user", "response_mode": "blocking"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    run_id = answer.json()["workflow_run_id"]
    sent: list[str] = []
    page.on("request", lambda request: sent.append(request.url.removeprefix(relay.url)))
    page.goto(f"{relay.url}/demo")
    page.fill("#api-key", key)
    page.fill("#attach-id", run_id)
    page.click("#attach")
    wait_for_text(page, "#state", "finished")
    rows: list[str] = page.eval_on_selector_all("#events li", "rows => rows.map(r => r.dataset.payload)")
    assert [json.loads(payload) for payload in rows] == [event for _, event in stored_events(stack, run_id)]
    assert page.text_content("#task-id") == answer.json()["task_id"]
    assert f"/v1/workflow/{run_id}/events?user=demo-user&include_state_snapshot=true" in sent


def test_a_start_cut_before_its_answer_is_sent_again_and_makes_one_run(page: Page, stack: ServedStack) -> None:
    key = stack.create_app(slow_greeting(delay=0.001, tokens=20))
    armed = threading.Event()

    def budget() -> int | None:
        if armed.is_set():
            armed.clear()
            return 0  # the server reads the whole request; the browser gets no byte of the answer
        return None

    with TcpRelay([("127.0.0.1", stack.servers[0].port)], cut_after=budget) as cutting:
        posts: list[Request] = []
        page.on("request", lambda request: posts.append(request) if request.method == "POST" else None)
        page.goto(f"{cutting.url}/demo", wait_until="networkidle")
        cutting.cut_all("fin")  # the start then opens a connection of its own: the armed one
        armed.set()
        marker = f"browser-{uuid.uuid4()}"
        run = settle(page, "streamRun", apiKey=key, user="idempotent", inputs={"name": marker})
        assert cutting.cuts >= 1
    assert run["status"] == "finished", run.get("error")
    assert [info["reason"] for info in run["reconnects"]] == ["network"]
    keys = {request.headers["idempotency-key"] for request in posts}
    assert len(posts) == 2 and len(keys) == 1, "the start is sent again with the same key"
    assert [event for _, event in run["events"]] == [event for _, event in stored_events(stack, run["runId"])]
    assert runs_with_input(stack, "idempotent", marker) == 1


#: Cards and columns of the page that must fit the screen.
CARDS = ("#start-form", "#attach-form", "#status-bar", "#pause", "#text", "#nodes", "#events")
# Runs in the page: each card's box, and each control's that overflows the card it is in.
LAYOUT = """
(cards) => {
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.right]; };
  const overflowing = [];
  for (const selector of cards) {
    const card = document.querySelector(selector);
    if (!card || card.hidden || !card.offsetParent) continue;
    const [left, right] = box(card);
    for (const control of card.querySelectorAll("input, textarea, button, label, li, code")) {
      const [l, r] = box(control);
      if (l < left - 0.5 || r > right + 0.5) overflowing.push(`${selector} ${control.tagName}#${control.id}`);
    }
    if (left < 0 || right > window.innerWidth + 0.5) overflowing.push(`${selector} itself`);
  }
  return { overflowing, scrollWidth: document.documentElement.scrollWidth, width: window.innerWidth };
}
"""


def test_the_demo_fits_a_phone_and_shows_a_pause_as_paused(
    browser: Browser, stack: ServedStack, relay: TcpRelay, tmp_path: pathlib.Path
) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    page = context.new_page()
    try:
        key = stack.create_app(slow_greeting(delay=0.005, tokens=40))
        page.goto(f"{relay.url}/demo")
        page.fill("#api-key", key)
        page.click("#start")
        wait_for_text(page, "#state", "paused")
        layout = page.evaluate(LAYOUT, list(CARDS))
        assert layout["scrollWidth"] <= layout["width"], layout  # nothing cut off at the side
        assert layout["overflowing"] == [], layout["overflowing"]
        # The node that waits for the form says so.
        paused = page.eval_on_selector_all("#nodes li.status-paused", "rows => rows.map(r => r.textContent)")
        assert len(paused) == 1 and "paused" in paused[0] and "running" not in paused[0], paused
        before = page.eval_on_selector_all("#events li", "rows => rows.map(r => Number(r.dataset.connection))")
        page.select_option("#human-approved", "true")
        page.click("#human-action-submit")
        wait_for_text(page, "#state", "finished")
        after = page.eval_on_selector_all("#events li", "rows => rows.map(r => Number(r.dataset.connection))")
        # One count per run: the stream after the form goes on from the connections before it.
        assert min(after[len(before) :]) > max(before), (before, after)
        finished = page.eval_on_selector_all("#nodes li", "rows => rows.map(r => r.className)")
        assert "status-paused" not in finished and finished.count("status-succeeded") == len(finished), finished
        assert page.evaluate(LAYOUT, list(CARDS))["overflowing"] == []
        screenshot = tmp_path / "demo-page-390.png"
        page.screenshot(path=str(screenshot), full_page=True)
        print(f"\nscreenshot of the demo page at 390 px: {screenshot}")
    finally:
        context.close()
