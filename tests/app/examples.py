"""The example apps (``examples/*.yml``, Dify DSL) for the tests, and the changes tests make to them.

Tests that need a slower, longer, failing or scripted model change the simulated model's settings
of an llm node (its ``completion_params``) or its scripted answer (the prompt's trailing assistant
message), as a Dify user would edit the node.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from harness.processes import ROOT

EXAMPLES = ROOT / "examples"


def example(name: str) -> dict[str, Any]:
    """``examples/<name>.yml`` as a mapping (a fresh copy: tests may change it)."""
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yml").read_text())
    return loaded


def greeting() -> dict[str, Any]:
    return example("greeting")


def graph_of(definition: dict[str, Any]) -> dict[str, Any]:
    graph: dict[str, Any] = definition["workflow"]["graph"]
    return graph


def node_data(definition: dict[str, Any], node_id: str) -> dict[str, Any]:
    for node in graph_of(definition)["nodes"]:
        if node["id"] == node_id:
            data: dict[str, Any] = node["data"]
            return data
    raise KeyError(node_id)


def script_model(
    definition: dict[str, Any], node_id: str = "draft", *, response: str | None = None, **params: Any
) -> dict[str, Any]:
    """A copy of ``definition`` whose llm node ``node_id`` answers ``response`` with ``params``
    (``token_delay``, ``error_after_tokens``, ``error``) in its simulated model's settings."""
    changed = copy.deepcopy(definition)
    data = node_data(changed, node_id)
    data["model"]["completion_params"].update(params)
    if response is not None:
        data["prompt_template"][-1] = {"role": "assistant", "text": response}
    return changed


def renamed(definition: dict[str, Any], name: str) -> dict[str, Any]:
    changed = copy.deepcopy(definition)
    changed["app"]["name"] = name
    return changed


def shown_before_the_form(definition: dict[str, Any], *, response: str, token_delay: float) -> dict[str, Any]:
    """A copy of the greeting whose formal draft (``response``, ``token_delay`` apart) streams to the client
    before the form: an answer node shows it. (In the example the formal draft reaches no end node, so as in
    Dify none of it streams; tests that cut a long stream before a pause need one.)"""
    changed = script_model(definition, "formal_draft", response=response, token_delay=token_delay)
    graph = graph_of(changed)
    show = {"type": "answer", "title": "Show the draft", "answer": "{{#formal_draft.text#}}", "variables": []}
    graph["nodes"].append({"id": "show", "data": show})
    graph["edges"] = [edge for edge in graph["edges"] if edge["id"] != "formal_draft-approve"]
    graph["edges"] += [
        {"id": "formal_draft-show", "source": "formal_draft", "target": "show", "sourceHandle": "source"},
        {"id": "show-approve", "source": "show", "target": "approve", "sourceHandle": "source"},
    ]
    return changed
