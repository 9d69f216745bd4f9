"""A stop through graphon's command channel on the real Redis: the abort another process sends reaches the
running engine's model between two chunks, with no stop flag polled."""

from __future__ import annotations

import threading
import time
import uuid

import redis

from api.core.workflow import ModelSettings, WorkflowEngine
from api.core.workflow.commands import command_key, redis_channel, send_abort
from harness.services import redis_url
from tests.app import examples


def test_an_abort_sent_to_the_redis_channel_stops_the_model_mid_stream() -> None:
    client = redis.Redis.from_url(redis_url(0))
    run_id = f"commands-{uuid.uuid4().hex}"
    delay = 0.05  # the test's own token delay: the stop must land within one token, a poll and 100 ms
    slow = examples.script_model(examples.greeting(), response=" ".join(f"w{i}" for i in range(400)), token_delay=delay)
    engine = WorkflowEngine(
        examples.graph_of(slow),
        app_id="app",
        task_id="task",
        workflow_run_id=run_id,
        inputs={"name": "Ada"},
        user="u",
        created_at=time.time(),
        models=ModelSettings(),
        command_channel=redis_channel(client, run_id),
    )
    sent_at: list[float] = []
    events = []
    try:
        for event in engine.run():
            events.append(event)
            if event["event"] == "text_chunk" and not sent_at:
                # Another client, as the API process that takes the stop.
                other = redis.Redis.from_url(redis_url(0))
                threading.Thread(target=send_abort, args=(other, run_id, "stopped by user")).start()
                sent_at.append(time.monotonic())
        ended = time.monotonic()
    finally:
        client.delete(command_key(run_id), f"{command_key(run_id)}:pending")
    assert events[-1]["data"]["status"] == "stopped" and events[-1]["data"]["error"] == "stopped by user"
    assert sum(e["event"] == "text_chunk" for e in events) < 20
    assert ended - sent_at[0] <= delay + 0.1, ended - sent_at[0]
