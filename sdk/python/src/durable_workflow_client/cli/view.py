"""The live view of one run: a node timeline with status and timing, the streaming text, and its state.

:class:`RunView` is fed the run's events and renders itself (``rich`` calls :meth:`RunView.__rich__`
on every refresh of a ``Live``); it holds no connection and knows nothing of resuming.
"""

from __future__ import annotations

import dataclasses
import json
import time

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from ..events import (
    Event,
    HumanInputFormFilled,
    HumanInputFormTimeout,
    HumanInputRequired,
    NodeFinished,
    NodeStarted,
    TextChunk,
    WorkflowFinished,
    WorkflowPaused,
    WorkflowStarted,
)
from ..forms import FormAction, FormInput, PauseReason

STATUS_STYLE = {"succeeded": "green", "failed": "red", "stopped": "yellow", "paused": "cyan", "running": "blue"}
STATUS_MARK = {"succeeded": "✔", "failed": "✘", "stopped": "■", "paused": "⏸"}
#: Lines of streamed text shown while the run goes on (all of it at the end).
TEXT_LINES = 8


@dataclasses.dataclass
class NodeRow:
    index: int
    node_id: str
    title: str
    node_type: str
    status: str = "running"
    started: float = dataclasses.field(default_factory=time.monotonic)
    elapsed: float | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class OpenForm:
    """A form the run waits for, as a ``human_input_required`` or a pause's reason describes it."""

    node_id: str
    title: str
    token: str
    inputs: list[FormInput]
    actions: list[FormAction]

    @classmethod
    def of(cls, request: HumanInputRequired | PauseReason) -> OpenForm:
        title = request.node_title or request.node_id
        return cls(request.node_id, title, request.form_token, request.inputs, request.actions)

    def describe(self) -> str:
        fields = ", ".join(
            f"{field.output_variable_name} ({field.type}{'' if field.required else ', optional'})"
            for field in self.inputs
        )
        actions = ", ".join(action.id for action in self.actions)
        return f"{self.title}: {fields or 'no fields'}; actions: {actions or '-'}"

    def command(self, run_id: str | None) -> str:
        follow = f" --follow-run {run_id}" if run_id else ""
        return f"dwe submit-form {self.token} --inputs '{{…}}'{follow}"


class RunView:
    """What the run looks like so far."""

    def __init__(self) -> None:
        self.task_id: str | None = None
        self.run_id: str | None = None
        self.nodes: dict[str, NodeRow] = {}
        self.text = ""
        #: ``running``, ``paused``, or the final status.
        self.status = "running"
        self.finished: WorkflowFinished | None = None
        #: The forms the run waits for, by node.
        self.forms: dict[str, OpenForm] = {}
        self.events = 0
        self.reconnects = 0
        #: The stream is over: the live state line gives way to :meth:`final_line`.
        self.settled = False

    def add(self, event: Event) -> None:
        self.events += 1
        self.task_id = self.task_id or event.task_id or None
        self.run_id = self.run_id or event.workflow_run_id or None
        if isinstance(event, WorkflowStarted):
            self.status = "running"
        elif isinstance(event, NodeStarted):
            row = self.nodes.get(event.execution_id)
            if row is None:
                row = NodeRow(event.index, event.node_id, event.title or event.node_id, event.node_type)
                self.nodes[event.execution_id] = row
            row.status, self.status = "running", "running"
        elif isinstance(event, NodeFinished):
            row = self.nodes.setdefault(
                event.execution_id, NodeRow(event.index, event.node_id, event.title or event.node_id, event.node_type)
            )
            row.status, row.elapsed, row.error = event.status, event.elapsed_time, event.error
            self.forms.pop(event.node_id, None)
        elif isinstance(event, TextChunk):
            self.text += event.text
        elif isinstance(event, HumanInputRequired):
            self.forms[event.node_id] = OpenForm.of(event)
        elif isinstance(event, HumanInputFormFilled | HumanInputFormTimeout):
            self.forms.pop(event.node_id, None)
        elif isinstance(event, WorkflowPaused):
            self.status = "paused"
            for reason in event.reasons:
                self.forms.setdefault(reason.node_id, OpenForm.of(reason))
            for row in self.nodes.values():
                if row.node_id in event.paused_nodes and row.status == "running":
                    row.status = "paused"
        elif isinstance(event, WorkflowFinished):
            self.status, self.finished = event.status or "failed", event
            for row in self.nodes.values():
                if row.status in ("running", "paused"):
                    row.status = event.status

    def _timeline(self) -> Table:
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        table.add_column("#", justify="right")
        table.add_column("node")
        table.add_column("type", style="dim")
        table.add_column("status")
        table.add_column("time", justify="right")
        for row in sorted(self.nodes.values(), key=lambda row: row.index):
            elapsed = row.elapsed if row.elapsed is not None else time.monotonic() - row.started
            status: RenderableType
            if row.status == "running" and self.finished is None:
                status = Spinner("dots", text=Text("running", style="blue"))
            else:
                mark = STATUS_MARK.get(row.status, "?")
                status = Text(f"{mark} {row.status}", style=STATUS_STYLE.get(row.status, ""))
            table.add_row(str(row.index), row.title, row.node_type, status, f"{elapsed:.2f} s")
        return table

    def _state(self) -> RenderableType:
        if self.status == "paused":
            hint = "waiting for human input"
            for form in self.forms.values():
                hint += f"\n  {form.describe()}\n  {form.command(self.run_id)}"
            return Spinner("clock", text=Text(hint, style="cyan"))
        return Spinner("dots", text=Text(f"running · {self.events} events", style="blue"))

    def __rich__(self) -> RenderableType:
        parts: list[RenderableType] = [Text(f"run {self.run_id or '…'}  task {self.task_id or '…'}", style="dim")]
        if self.nodes:
            parts.append(self._timeline())
        if self.text:
            lines = self.text.splitlines() or [""]
            shown = "\n".join(lines if self.finished is not None else lines[-TEXT_LINES:])
            # Not expanded: without a terminal the console is as wide as the longest line.
            parts.append(Panel(Text(shown), title="text", title_align="left", border_style="dim", expand=False))
        if not self.settled:  # then the final status is printed once, after the view
            parts.append(self._state())
        return Group(*parts)

    def final_line(self) -> Text:
        finished = self.finished
        if finished is None:
            if self.status == "paused":
                commands = [form.command(self.run_id) for form in self.forms.values()]
                hint = " or ".join(commands) or f"dwe resume-input {self.run_id} --inputs '{{…}}'"
                return Text(f"⏸ paused: submit the form with {hint}", style="cyan")
            return Text("? the stream ended before the run did", style="yellow")
        style = STATUS_STYLE.get(finished.status, "red")
        line = Text(f"{STATUS_MARK.get(finished.status, '✘')} {finished.status}", style=f"bold {style}")
        line.append(f" in {finished.elapsed_time:.2f} s, {finished.total_steps} steps, {finished.total_tokens} tokens")
        if finished.outputs:
            line.append(f"\noutputs: {json.dumps(finished.outputs, ensure_ascii=False)}")
        if finished.error:
            line.append(f"\nerror: {finished.error}", style=style)
        return line
