"""``dwe`` with real runs: ``--json`` lines, the live view as recorded by ``rich``, exit statuses."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import threading
import time

from durable_workflow_client import Client, HumanInputRequired
from durable_workflow_client.cli import main
from rich.console import Console

from harness.processes import ROOT
from harness.waiting import wait_until
from tests.sdk.conftest import Sdk


def dwe(*argv: str) -> tuple[int, str, str]:
    """Run ``dwe`` in-process; its exit status, standard output (as recorded) and standard error."""
    out = Console(record=True, width=110, file=io.StringIO(), color_system=None)
    err = Console(file=io.StringIO(), width=200, color_system=None)
    status = main(list(argv), console=out, errors=err)
    assert isinstance(err.file, io.StringIO)
    return status, out.export_text(), err.file.getvalue()


def test_json_lines_equal_the_stored_run_across_cut_connections(sdk: Sdk) -> None:
    rng = random.Random(3)
    with sdk.relay(cut_after=lambda: rng.randint(600, 6000), seed=3) as relay:
        status, out, err = dwe(
            "run", "--follow", "--json", "--base-url", relay.url, "--app-key", sdk.keys["slow"],
            "--inputs", '{"name": "Ada"}', "--retry-delay", "0.01",
        )  # fmt: skip
    assert status == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events == sdk.stored_events(events[0]["workflow_run_id"])
    notes = err.splitlines()
    assert len(notes) >= 3 and all(note.startswith("dwe: ↻ reconnected") for note in notes), notes


def open_form(sdk: Sdk, run_id: str, user: str) -> HumanInputRequired:
    """The form a paused run waits for, as its events (read from the beginning) announced it."""
    with Client(sdk.stack.urls[0], sdk.keys["greeting"]) as client:
        (form,) = [event for event in client.follow(run_id, user) if isinstance(event, HumanInputRequired)]
    return form


def test_the_live_view_through_a_pause_and_a_form(sdk: Sdk) -> None:
    base = ("--base-url", sdk.stack.urls[0], "--app-key", sdk.keys["greeting"])
    status, paused, _ = dwe("run", "--follow", "--until-pause", *base, "--inputs", '{"name": "Ada", "mood": "formal"}')
    assert status == 0
    assert "Draft a greeting" in paused and "Approve the greeting" in paused and "⏸ paused" in paused
    # No text before the pause: the formal draft reaches no end node (Dify's response filter streams none).
    assert "Hello Ada!" not in paused
    run_id = paused.split("--follow-run ")[1].split()[0]
    assert sdk.run_row(run_id)["status"] == "paused"
    form = open_form(sdk, run_id, "dwe")
    # The view names the form's token (the line may wrap anywhere, even inside it).
    assert f"dwesubmit-form{form.form_token}" in "".join(paused.split())

    status, shown, _ = dwe("form", form.form_token, "--json", *base)
    assert status == 0 and [action["id"] for action in json.loads(shown)["user_actions"]] == ["submit"]

    rng = random.Random(5)
    # Cuts after 2-4 KB: each cut lands inside the stream, yet leaves room for the model node's end (about
    # 1.9 KB with its SSE lines: graphon reports the prompts and the usage, as Dify does).
    with sdk.relay(cut_after=lambda: rng.randint(2000, 4000), seed=5) as relay:
        status, done, _ = dwe(
            "submit-form", form.form_token, "--inputs", '{"approved": "true"}', "--follow-run", run_id,
            "--retry-delay", "0.01", "--base-url", relay.url, "--app-key", sdk.keys["greeting"],
        )  # fmt: skip
    assert status == 0, done
    assert "✔ succeeded" in done and "(approved: true)" in done
    assert "↻ reconnected" in done, "the view should say it resumed"
    # Followed from the run's beginning: the nodes before the pause are shown too.
    for title in ("Draft a greeting", "Approve the greeting", "Formal end"):
        assert title in done

    status, _, err = dwe("submit-form", form.form_token, "--inputs", '{"approved": "true"}', *base)
    assert status == 4 and "412 human_input_form_submitted" in err


def test_resume_input_submits_a_paused_runs_form_by_the_run_id(sdk: Sdk) -> None:
    base = ("--base-url", sdk.stack.urls[1], "--app-key", sdk.keys["greeting"])
    status, started, _ = dwe("run", "--json", *base, "--inputs", '{"name": "Alias", "mood": "formal"}')
    run_id = json.loads(started)["workflow_run_id"]
    wait_until(lambda: sdk.run_row(run_id)["status"] == "paused", 30, "the run to pause")
    status, done, _ = dwe("resume-input", run_id, "--inputs", '{"approved": "false"}', "--follow", *base)
    assert status == 0 and "✔ succeeded" in done and "(approved: false)" in " ".join(done.split())


def test_the_terminal_view_waits_through_a_pause_with_a_spinner(sdk: Sdk) -> None:
    """In a terminal the view is live: the run pauses, the view waits (spinner), the form's submission ends it."""
    out = Console(record=True, width=110, file=io.StringIO(), force_terminal=True, color_system=None)
    statuses: list[int] = []
    argv = ["run", "--follow", "--base-url", sdk.stack.urls[0], "--app-key", sdk.keys["greeting"], "--user", "tty"]
    argv += ["--inputs", '{"name": "Tty", "mood": "formal"}']
    viewer = threading.Thread(target=lambda: statuses.append(main(argv, console=out, errors=out)))
    viewer.start()
    try:
        with Client(sdk.stack.urls[0], sdk.keys["greeting"]) as client:

            def paused_run() -> str | None:
                text = out.export_text(clear=False)
                return text.split("--follow-run ")[1].split()[0] if "waiting for human input" in text else None

            run_id = wait_until(paused_run, 30, "the view to show the pause")
            client.submit_form(open_form(sdk, run_id, "tty").form_token, "tty", {"approved": "true"})
    finally:
        viewer.join(timeout=30)
    assert statuses == [0]
    text = out.export_text()
    assert "Approve the greeting: approved (select), note (paragraph); actions: submit" in text
    assert "✔ succeeded" in text


