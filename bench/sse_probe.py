"""The Celery app of ``python -m bench.sse``: the real one, with probe tokens stamped by the producer.

Run as ``celery -A bench.sse_probe:celery worker …``. The simulated LLM node streams its response
token by token; here each token ``pN`` leaves the node as ``pN@<time.time()>`` just before the engine
turns it into a ``text_chunk`` event and appends it, so a client on the same machine can compute
append → receive latency from the event alone (the events' own ``created_at`` is whole seconds).
Nothing else of the app changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any

from api.core.workflow import engine, nodes

_run_llm = nodes.run_llm


def _stamped_llm(
    node: Any, pool: Any, token_delay: float, should_stop: Callable[[], str | None]
) -> Generator[str, None, dict[str, Any]]:
    runner = _run_llm(node, pool, token_delay, should_stop)
    while True:
        try:
            token = next(runner)
        except StopIteration as done:
            result: dict[str, Any] = done.value
            return result
        yield f"{token.strip()}@{time.time():.6f} "


engine.run_llm = _stamped_llm  # type: ignore[assignment]

from api.celery_entrypoint import celery  # noqa: E402  (after the patch, which the engine reads at call time)

__all__ = ["celery"]
