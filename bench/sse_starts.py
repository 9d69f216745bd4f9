"""Where the clients of ``python -m bench.sse --scenario herd|deploy`` start (``--start``).

Three kinds of client, as Dify's ``GET /v1/workflow/<task_id>/events`` knows them:

- ``tail``: neither ``Last-Event-ID`` nor ``include_state_snapshot``: it gets what the run appends
  from then on (Dify's default reader, the request Dify's web front end sends on every reconnect);
- ``cursor``: ``Last-Event-ID`` of an event from the middle of its run: it gets what follows it;
- ``snapshot``: ``include_state_snapshot=true``: it replays the run from its start.

``--start`` is one kind (``tail``, ``cursor``, ``snapshot``), ``mix`` (Dify's mix, the default: half
tail, a quarter cursor, a quarter snapshot) or explicit shares such as ``tail=50,cursor=25,snapshot=25``
(weights of any scale; a kind left out gets none).
"""

from __future__ import annotations

import argparse
import math

START_KINDS = ("tail", "cursor", "snapshot")
#: Dify's mix: most readers are its web front end, which reconnects without a cursor.
DIFY_MIX = {"tail": 0.5, "cursor": 0.25, "snapshot": 0.25}


def parse_start(text: str) -> dict[str, float]:
    """``--start``'s value as shares of :data:`START_KINDS` summing to 1.

    Raises:
        argparse.ArgumentTypeError: an unknown kind, a share that is not a number >= 0, a kind given
            twice, or shares summing to 0.
    """
    text = text.strip()
    if text == "mix":
        return dict(DIFY_MIX)
    if text in START_KINDS:
        return {kind: 1.0 if kind == text else 0.0 for kind in START_KINDS}
    weights: dict[str, float] = {}
    for part in text.split(","):
        kind, equals, value = part.partition("=")
        kind = kind.strip()
        if not equals or kind not in START_KINDS:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected tail, cursor, snapshot, mix or shares such as tail=50,cursor=25,snapshot=25"
            )
        if kind in weights:
            raise argparse.ArgumentTypeError(f"{kind} is given twice")
        try:
            weight = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: the share is not a number") from None
        if not math.isfinite(weight) or weight < 0:
            raise argparse.ArgumentTypeError(f"{part!r}: a share is a finite number >= 0")
        weights[kind] = weight
    total = sum(weights.values())
    if total <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the shares add up to 0")
    return {kind: weights.get(kind, 0.0) / total for kind in START_KINDS}


def start_label(shares: dict[str, float]) -> str:
    """``tail`` (one kind) or ``mix 50/25/25`` (the percentages of tail/cursor/snapshot)."""
    only = [kind for kind in START_KINDS if shares.get(kind, 0.0) > 0]
    if len(only) == 1:
        return only[0]
    return "mix " + "/".join(f"{shares.get(kind, 0.0) * 100:.0f}" for kind in START_KINDS)


def interleaved(shares: dict[str, float], length: int) -> list[str]:
    """``length`` kinds, each next one the kind furthest below its share so far (ties in
    :data:`START_KINDS` order): every prefix, and every stretch, holds each kind in proportion
    within a client or two (50/25/25 gives tail, cursor, snapshot, tail, … ad infinitum)."""
    counts = dict.fromkeys(START_KINDS, 0)
    sequence = []
    for position in range(length):
        kind = max(START_KINDS, key=lambda name: shares.get(name, 0.0) * (position + 1) - counts[name])
        counts[kind] += 1
        sequence.append(kind)
    return sequence


def assign_starts(clients: int, runs: int, shares: dict[str, float]) -> list[str]:
    """The start of each client ``i`` (of run ``i % runs``, its ``i // runs``-th): element
    ``i % runs + i // runs`` of :func:`interleaved`. Each run's clients take a consecutive stretch of
    it (so a run with a few more clients than the mix's period gets every kind) and clients arriving
    one after the other alternate kinds; deterministic."""
    if clients <= 0:
        return []
    sequence = interleaved(shares, runs + math.ceil(clients / runs))
    return [sequence[index % runs + index // runs] for index in range(clients)]
