"""The API's JSON objects other than events and forms: a run's row, a started run, an accepted human input."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .forms import PauseReason, pause_reasons

#: Statuses a run never leaves.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "stopped"})


@dataclasses.dataclass(frozen=True, slots=True)
class RunDetail:
    """A run's row (``GET /v1/workflows/run/<id>``, the ``data`` of a blocking answer, the ``run`` of a 410)."""

    id: str
    workflow_id: str
    status: str
    inputs: dict[str, Any]
    outputs: dict[str, Any] | None
    error: str | None
    total_steps: int
    total_tokens: int
    elapsed_time: float
    created_at: int
    finished_at: int | None
    #: A paused blocking answer only: the nodes waiting for input and their open forms.
    paused_nodes: list[str] = dataclasses.field(default_factory=list)
    reasons: list[PauseReason] = dataclasses.field(default_factory=list)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> RunDetail:
        return cls(
            id=str(body["id"]),
            workflow_id=str(body.get("workflow_id", "")),
            status=str(body["status"]),
            inputs=_inputs(body.get("inputs")),
            outputs=body.get("outputs"),
            error=body.get("error"),
            total_steps=int(body.get("total_steps") or 0),
            total_tokens=int(body.get("total_tokens") or 0),
            elapsed_time=float(body.get("elapsed_time") or 0.0),
            created_at=int(body.get("created_at") or 0),
            finished_at=None if body.get("finished_at") is None else int(body["finished_at"]),
            paused_nodes=[str(node) for node in nodes] if isinstance(nodes := body.get("paused_nodes"), list) else [],
            reasons=pause_reasons(body.get("reasons")),
        )


def _inputs(value: Any) -> dict[str, Any]:
    """A run's inputs: a run's detail sends them as JSON text (as Dify does), a blocking answer not at all."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return dict(value) if isinstance(value, dict) else {}


@dataclasses.dataclass(frozen=True, slots=True)
class RunHandle:
    """A run started without waiting (``response_mode: async``): the ids to follow, stop or resume it."""

    task_id: str
    workflow_run_id: str
    #: The server answered for a run an earlier request with the same ``Idempotency-Key`` started.
    replayed: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class HumanInputAccepted:
    """The answer to a submitted human-input form: the run is queued again (``status`` ``running``)."""

    task_id: str
    workflow_run_id: str
    status: str


@dataclasses.dataclass(frozen=True, slots=True)
class Passport:
    """A web end user's session for one app (``GET /api/passport``)."""

    access_token: str
    end_user: str


@dataclasses.dataclass(frozen=True, slots=True)
class RunOutcome:
    """A run that was waited for (``response_mode: blocking``): finished or paused."""

    task_id: str
    workflow_run_id: str
    run: RunDetail
    #: The server answered for a run an earlier request with the same ``Idempotency-Key`` started.
    replayed: bool = False
