"""What each node type does: the simulated model streams its tokens and says what it spent; the other
nodes return their outputs at once. ``StopRequested`` ends a run in the middle of a node."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any

from .errors import NodeRunError
from .graph import Node
from .variables import VariablePool

_TOKEN = re.compile(r"\s*\S+\s*|\s+")
_REFERENCE = re.compile(r"\{\{\s*([A-Za-z0-9_\-]+)\.([A-Za-z0-9_\-]+)\s*\}\}")


@dataclasses.dataclass(frozen=True)
class LlmResult:
    """What the simulated model answered, and what it spent (its tokens)."""

    outputs: dict[str, Any]
    prompt: str
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


LlmRun = Generator[str, None, LlmResult]


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


def count_tokens(text: str) -> int:
    """The simulated model's tokenizer: a word with the spaces around it is one token."""
    return len(_TOKEN.findall(text))


def node_inputs(node: Node, pool: VariablePool, run_inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The variables ``node`` reads, by selector (``node_id.name``); the run's inputs for a start node.

    A selector that is not defined (yet) is left out: the node's own run reports it.
    """
    if node.type == "start":
        return dict(run_inputs)
    selectors: list[str] = []
    for value in node.config.values():
        selectors.extend(_selectors_in(value))
    values: dict[str, Any] = {}
    for selector in selectors:
        try:
            values[selector] = pool.get(selector)
        except NodeRunError:
            continue
    return values


def _selectors_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [f"{match.group(1)}.{match.group(2)}" for match in _REFERENCE.finditer(value)]
    if isinstance(value, Mapping):
        found = [str(value["variable"])] if isinstance(value.get("variable"), str) else []
        for item in value.values():
            found.extend(_selectors_in(item))
        return found
    if isinstance(value, list):
        return [selector for item in value for selector in _selectors_in(item)]
    return []


def run_llm(node: Node, pool: VariablePool, token_delay: float, should_stop: Callable[[], str | None]) -> LlmRun:
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
    return LlmResult({"text": "".join(streamed)}, prompt, count_tokens(prompt), len(streamed))


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


def run_end(node: Node, pool: VariablePool) -> dict[str, Any]:
    outputs: dict[str, Any] = {}
    for name, spec in node.config["outputs"].items():
        if isinstance(spec, Mapping) and "variable" in spec:
            outputs[name] = pool.get(str(spec["variable"]))
        else:
            outputs[name] = pool.render(str(spec))
    return outputs
