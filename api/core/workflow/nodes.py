"""What each node type does. A node runner yields ``("chunk", text)`` while it streams and returns
its outputs; ``PauseRequested`` stops the run at a human-input node."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any

from .errors import NodeRunError
from .graph import Node
from .variables import VariablePool

NodeRun = Generator[str, None, dict[str, Any]]
_TOKEN = re.compile(r"\s*\S+\s*|\s+")


class PauseRequested(Exception):
    def __init__(self, form: list[Mapping[str, Any]]) -> None:
        super().__init__("human input required")
        self.form = form


class StopRequested(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def run_start(node: Node, pool: VariablePool, inputs: Mapping[str, Any]) -> dict[str, Any]:
    outputs: dict[str, Any] = {}
    for variable in node.config.get("variables", []):
        name = variable["name"]
        if name in inputs:
            outputs[name] = inputs[name]
        elif "default" in variable:
            outputs[name] = variable["default"]
        elif variable.get("required", False):
            raise NodeRunError(f"input {name!r} is required")
    return outputs


def run_llm(node: Node, pool: VariablePool, token_delay: float, should_stop: Callable[[], str | None]) -> NodeRun:
    """A deterministic simulated model: streams its answer token by token, no network."""
    prompt = pool.render(node.config["prompt"])
    response_template = node.config.get("response")
    text = pool.render(response_template) if isinstance(response_template, str) else f"You said: {prompt}"
    delay = float(node.config.get("token_delay", token_delay))
    fail_after = node.config.get("error_after_tokens")
    streamed: list[str] = []
    for index, token in enumerate(_TOKEN.findall(text)):
        if fail_after is not None and index >= int(fail_after):
            raise NodeRunError(str(node.config.get("error", "the model failed")))
        reason = should_stop()
        if reason:
            raise StopRequested(reason)
        if delay > 0:
            time.sleep(delay)
        streamed.append(token)
        yield token
    return {"text": "".join(streamed)}


def run_template(node: Node, pool: VariablePool) -> dict[str, Any]:
    return {"output": pool.render(node.config["template"])}


def evaluate_if_else(node: Node, pool: VariablePool) -> bool:
    results = [_condition(pool, condition) for condition in node.config["conditions"]]
    if node.config.get("logical_operator", "and") == "or":
        return any(results)
    return all(results)


def _condition(pool: VariablePool, condition: Mapping[str, Any]) -> bool:
    value = pool.get(str(condition.get("variable", "")))
    operator = condition.get("operator", "equals")
    expected = condition.get("value")
    text = "" if value is None else str(value)
    checks: dict[str, Callable[[], bool]] = {
        "equals": lambda: text == str(expected),
        "not_equals": lambda: text != str(expected),
        "contains": lambda: str(expected) in text,
        "not_contains": lambda: str(expected) not in text,
        "empty": lambda: text == "",
        "not_empty": lambda: text != "",
        "gt": lambda: _number(value) > _number(expected),
        "lt": lambda: _number(value) < _number(expected),
    }
    if operator not in checks:
        raise NodeRunError(f"unknown operator {operator!r}")
    return checks[operator]()


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise NodeRunError(f"{value!r} is not a number") from None


def validate_form(node: Node, submitted: Mapping[str, Any]) -> dict[str, Any]:
    """Check a human-input submission against the node's form; return the node's outputs."""
    outputs: dict[str, Any] = {}
    for field in node.config.get("form", []):
        name = field["name"]
        if name not in submitted:
            if field.get("required", True):
                raise NodeRunError(f"form field {name!r} is required")
            continue
        value = submitted[name]
        kind = field.get("type", "text")
        if kind == "boolean" and not isinstance(value, bool):
            raise NodeRunError(f"form field {name!r} must be true or false")
        if kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise NodeRunError(f"form field {name!r} must be a number")
        if kind == "text" and not isinstance(value, str):
            raise NodeRunError(f"form field {name!r} must be text")
        outputs[name] = value
    return outputs


def run_end(node: Node, pool: VariablePool) -> dict[str, Any]:
    outputs: dict[str, Any] = {}
    for name, spec in node.config["outputs"].items():
        if isinstance(spec, Mapping) and "variable" in spec:
            outputs[name] = pool.get(str(spec["variable"]))
        else:
            outputs[name] = pool.render(str(spec))
    return outputs
