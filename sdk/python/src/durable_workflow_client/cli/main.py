"""``dwe``: run, follow, stop and resume workflow runs from a terminal or a script.

Exit status: 0 the run succeeded (or the command did what it was asked), 1 the run failed, 3 it was
stopped, 4 the API refused the request (the error is printed), 5 the connection could not be
re-established within the retry budget, 6 the stream ended with the run paused (``--until-pause``
ends there with 0), 2 a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.live import Live

from ..common import ReconnectInfo
from ..errors import ApiError, ClientError, ConnectionLostError
from ..events import Event, WorkflowFinished
from ..forms import HumanInputForm
from ..protocol import IdempotencyKey
from ..retry import RetryPolicy
from ..sync_client import Client, EventStream
from .view import RunView

#: Columns of output that is not a terminal's: wide enough that nothing is ever wrapped.
UNWRAPPED = 100_000
#: Seconds of consecutive failures (from the first one's end) after which the CLI gives up.
CLI_MAX_ELAPSED = 10.0
#: Seconds without a byte after which the CLI counts a connection as dead: one and a half of the server's
#: pings (every 10 s by default). With ``CLI_MAX_ELAPSED``, a server that accepts and never answers is given
#: up after two such waits (about 30 s), not the library's minutes.
CLI_READ_TIMEOUT = 15.0
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED, EXIT_API_ERROR, EXIT_LOST, EXIT_PAUSED = 0, 1, 2, 3, 4, 5, 6
DEFAULT_BASE_URL = "http://127.0.0.1:5001"
EXIT_CODES = """exit status:
  0  the run succeeded (or the command did what it was asked)
  1  the run failed
  2  a usage error
  3  the run was stopped
  4  the API refused the request (the error is printed)
  5  the server could not be reached (again) within --max-attempts
  6  the stream ended with the run paused (--until-pause ends there with 0)"""


def _inputs(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--base-url", default=os.environ.get("DWE_BASE_URL", DEFAULT_BASE_URL), help="$DWE_BASE_URL")
    common.add_argument("--app-key", default=os.environ.get("DWE_APP_KEY"), help="the app's API key ($DWE_APP_KEY)")
    common.add_argument("--user", default=os.environ.get("DWE_USER", "dwe"), help="the end user ($DWE_USER)")
    common.add_argument("--json", action="store_true", help="one JSON event per line instead of the live view")
    common.add_argument(
        "--max-attempts", type=int, default=8, help="failed attempts in a row (the first included) before giving up"
    )
    common.add_argument("--retry-delay", type=float, default=0.25, help="seconds before the first retry")
    common.add_argument(
        "--read-timeout",
        type=float,
        default=CLI_READ_TIMEOUT,
        help=f"seconds without a byte before a connection counts as dead (default {CLI_READ_TIMEOUT:g})",
    )
    common.add_argument(
        "--max-retry-delay", type=float, default=1.0, help="the longest wait between attempts (default 1 s)"
    )
    follow = argparse.ArgumentParser(add_help=False)
    follow.add_argument("--until-pause", action="store_true", help="end at a pause instead of waiting through it")

    top = argparse.ArgumentParser(
        prog="dwe",
        description="Run and follow durable workflow runs.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", parents=[common, follow], help="start a run")
    run.add_argument("--inputs", type=_inputs, default={}, help='e.g. \'{"name": "Ada"}\'')
    run.add_argument("--follow", action="store_true", help="show its events to the end (else print its ids)")
    keys = run.add_mutually_exclusive_group()
    keys.add_argument("--idempotency-key", help="a key of your own (default: a fresh one): the same key starts one run")
    keys.add_argument("--no-idempotency-key", action="store_true", help="send none (a cut start is then not resent)")
    attach = commands.add_parser("follow", parents=[common, follow], help="follow a run's events")
    attach.add_argument("run_id", help="the workflow run id (or the task id)")
    position = attach.add_mutually_exclusive_group()
    position.add_argument("--after", help="a resume token: continue strictly after that event")
    position.add_argument("--tail", action="store_true", help="from what happens next, not from the run's beginning")
    stop = commands.add_parser("stop", parents=[common], help="stop a run")
    stop.add_argument("task_id")
    form = commands.add_parser("form", parents=[common], help="show a human-input form")
    form.add_argument("form_token")
    submit = commands.add_parser("submit-form", parents=[common, follow], help="submit a human-input form")
    submit.add_argument("form_token")
    submit.add_argument("--inputs", type=_inputs, required=True)
    submit.add_argument("--action", help="the action (button) to submit with (default: the form's first)")
    submit.add_argument("--follow-run", metavar="RUN_ID", help="then follow that run to its end")
    resume = commands.add_parser("resume-input", parents=[common, follow], help="submit a paused run's open form")
    resume.add_argument("run_id")
    resume.add_argument("--inputs", type=_inputs, required=True)
    resume.add_argument("--action", help="the action (button) to submit with (default: the form's first)")
    resume.add_argument("--follow", action="store_true", help="then follow the run to its end")
    return top


#: Commands whose first argument is a token: URL-safe tokens may begin with "-", which argparse takes for an option.
TOKEN_COMMANDS = frozenset({"form", "submit-form"})
#: What our options look like; a 22-character token of lowercase letters and hyphens only is not worth a rule.
OPTION = re.compile(r"-h|--[a-z][a-z-]*(=.*)?", re.DOTALL)


def _token_last(argv: list[str]) -> list[str]:
    """Moves a token that looks like an option behind ``--`` so argparse reads it as the positional it is."""
    if len(argv) < 2 or argv[0] not in TOKEN_COMMANDS or not argv[1].startswith("-") or "--" in argv:
        return argv
    if OPTION.fullmatch(argv[1]):
        return argv
    return [argv[0], *argv[2:], "--", argv[1]]


def main(argv: Sequence[str] | None = None, *, console: Console | None = None, errors: Console | None = None) -> int:
    """The CLI; returns the exit status (the console script exits with it)."""
    args = parser().parse_args(_token_last(sys.argv[1:] if argv is None else list(argv)))
    # Without a terminal nothing is wrapped: an id cut in two cannot be copied or grepped.
    out = console or (Console() if sys.stdout.isatty() else Console(width=UNWRAPPED, soft_wrap=True))
    err = errors or Console(stderr=True)
    if not args.app_key:
        err.print("dwe: an API key is required (--app-key or DWE_APP_KEY)")
        return EXIT_USAGE
    problem = _url_problem(args.base_url)
    if problem is not None:  # no attempt could ever succeed: nothing to retry
        err.print(f"dwe: --base-url {args.base_url!r} {problem}", markup=False)
        return EXIT_USAGE
    if not args.read_timeout > 0:
        err.print("dwe: --read-timeout must be a positive number of seconds")
        return EXIT_USAGE
    notes: list[ReconnectInfo] = []
    # A person waits at a terminal: give an unreachable server a few seconds, not the library's minutes.
    retry = RetryPolicy(
        max_attempts=args.max_attempts,
        initial_delay=args.retry_delay,
        max_delay=max(args.max_retry_delay, args.retry_delay),
        max_elapsed=CLI_MAX_ELAPSED,
    )
    client = Client(args.base_url, args.app_key, retry=retry, read_timeout=args.read_timeout, on_reconnect=notes.append)
    try:
        with client:
            return _command(args, client, out, err, notes)
    except ConnectionLostError as exc:
        err.print(f"dwe: connection lost: {exc}", markup=False)
        if exc.last_event_id:
            err.print(f"dwe: continue with: dwe follow <task_id> --after {exc.last_event_id}", markup=False)
        return EXIT_LOST
    except ApiError as exc:
        err.print(f"dwe: {exc.status} {exc.code}: {exc.message}", markup=False)
        return EXIT_API_ERROR
    except ClientError as exc:
        err.print(f"dwe: {exc}", markup=False)
        return EXIT_API_ERROR
    except KeyboardInterrupt:
        return 130


def _url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the API's address, or ``None``."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (a port that is not a number raises here)
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http:// or https:// URL with a host"
    return None


def _command(args: argparse.Namespace, client: Client, out: Console, err: Console, notes: list[ReconnectInfo]) -> int:
    continue_on_pause = not getattr(args, "until_pause", False)
    # Following a run shows it from its beginning unless asked otherwise (the server's default is its tail).
    if args.command == "run":
        key: IdempotencyKey = False if args.no_idempotency_key else args.idempotency_key
        if not args.follow:
            handle = client.start(args.inputs, args.user, idempotency_key=key)
            _print_json_or(out, args.json, {"task_id": handle.task_id, "workflow_run_id": handle.workflow_run_id})
            return EXIT_OK
        stream = client.run(args.inputs, args.user, continue_on_pause=continue_on_pause, idempotency_key=key)
    elif args.command == "follow":
        stream = client.follow(
            args.run_id, args.user, after=args.after, continue_on_pause=continue_on_pause, from_start=not args.tail
        )
    elif args.command == "stop":
        client.stop(args.task_id, args.user)
        _print_json_or(out, args.json, {"result": "success", "task_id": args.task_id})
        return EXIT_OK
    elif args.command == "form":
        _print_form(out, args.json, client.get_form(args.form_token))
        return EXIT_OK
    elif args.command == "submit-form":
        client.submit_form(args.form_token, args.user, args.inputs, args.action)
        if not args.follow_run:
            _print_json_or(out, args.json, {"result": "success", "form_token": args.form_token})
            return EXIT_OK
        stream = client.follow(args.follow_run, args.user, continue_on_pause=continue_on_pause)
    else:
        accepted = client.submit_human_input(args.run_id, args.user, args.inputs, action=args.action)
        if not args.follow:
            body = {"task_id": accepted.task_id, "workflow_run_id": accepted.workflow_run_id, "status": accepted.status}
            _print_json_or(out, args.json, body)
            return EXIT_OK
        stream = client.follow(accepted.workflow_run_id, args.user, continue_on_pause=continue_on_pause)
    return _show(stream, out, err, notes, as_json=args.json, until_pause=not continue_on_pause)


def _print_form(out: Console, as_json: bool, form: HumanInputForm) -> None:
    if as_json:
        out.print_json(json.dumps(dataclasses.asdict(form)), indent=None)
        return
    lines = [form.form_content] if form.form_content else []
    for field in form.inputs:
        optional = "" if field.required else ", optional"
        default = f" = {json.dumps(field.default_value)}" if field.default is not None else ""
        lines.append(f"field {field.output_variable_name} ({field.type}{optional}){default}: {field.label}")
    lines += [f"action {action.id}: {action.title}" for action in form.user_actions]
    lines.append(f"expires at {form.expiration_time} (Unix seconds)")
    out.print("\n".join(lines), markup=False, highlight=False)


def _print_json_or(out: Console, as_json: bool, body: dict[str, Any]) -> None:
    if as_json:
        out.print_json(json.dumps(body), indent=None)
    else:
        out.print(" ".join(f"{key}: {value}" for key, value in body.items()), markup=False, highlight=False)


def _show(
    stream: EventStream, out: Console, err: Console, notes: list[ReconnectInfo], *, as_json: bool, until_pause: bool
) -> int:
    view = RunView()
    shown = 0

    def note_reconnects(say: Callable[[str], None]) -> None:
        nonlocal shown
        while shown < len(notes):
            info = notes[shown]
            shown += 1
            view.reconnects += 1
            say(f"↻ reconnected (connection lost: {type(info.error).__name__}; resumed after {view.events} events)")

    with stream:
        if as_json:
            for event in stream:
                note_reconnects(lambda line: err.print(f"dwe: {line}", markup=False, highlight=False))
                _write_line(out, event)
                view.add(event)
            note_reconnects(lambda line: err.print(f"dwe: {line}", markup=False, highlight=False))
        elif out.is_terminal:
            with Live(view, console=out, refresh_per_second=12) as live:
                for event in stream:
                    note_reconnects(lambda line: live.console.print(line, style="yellow", markup=False))
                    view.add(event)
                note_reconnects(lambda line: live.console.print(line, style="yellow", markup=False))
                view.settled = True
            out.print(view.final_line())
        else:  # a pipe or a file: no animation, the notes as they happen and the view once at the end
            for event in stream:
                note_reconnects(lambda line: out.print(line, style="yellow", markup=False))
                view.add(event)
            note_reconnects(lambda line: out.print(line, style="yellow", markup=False))
            view.settled = True
            out.print(view)
            out.print(view.final_line())
    return _exit_status(view, until_pause)


def _write_line(out: Console, event: Event) -> None:
    # Plain and unwrapped (no markup, highlighting or wrapping): exactly the event as the server sent it.
    out.out(json.dumps(event.raw, ensure_ascii=False, separators=(",", ":")), highlight=False)


def _exit_status(view: RunView, until_pause: bool) -> int:
    finished: WorkflowFinished | None = view.finished
    if finished is None:
        return EXIT_OK if view.status == "paused" and until_pause else EXIT_PAUSED
    return {"succeeded": EXIT_OK, "stopped": EXIT_STOPPED}.get(finished.status, EXIT_FAILED)


def console_script() -> None:
    sys.exit(main())
