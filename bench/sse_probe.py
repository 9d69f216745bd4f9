"""The Celery app of ``python -m bench.sse``: the real one, with probe tokens stamped by the producer.

Run as ``celery -A bench.sse_probe:celery worker …``. The simulated model streams its answer token by
token; here each token ``pN`` leaves the model as ``pN@<time.time()>`` just before graphon turns it into
a stream chunk and the engine appends it as a ``text_chunk`` event, so a client on the same machine can
compute append → receive latency from the event alone (the events' own ``created_at`` is whole seconds).
Nothing else of the app changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from api.core.workflow import model_runtime

_stream = model_runtime.SimulatedModel._stream


def _stamped(self: model_runtime.SimulatedModel, prompt_messages: Sequence[Any]) -> Iterator[str]:
    for token in _stream(self, prompt_messages):
        yield f"{token.strip()}@{time.time():.6f} "


model_runtime.SimulatedModel._stream = _stamped  # type: ignore[method-assign]

from api.celery_entrypoint import celery  # noqa: E402  (after the patch, which the model reads at call time)

__all__ = ["celery"]
