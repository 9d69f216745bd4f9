"""The workflows the soak runs: one simulated LLM node that streams distinct tokens.

Every token is distinct (``t0 t1 …``), so every event of a run is distinct and a client's copy of
the run can be matched event by event against the stored one.
"""

from __future__ import annotations

from typing import Any

#: Events of a run besides its text chunks: workflow_started, three node_started, three node_finished,
#: workflow_finished.
FRAME_EVENTS = 8


def streaming_workflow(tokens: int, delay: float, *, prefix: str = "t", name: str = "") -> dict[str, Any]:
    """start → llm (``tokens`` text chunks ``<prefix>0 <prefix>1 …``, ``delay`` seconds apart) → end."""
    return {
        "name": name or f"Soak: {tokens} tokens, {delay * 1000:g} ms apart",
        "mode": "workflow",
        "graph": {
            "nodes": [
                {"id": "start", "type": "start", "variables": [{"name": "name", "required": True}]},
                {
                    "id": "llm",
                    "type": "llm",
                    "prompt": "Say {{start.name}}",
                    "response": " ".join(f"{prefix}{index}" for index in range(tokens)),
                    "token_delay": delay,
                },
                {"id": "end", "type": "end", "outputs": {"text": {"variable": "llm.text"}}},
            ],
            "edges": [{"source": "start", "target": "llm"}, {"source": "llm", "target": "end"}],
        },
    }


def expected_events(tokens: int) -> int:
    return tokens + FRAME_EVENTS
