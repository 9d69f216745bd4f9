"""The policy of one execution attempt: watchdog, manual stop, pause, and the terminal event.

Every event of the attempt goes through :meth:`AppExecutionCoordinator.publish`, which appends it to
the run's topic. A terminal event (``workflow_finished`` with any status) is appended and then the
topic is sealed, so readers end cleanly; ``workflow_paused`` is appended without sealing because a
resumed attempt continues on the same topic. :meth:`finish` guarantees the topic never stays open
after an attempt that neither paused nor finished: it appends a synthetic ``workflow_started`` (if
this run never sent one) and ``workflow_finished(failed)``, then seals.

``before_end`` records the outcome in the run row before the final event is appended, so that the
row already holds it when a reader sees the end of the stream. Both writes of an end (the row's
and the topic's) are retried with backoff until ``end_deadline``: a stream store or database that
is away for a moment must not leave a run without its end. If the topic's end still cannot be
written, the row stays "end pending" and the repair writes it later. The end itself (append the
terminal event, seal) is written by :func:`.run_end.write_end`, as every end of a run is. A
non-terminal event whose append fails raises to the caller, which ends the attempt through
:meth:`finish`. A listener going away is not a cancellation: nothing here watches subscribers.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from api.core.durable_stream import (
    DurableStreamError,
    DurableStreamProducer,
    RepairingProducer,
    TopicInfo,
    TopicSealedError,
)
from api.core.workflow.engine import finished_event
from api.core.workflow.events import make_event
from api.libs import metrics

from .event_codec import encode_event, stamped
from .event_transport import WorkflowEventTransport
from .run_end import DeadlinePassedError, retry_until, write_end

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
    #: The run's end user (``created_by`` of its ``workflow_finished``), where known.
    end_user: str | None = None


class RunTakenOverError(Exception):
    """The run was ended by someone else (an expired lease was reaped): stop quietly."""


class AppExecutionCoordinator:
    def __init__(
        self,
        *,
        transport: WorkflowEventTransport,
        topic_name: str,
        run: RunIdentity,
        max_execution_time: float,
        stop_requested: Callable[[], bool],
        on_abort: Callable[[str], None] = lambda reason: None,
        before_end: Callable[[dict[str, Any]], bool] = lambda event: True,
        on_stream_ended: Callable[[TopicInfo | None], None] = lambda info: None,
        on_pause_lost: Callable[[str], None] = lambda error: None,
        started_sent: bool = False,
        stop_check_interval: float = 1.0,
        end_deadline: float = 30.0,
        repair_window: int = 0,
    ) -> None:
        self._transport = transport
        self._topic_name = topic_name
        # With a repair window, events a store failover lost are appended again before the next one.
        topic = transport.topic(topic_name)
        self._producer: DurableStreamProducer = topic.as_producer(repair_window=repair_window)
        self.run = run
        self._max_execution_time = max_execution_time
        self._stop_requested = stop_requested
        self._on_abort = on_abort
        self._before_end = before_end
        self._on_stream_ended = on_stream_ended
        self._on_pause_lost = on_pause_lost
        self._stop_check_interval = stop_check_interval
        self._end_deadline = end_deadline
        self._started_sent = started_sent
        self._lock = threading.Lock()
        self._state = AppExecutionState.RUNNING
        self._abort_reason: str | None = None
        self._last_stop_check = 0.0
        self._watchdog: threading.Timer | None = None
        self.steps = 0
        #: The run's tokens so far (kept up to date by the caller), for a failed end it writes itself.
        self.tokens = 0

    @property
    def state(self) -> AppExecutionState:
        return self._state

    @property
    def stream_progress(self) -> tuple[int, str] | None:
        """The (ordinal, digest) of the last event this attempt's producer appended, when it tracks them."""
        producer = self._producer
        position = producer.position if isinstance(producer, RepairingProducer) else None
        return None if position is None else (position.ordinal, position.digest)

    def start(self) -> None:
        if self._max_execution_time > 0:
            self._watchdog = threading.Timer(
                self._max_execution_time,
                self._watchdog_fired,
                args=(f"execution timed out after {self._max_execution_time:g} s",),
            )
            self._watchdog.daemon = True
            self._watchdog.start()

    def _watchdog_fired(self, reason: str) -> None:
        metrics.WATCHDOG_STOPS.tally.add(())
        self.request_abort(reason)

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
                try:
                    stop = self._stop_requested()
                except Exception:  # the database is away: a stop request waits until it is back
                    logger.warning("run %s: could not read the stop flag", self.run.workflow_run_id)
                    stop = False
                if stop:
                    self.request_abort("stopped by user")
        return self._abort_reason

    def publish(self, event: dict[str, Any]) -> None:
        """Append one event of the attempt.

        Raises:
            RunTakenOverError: Someone else ended the run; the attempt must stop quietly.
            DurableStreamUnavailableError: A non-terminal event could not be appended; end the
                attempt with :meth:`finish`.
        """
        name = event["event"]
        if name == "workflow_finished":
            self._end(event)
        elif name == "workflow_paused":
            self._pause(event)
        else:
            self._append(event)
            if name == "workflow_started":  # only once it is stored: else the failed end supplies one
                self._started_sent = True

    def finish(self, error: str | None = None) -> bool:
        """End the attempt; if it neither paused nor finished, publish a failed end. Returns whether it did."""
        self._cancel_watchdog()
        if self._state in (AppExecutionState.TERMINAL, AppExecutionState.PAUSED):
            return False
        reason = error or "the workflow ended without a terminal event"
        logger.warning("run %s ended without a terminal event: %s", self.run.workflow_run_id, reason)
        started = None
        if not self._started_sent:
            started = make_event(
                "workflow_started",
                task_id=self.run.task_id,
                workflow_run_id=self.run.workflow_run_id,
                data={
                    "id": self.run.workflow_run_id,
                    "workflow_id": self.run.app_id,
                    "inputs": {},
                    "created_at": int(self.run.created_at),
                    "reason": "initial",
                },
            )
        try:
            self._end(self.failed_event(reason), started=started)
        except RunTakenOverError:
            self._set_state(AppExecutionState.TERMINAL)
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
            tokens=self.tokens,
            created_at=self.run.created_at,
            user=self.run.end_user,
        )

    def _append(self, event: dict[str, Any]) -> None:
        try:
            self._producer.append(stamped(encode_event(event)))
        except TopicSealedError as exc:
            self._set_state(AppExecutionState.TERMINAL)
            raise RunTakenOverError(f"run {self.run.workflow_run_id} was already ended elsewhere") from exc

    def _record(self, event: dict[str, Any], deadline: float) -> None:
        """The row first: a reader that sees the end of the stream must find the outcome in the row."""
        run_id = self.run.workflow_run_id
        try:
            recorded = retry_until(deadline, lambda: self._before_end(event), what=f"record the end of run {run_id}")
        except DeadlinePassedError:
            # The row still says "running"; once the lease this attempt held expires, the reaper
            # ends the run as failed. Writing the topic's end now would contradict the row.
            self._set_state(AppExecutionState.TERMINAL)
            raise
        if not recorded:
            self._set_state(AppExecutionState.TERMINAL)
            raise RunTakenOverError(f"run {run_id} was already ended elsewhere")

    def _end(self, finished: dict[str, Any], started: dict[str, Any] | None = None) -> None:
        self._cancel_watchdog()
        deadline = time.monotonic() + self._end_deadline
        run_id = self.run.workflow_run_id
        try:
            self._record(finished, deadline)
        except DeadlinePassedError:
            logger.exception("run %s: its outcome could not be recorded; the reaper will end it", run_id)
            return
        tries = 0

        def write() -> None:
            nonlocal tries
            tries += 1
            # After a failure the append may have been stored: write_end looks before writing again.
            write_end(
                self._transport, self._topic_name, finished, started, first_try=tries == 1, producer=self._producer
            )

        try:
            retry_until(deadline, write, what=f"write the end of run {run_id}")
        except TopicSealedError as exc:
            self._set_state(AppExecutionState.TERMINAL)
            raise RunTakenOverError(f"run {run_id} was already ended elsewhere") from exc
        except DeadlinePassedError:
            logger.exception("run %s: its end is pending; the repair writes it when the stream is back", run_id)
            self._set_state(AppExecutionState.TERMINAL)
            return
        self._set_state(AppExecutionState.TERMINAL)
        info: TopicInfo | None = None
        try:
            # What the store holds at the end (sealed): the row keeps it, to prove the stream whole later.
            info = self._transport.topic_info(self._topic_name)
        except DurableStreamError:  # ended all the same; only the proof of its length is not recorded
            logger.warning("run %s: could not read its stream's final position", run_id)
        try:
            self._on_stream_ended(info)
        except Exception:  # the repair finds the topic sealed and records it then
            logger.exception("could not record that run %s's stream ended", run_id)

    def _pause(self, event: dict[str, Any]) -> None:
        self._cancel_watchdog()
        deadline = time.monotonic() + self._end_deadline
        run_id = self.run.workflow_run_id
        try:
            self._record(event, deadline)
        except DeadlinePassedError:
            logger.exception("run %s: its pause could not be recorded; the reaper will end it", run_id)
            return
        payload = encode_event(event)
        tries = 0

        def write() -> None:
            nonlocal tries
            tries += 1
            # A pause is the last event of its attempt: after a failure, look before writing again.
            if tries == 1 or self._transport.last_payload(self._topic_name) != payload:
                self._producer.append(stamped(payload))

        try:
            retry_until(deadline, write, what=f"write the pause of run {run_id}")
        except TopicSealedError as exc:
            self._set_state(AppExecutionState.TERMINAL)
            raise RunTakenOverError(f"run {run_id} was already ended elsewhere") from exc
        except DeadlinePassedError:
            # Readers could not learn of the pause, so the run must not wait for a form: it fails,
            # and the repair writes that end once the stream is back.
            logger.exception("run %s: its pause could not be written; the run fails", run_id)
            self._set_state(AppExecutionState.TERMINAL)
            self._on_pause_lost("the event stream was unavailable when the run paused")
            return
        self._set_state(AppExecutionState.PAUSED)

    def _set_state(self, state: AppExecutionState) -> None:
        with self._lock:
            self._state = state
        if state in (AppExecutionState.TERMINAL, AppExecutionState.PAUSED):
            self._cancel_watchdog()

    def _cancel_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
