"""The variable pool and ``{{node.variable}}`` templates."""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import NodeRunError

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_\-]+)\.([A-Za-z0-9_\-]+)\s*\}\}")


class VariablePool:
    """Outputs of finished nodes, addressed as ``node_id.name`` (``sys.*`` holds run facts)."""

    def __init__(self, values: dict[str, dict[str, Any]] | None = None) -> None:
        self.values: dict[str, dict[str, Any]] = values or {}

    def set_outputs(self, node_id: str, outputs: dict[str, Any]) -> None:
        self.values[node_id] = dict(outputs)

    def get(self, selector: str) -> Any:
        node_id, _, name = selector.partition(".")
        try:
            return self.values[node_id][name]
        except KeyError:
            raise NodeRunError(f"variable {selector!r} is not defined") from None

    def render(self, template: str) -> str:
        def substitute(match: re.Match[str]) -> str:
            value = self.get(f"{match.group(1)}.{match.group(2)}")
            return value if isinstance(value, str) else json.dumps(value)

        return _PLACEHOLDER.sub(substitute, template)
