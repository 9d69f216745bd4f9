"""Settings of the memory adapter, parsed once from the connection options."""

from __future__ import annotations

import dataclasses

from ..._options import Options

__all__ = ["MemorySettings"]


@dataclasses.dataclass(frozen=True, slots=True)
class MemorySettings:
    #: Records kept per topic, applied on every append (``None``: unlimited).
    max_records: int | None = None
    #: Age after which ``admin.enforce_retention()`` drops records and idle topics (``None``: never).
    max_age_seconds: float | None = None

    @classmethod
    def from_options(cls, options: Options) -> MemorySettings:
        return cls(
            max_records=options.pop_int("max_records", minimum=1),
            max_age_seconds=options.pop_float("max_age_seconds", minimum=0.001),
        )
