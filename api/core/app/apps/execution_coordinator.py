"""The policy of one execution attempt: watchdog, manual stop, pause, and the terminal event.

Every event of the attempt goes through :meth:`AppExecutionCoordinator.publish`, which appends it to
the run's topic. A terminal event (``workflow_finished`` with any status) is appended and then the
topic is sealed, so readers end cleanly; ``workflow_paused`` is appended without sealing because a
resumed attempt continues on the same topic. :meth:`finish` guarantees the topic never stays open
after an attempt that neither paused nor finished: it appends a synthetic ``workflow_started`` (if
this run never sent one) and ``workflow_finished(failed)``, then seals.

``before_end`` runs before the final event is appended, so that the run row already holds the
outcome when a reader sees the end of the stream. A listener going away is not a cancellation:
nothing here watches subscribers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from api.core.durable_stream import DurableStreamProducer, TopicSealedError
from api.core.workflow.engine import finished_event
from api.core.workflow.events import make_event

from .event_transport import EventTopic

logger = logging.getLogger(__name__)


class AppExecutionState(enum.Enum):
    RUNNING = "running"
    PAUSED = "paused"
    ABORTING = "aborting"
    TERMINAL = "terminal"


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    app_id: str
    task_id: str
    workflow_run_id: str
    created_at: float


class RunTakenOverError(Exception):
    """The run's topic was sealed by someone else (an expired lease was reaped): stop quietly."""


class AppExecutionCoordinator:
    def __init__(
        self,
        *,
        topic: EventTopic,
        run: RunIdentity,
        max_execution_time: float,
        stop_requested: Callable[[], bool],
        on_abort: Callable[[str], None] = lambda reason: None,
        before_end: Callable[[dict[str, Any]], None] = lambda event: None,
        started_sent: bool = False,
        stop_check_interval: float = 1.0,
    ) -> None:
        self._topic = topic
        self._producer: DurableStreamProducer = topic.as_producer()
        self.run = run
        self._max_execution_time = max_execution_time
        self._stop_requested = stop_requested
        self._on_abort = on_abort
        self._before_end = before_end
        self._stop_check_interval = stop_check_interval
        self._started_sent = started_sent
        self._lock = threading.Lock()
        self._state = AppExecutionState.RUNNING
        self._abort_reason: str | None = None
        self._last_stop_check = 0.0
        self._watchdog: threading.Timer | None = None
        self.steps = 0

    @property
    def state(self) -> AppExecutionState:
        return self._state

    def start(self) -> None:
        if self._max_execution_time > 0:
            self._watchdog = threading.Timer(
                self._max_execution_time,
                self.request_abort,
                args=(f"execution timed out after {self._max_execution_time:g} s",),
            )
            self._watchdog.daemon = True
            self._watchdog.start()

    def request_abort(self, reason: str) -> None:
        """Ask the engine to stop at its next check. Runs at most once per attempt."""
        with self._lock:
            if self._abort_reason is not None or self._state in (AppExecutionState.TERMINAL, AppExecutionState.PAUSED):
                return
            self._abort_reason = reason
            self._state = AppExecutionState.ABORTING
        logger.info("aborting run %s: %s", self.run.workflow_run_id, reason)
        try:
            self._on_abort(reason)
        except Exception:
            logger.exception("could not record the abort of run %s", self.run.workflow_run_id)

    def should_stop(self) -> str | None:
        """The engine's check between nodes and tokens: the abort reason, or ``None`` to go on."""
        if self._abort_reason is None:
            now = time.monotonic()
            if now - self._last_stop_check >= self._stop_check_interval:
                self._last_stop_check = now
                if self._stop_requested():
                    self.request_abort("stopped by user")
        return self._abort_reason

    def publish(self, event: dict[str, Any]) -> None:
        name = event["event"]
        if name == "workflow_started":
            self._started_sent = True
        if name in ("workflow_finished", "workflow_paused"):
            # The run row is final before any reader can see the end of the stream.
            self._before_end(event)
        self._append(event)
        if name == "workflow_finished":
            self._terminate()
        elif name == "workflow_paused":
            self._set_state(AppExecutionState.PAUSED)

    def finish(self, error: str | None = None) -> bool:
        """End the attempt; if it neither paused nor finished, publish a failed end. Returns whether it did."""
        self._cancel_watchdog()
        if self._state in (AppExecutionState.TERMINAL, AppExecutionState.PAUSED):
            return False
        reason = error or "the workflow ended without a terminal event"
        logger.warning("run %s ended without a terminal event: %s", self.run.workflow_run_id, reason)
        with contextlib.suppress(RunTakenOverError):
            if not self._started_sent:
                self._append(
                    make_event(
                        "workflow_started",
                        task_id=self.run.task_id,
                        workflow_run_id=self.run.workflow_run_id,
                        data={"id": self.run.workflow_run_id, "workflow_id": self.run.app_id, "inputs": {}},
                    )
                )
                self._started_sent = True
            failed = self.failed_event(reason)
            self._before_end(failed)
            self._append(failed)
        self._terminate()
        return True

    def failed_event(self, error: str) -> dict[str, Any]:
        return finished_event(
            task_id=self.run.task_id,
            workflow_run_id=self.run.workflow_run_id,
            app_id=self.run.app_id,
            status="failed",
            outputs=None,
            error=error,
            steps=self.steps,
            created_at=self.run.created_at,
        )

    def _append(self, event: dict[str, Any]) -> None:
        try:
            self._producer.append(json.dumps(event, separators=(",", ":")).encode())
        except TopicSealedError as exc:
            self._set_state(AppExecutionState.TERMINAL)
            raise RunTakenOverError(f"run {self.run.workflow_run_id} was already ended elsewhere") from exc

    def _terminate(self) -> None:
        self._cancel_watchdog()
        self._topic.seal()
        self._set_state(AppExecutionState.TERMINAL)

    def _set_state(self, state: AppExecutionState) -> None:
        with self._lock:
            self._state = state
        if state in (AppExecutionState.TERMINAL, AppExecutionState.PAUSED):
            self._cancel_watchdog()

    def _cancel_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
