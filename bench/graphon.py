"""What the transport adds to a run on graphon: events/s and time per run, with and without the producer view.

Run with ``.venv/bin/python -m bench.graphon`` (``make bench``). The same workflow runs on graphon through
the app's engine (Dify's events, the simulated model with no delay) twice per round, in alternation:

- ``graphon``: each event discarded once made (graphon, the response filter, the mapping to Dify's events);
- ``graphon+producer``: each event encoded and appended through the run topic's producer view
  (``topic.as_producer()``), exactly as the worker's coordinator appends it, on a real store.

Workflows: ``examples/iteration.yml`` over 200 names (about 800 events a run) and ``examples/greeting.yml``
with a 1,000-word answer (about 1,000 ``text_chunk`` events), both with a model that answers at once (the
transport's worst case: nothing else takes time), and the greeting with a 100-word answer at the
model's default pace (20 ms a token). Stores: the embedded SQLite file and Redis
(``--redis-url``, default the loopback server's db 0 under a private key prefix). Target (issue 38): the
transport adds at most 10 % to the time per run. A table is printed and the figures written to
``bench/results/graphon-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import yaml

from api.core.app.apps.event_codec import encode_event, stamped
from api.core.durable_stream import DurableStreamBackend, connect
from api.core.workflow import ModelSettings, WorkflowEngine, graphon_version

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "examples" / f"{name}.yml").read_text())
    return loaded


def _greeting(words: int, token_delay: float) -> dict[str, Any]:
    greeting = _example("greeting")
    for node in greeting["workflow"]["graph"]["nodes"]:
        if node["id"] == "draft":
            node["data"]["prompt_template"][-1]["text"] = " ".join(f"word{i}" for i in range(words))
            node["data"]["model"]["completion_params"]["token_delay"] = token_delay
    graph: dict[str, Any] = greeting["workflow"]["graph"]
    return graph


def workflows() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each workflow's graph and inputs: two with a model that answers at once (the transport's worst case),
    one with the model's default pace (20 ms a token, ``WORKFLOW_LLM_TOKEN_DELAY``)."""
    return {
        "iteration-200": (
            _example("iteration")["workflow"]["graph"],
            {"people": {"names": [f"person{i}" for i in range(200)]}},
        ),
        "greeting-1000-chunks": (_greeting(1000, 0.0), {"name": "Ada"}),
        "greeting-100-chunks-20ms": (_greeting(100, 0.02), {"name": "Ada"}),
    }


def one_run(graph: dict[str, Any], inputs: dict[str, Any], sink: Callable[[dict[str, Any]], None]) -> int:
    engine = WorkflowEngine(
        graph,
        app_id="bench",
        task_id=str(uuid.uuid4()),
        workflow_run_id=str(uuid.uuid4()),
        inputs=inputs,
        user="bench",
        created_at=time.time(),
        models=ModelSettings(token_delay=0.0),
    )
    count = 0
    for event in engine.run():
        sink(event)
        count += 1
    assert engine.outcome is not None and engine.outcome.status == "succeeded", engine.outcome
    return count


def measure(
    backend: DurableStreamBackend, graph: dict[str, Any], inputs: dict[str, Any], rounds: int
) -> dict[str, Any]:
    """``rounds`` alternations of a discarded run and a produced one; medians of each side."""
    alone: list[tuple[float, int]] = []
    produced: list[tuple[float, int]] = []
    one_run(graph, inputs, lambda event: None)  # warm-up: imports, graphon's first graph
    for _ in range(rounds):
        started = time.perf_counter()
        events = one_run(graph, inputs, lambda event: None)
        alone.append((time.perf_counter() - started, events))

        append = backend.topic(f"bench-graphon-{uuid.uuid4().hex}").as_producer().append
        started = time.perf_counter()
        events = one_run(graph, inputs, lambda event, append=append: append(stamped(encode_event(event))))
        produced.append((time.perf_counter() - started, events))

    def summary(samples: list[tuple[float, int]]) -> dict[str, float]:
        seconds = statistics.median(took for took, _ in samples)
        events = statistics.median(count for _, count in samples)
        return {
            "ms_per_run": round(seconds * 1000, 2),
            "events_per_run": events,
            "events_per_s": round(events / seconds),
        }

    alone_summary, produced_summary = summary(alone), summary(produced)
    overhead = produced_summary["ms_per_run"] / alone_summary["ms_per_run"] - 1
    return {"graphon": alone_summary, "graphon+producer": produced_summary, "overhead": round(overhead, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.graphon", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    options = parser.parse_args(argv)
    prefix = f"bench-graphon-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as var:
        stores = {
            "sqlite": connect(f"sqlite:///{var}/streams.db"),
            "redis": connect(options.redis_url, key_prefix=prefix),
        }
        results: dict[str, Any] = {}
        for workflow, (graph, inputs) in workflows().items():
            for store, backend in stores.items():
                figures = measure(backend, graph, inputs, options.rounds)
                results[f"{workflow}/{store}"] = figures
                alone, produced = figures["graphon"], figures["graphon+producer"]
                print(
                    f"{workflow:22} {store:7} graphon {alone['ms_per_run']:8.1f} ms/run "
                    f"{alone['events_per_s']:7.0f} ev/s | +producer {produced['ms_per_run']:8.1f} ms/run "
                    f"{produced['events_per_s']:7.0f} ev/s | transport adds {figures['overhead']:+.1%}"
                )
        for backend in stores.values():
            backend.close()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"graphon-{datetime.date.today().isoformat()}.json"
    meta = {"python": platform.python_version(), "graphon": graphon_version(), "rounds": options.rounds}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
