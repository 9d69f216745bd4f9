"""A run's producer in a process of its own, as a Celery worker would be: appends at a fixed rate
and times every append.

``python -m bench.soak.producer --url URL --topic NAME --task-id T --run-id R --rate 50 --duration 100
--out samples.json`` appends ``workflow_started``, then ``text_chunk`` events every ``1/rate``
seconds for ``duration`` seconds, then ``workflow_finished``, and seals the topic. It writes
``{"samples": [[monotonic start, seconds], ...]}``: each append's start on the system-wide monotonic
clock (comparable with the parent's ``time.monotonic()``) and how long it took.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from typing import Any

from api.core.durable_stream import connect
from api.core.workflow.events import make_event

#: Large events fill a stalled client's socket buffers (the server's send buffer grows to megabytes)
#: within seconds rather than minutes, so most of the stall has the server's writes to it blocked.
PADDING = "x" * 2000


def produce(url: str, topic_name: str, task_id: str, run_id: str, rate: float, duration: float) -> list[list[float]]:
    samples: list[list[float]] = []
    with connect(url) as backend:
        topic = backend.topic(topic_name)
        producer = topic.as_producer()

        def append(event: dict[str, Any]) -> None:
            started = time.monotonic()
            producer.append(json.dumps(event, separators=(",", ":")).encode())
            samples.append([started, time.monotonic() - started])

        append(make_event("workflow_started", task_id=task_id, workflow_run_id=run_id, data={"id": run_id}))
        begin = time.monotonic()
        index = 0
        while (due := begin + index / rate) < begin + duration:
            time.sleep(max(0.0, due - time.monotonic()))
            text = f"t{index} {PADDING}"
            append(make_event("text_chunk", task_id=task_id, workflow_run_id=run_id, data={"text": text}))
            index += 1
        data: dict[str, Any] = {"id": run_id, "status": "succeeded", "outputs": {}, "error": None}
        append(make_event("workflow_finished", task_id=task_id, workflow_run_id=run_id, data=data))
        topic.seal()
    return samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak.producer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--task-id", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--duration", type=float, default=100.0)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args(argv)
    samples = produce(args.url, args.topic, args.task_id, args.run_id, args.rate, args.duration)
    args.out.write_text(json.dumps({"samples": samples}))


if __name__ == "__main__":
    main()