def test_exit_statuses_for_failed_stopped_and_refused(sdk: Sdk) -> None:
    base = ("--base-url", sdk.stack.urls[1])
    status, out, _ = dwe("run", "--follow", *base, "--app-key", sdk.keys["failing"], "--inputs", '{"name": "X"}')
    assert status == 1 and "✘ failed" in out and "the model failed on purpose" in out

    status, started, _ = dwe("run", "--json", *base, "--app-key", sdk.keys["long"], "--inputs", '{"name": "Y"}')
    ids = json.loads(started)
    assert status == 0 and set(ids) == {"task_id", "workflow_run_id"}
    assert dwe("stop", ids["task_id"], *base, "--app-key", sdk.keys["long"])[0] == 0
    status, out, _ = dwe("follow", ids["task_id"], *base, "--app-key", sdk.keys["long"])
    assert status == 3 and "■ stopped" in out

    status, _, err = dwe("follow", ids["task_id"], *base, "--app-key", "app-wrong")
    assert status == 4 and "401" in err
    status, _, err = dwe("follow", "nope", *base, "--app-key", sdk.keys["long"])
    assert status == 4 and "404" in err

    # From the tail, a finished run is its end; by either id.
    status, tail, _ = dwe("follow", ids["workflow_run_id"], "--tail", "--json", *base, "--app-key", sdk.keys["long"])
    assert status == 3 and [json.loads(line)["event"] for line in tail.splitlines()] == ["workflow_finished"]

    # The same key starts one run: the second start answers with the first one's ids.
    key = ("--idempotency-key", f"cli-{ids['task_id']}", "--app-key", sdk.keys["long"], "--json")
    first = json.loads(dwe("run", *base, *key, "--inputs", '{"name": "K"}')[1])
    assert json.loads(dwe("run", *base, *key, "--inputs", '{"name": "K"}')[1]) == first
    dwe("stop", first["task_id"], *base, "--app-key", sdk.keys["long"])


