"""What every benchmark reports the same way: percentiles and the machine it ran on."""

from __future__ import annotations

import contextlib
import pathlib
import platform


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie (the sample at index ``int(fraction * n)``)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, or what ``platform`` says."""
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or ""
