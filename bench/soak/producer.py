"""Runs' producer in a process of its own, as a Celery worker would be: appends at a fixed rate to
several runs' topics, alternately, and times every append.

``python -m bench.soak.producer --url URL --run TOPIC,TASK_ID,RUN_ID [--run …] --rate 50
--duration 100 --out samples.json`` appends each run's ``workflow_started``, then, every ``1/rate``
seconds for ``duration`` seconds, one ``text_chunk`` to every run (in an order that alternates from
one tick to the next), then each run's ``workflow_finished``, and seals the topics. It writes
``{"samples": [[run index, monotonic start, seconds], ...]}``: which run, when the append started
on the system-wide monotonic clock (comparable with the parent's ``time.monotonic()``), how long it
took. Appends to the runs are interleaved so that whatever else the machine does hits them alike.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections.abc import Sequence
from typing import Any

from api.core.durable_stream import DurableStreamProducer, connect
from api.core.workflow.events import make_event

#: Large events fill a stalled client's socket buffers (the server's send buffer grows to megabytes)
#: within seconds rather than minutes, so most of the stall has the server's writes to it blocked.
PADDING = "x" * 2000


def produce(url: str, runs: Sequence[tuple[str, str, str]], rate: float, duration: float) -> list[list[float]]:
    """``runs``: (topic, task id, run id) each. Returns the samples."""
    samples: list[list[float]] = []
    with connect(url) as backend:
        producers = [backend.topic(topic).as_producer() for topic, _, _ in runs]

        def append(index: int, producer: DurableStreamProducer, name: str, data: dict[str, Any]) -> None:
            _, task_id, run_id = runs[index]
            payload = json.dumps(make_event(name, task_id=task_id, workflow_run_id=run_id, data=data))
            started = time.monotonic()
            producer.append(payload.encode())
            samples.append([index, started, time.monotonic() - started])

        for index, producer in enumerate(producers):
            append(index, producer, "workflow_started", {"id": runs[index][2]})
        begin = time.monotonic()
        tick = 0
        while (due := begin + tick / rate) < begin + duration:
            time.sleep(max(0.0, due - time.monotonic()))
            order = list(enumerate(producers))
            for index, producer in order if tick % 2 == 0 else reversed(order):
                append(index, producer, "text_chunk", {"text": f"t{tick} {PADDING}"})
            tick += 1
        for index, producer in enumerate(producers):
            data: dict[str, Any] = {"id": runs[index][2], "status": "succeeded", "outputs": {}, "error": None}
            append(index, producer, "workflow_finished", data)
            backend.topic(runs[index][0]).seal()
    return samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak.producer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--run", action="append", required=True, help="TOPIC,TASK_ID,RUN_ID (repeatable)")
    parser.add_argument("--rate", type=float, default=50.0, help="appends per second to each run")
    parser.add_argument("--duration", type=float, default=100.0)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args(argv)
    runs = [tuple(value.split(",", 2)) for value in args.run]
    samples = produce(args.url, [(topic, task, run) for topic, task, run in runs], args.rate, args.duration)
    args.out.write_text(json.dumps({"samples": samples}))


if __name__ == "__main__":
    main()