def test_the_installed_console_script(sdk: Sdk) -> None:
    env = {**os.environ, "DWE_BASE_URL": sdk.stack.urls[0], "DWE_APP_KEY": sdk.keys["greeting"], "DWE_USER": "cli"}
    script = ROOT / ".venv" / "bin" / "dwe"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "durable_workflow_client.cli"]
    done = subprocess.run(
        [*command, "run", "--follow", "--json", "--inputs", '{"name": "Zed"}'],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["data"]["outputs"]["greeting"].startswith("Hello Zed!")
    assert events == sdk.stored_events(events[0]["workflow_run_id"])
    assert subprocess.run([*command, "stop", "x"], env={**env, "DWE_APP_KEY": ""}, check=False).returncode == 2


def test_help_lists_the_exit_codes() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "durable_workflow_client.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for code, meaning in (("0", "succeeded"), ("1", "failed"), ("3", "stopped"), ("5", "could not be reached")):
        assert any(line.split()[:1] == [code] and meaning in line for line in shown.splitlines()), shown


def test_an_unreachable_server_fails_within_seconds_with_an_accurate_count() -> None:
    from harness.processes import free_port

    attempts, max_delay = 4, 1.0
    began = time.monotonic()
    status, _, err = dwe(
        "run", "--follow", "--base-url", f"http://127.0.0.1:{free_port()}", "--app-key", "app-x",
        "--max-attempts", str(attempts), "--max-retry-delay", str(max_delay),
    )  # fmt: skip
    # Refused at once each time: the waits between the attempts (at most max_delay each) are all it takes.
    assert status == 5 and time.monotonic() - began < 2 * attempts * max_delay, err
    assert "gave up after 4 failed attempts" in err


def test_output_without_a_terminal_never_wraps_an_id(sdk: Sdk) -> None:
    env = {**os.environ, "DWE_BASE_URL": sdk.stack.urls[0], "DWE_APP_KEY": sdk.keys["greeting"], "COLUMNS": "40"}
    printed = subprocess.run(
        [sys.executable, "-m", "durable_workflow_client.cli", "run", "--inputs", '{"name": "Ada"}', "--follow"],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    header = printed.stdout.splitlines()[0]
    ids = header.split()
    assert header.startswith("run ") and len(ids[1]) == 36 and len(ids[3]) == 36, printed.stdout


def test_a_token_that_begins_with_a_dash_is_read_as_the_token() -> None:
    """URL-safe tokens may begin with "-"; argparse alone would take one for an unknown option and exit 2."""
    from harness.processes import free_port

    dead = ("--base-url", f"http://127.0.0.1:{free_port()}", "--app-key", "app-x", "--max-attempts", "1")
    shown = ("form", "-Wq3tokenXYZ_abcdefghi", "--json", *dead)
    submitted = ("submit-form", "--Wq3tokenXYZ_abcdefgh", "--inputs", "{}", *dead)
    for argv in (shown, submitted):
        status, _, err = dwe(*argv)
        assert status == 5, err  # reached the request (and found no server), not a usage error


def test_a_malformed_base_url_is_a_usage_error_without_a_single_attempt() -> None:
    for url in ("htp://127.0.0.1:5001", "127.0.0.1:5001", "http://", "http://127.0.0.1:port", "not a url"):
        began = time.monotonic()
        status, _, err = dwe("run", "--base-url", url, "--app-key", "app-x", "--retry-delay", "5")
        # A retry would have waited at least --retry-delay: there was none.
        assert status == 2 and time.monotonic() - began < 5, (url, status, err)
        assert "--base-url" in err and "attempt" not in err, err


def test_a_server_that_never_answers_is_given_up_within_the_read_timeouts() -> None:
    import socket

    held: list[socket.socket] = []
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept_and_say_nothing() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept_and_say_nothing, daemon=True)
    thread.start()
    read_timeout, attempts = 1.0, 3
    try:
        began = time.monotonic()
        status, _, err = dwe(
            "run", "--base-url", f"http://127.0.0.1:{listener.getsockname()[1]}", "--app-key", "app-x",
            "--read-timeout", str(read_timeout), "--max-attempts", str(attempts), "--max-retry-delay", "0.5",
        )  # fmt: skip
        took = time.monotonic() - began
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()
    assert status == 5 and f"gave up after {attempts} failed attempts" in err, err
    assert took < attempts * read_timeout + (attempts - 1) * 0.5 + 2, took
    # With the defaults the budget ends before a second read timeout does: two waits at most (about 30 s).
    from durable_workflow_client.cli.main import CLI_MAX_ELAPSED, CLI_READ_TIMEOUT

    assert CLI_MAX_ELAPSED < CLI_READ_TIMEOUT <= 15
