"""The human-input node's callback: graphon's boundary, our forms (Dify's form-token human input).

graphon's human-input node asks its callback what to do. On a run's way in, the callback opens the
node's form (its token stored before any client can see it) and asks graphon to pause; in the attempt
that resumes the run, the same node asks again and the callback answers with the submission that ended
the wait: the checked values (the node's outputs) and the chosen action (the edge taken), or the
form's expiry (the node fails, and the run with it, as before).
"""

from __future__ import annotations

import dataclasses
import math
import re
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from graphon.nodes.human_input.entities import Completed, HITLContext, HITLDecision, PauseRequested
from graphon.runtime.runtime_state_protocol import ReadOnlyVariablePool
from graphon.variables.factory import build_segment

from .errors import NodeRunError
from .forms import FormTicket, action_title, check_submission, fields_of, public_form, rendered_content
from .graph import Graph, Node
from .variables import VariablePool

#: How long a form waits for its answer when its node sets no ``timeout`` (Dify's default: 3 days).
DEFAULT_FORM_TIMEOUT = 3 * 24 * 3600.0
FORM_EXPIRED = "the human input form expired"

#: A variable of the run in a form's content (``{{#node.variable#}}``; ``$output`` ones are the form's own).
_REFERENCE = re.compile(r"\{\{#([A-Za-z0-9_\-]+)\.([A-Za-z0-9_\-]+)#\}\}")

#: Makes a paused node's form answerable by its token (stores it) before any client can see the token.
FormOpener = Callable[[Node, Mapping[str, Any]], None]


def new_ticket(expiration_time: int) -> FormTicket:
    """A form's id and its token: 128 random bits, 22 URL-safe characters, never beginning with ``-``.

    A token is pasted into shells and command lines, where a leading ``-`` reads as an option.
    """
    token = secrets.token_urlsafe(16)
    while token.startswith("-"):
        token = secrets.token_urlsafe(16)
    return FormTicket(str(uuid.uuid4()), token, expiration_time)


def _pool_view(node: Node, pool: ReadOnlyVariablePool) -> VariablePool:
    """The values a form reads (its defaults' and options' selectors), as the forms module reads them."""
    values: dict[str, dict[str, Any]] = {}
    for field in fields_of(node):
        for source in (field.default, field.options):
            if source is None or source.kind != "variable" or len(source.selector) != 2:
                continue
            segment = pool.get(list(source.selector))
            if segment is not None:
                values.setdefault(source.selector[0], {})[source.selector[1]] = segment.to_object()
    return VariablePool(values)


def _with_content(node: Node, content: str) -> Node:
    return dataclasses.replace(node, config={**node.config, "form_content": content})


def _rendered_references(node: Node, pool: ReadOnlyVariablePool) -> Node:
    """``node`` with the run's variables in its content written out, as Dify shows a form."""
    content = node.config.get("form_content")
    if not isinstance(content, str):
        return node

    def value_of(match: re.Match[str]) -> str:
        if match.group(1).startswith("$"):
            return match.group(0)
        segment = pool.get([match.group(1), match.group(2)])
        return "" if segment is None else segment.text

    return _with_content(node, _REFERENCE.sub(value_of, content))


class HumanInput:
    """One attempt's callback. ``answer`` is the submission of a resumed attempt (for its paused node)."""

    def __init__(
        self,
        graph: Graph,
        *,
        open_form: FormOpener,
        form_timeout: float,
        answer: Mapping[str, Any] | None = None,
        answered_node: str | None = None,
        answered_form: Mapping[str, Any] | None = None,
    ) -> None:
        self._graph = graph
        self._open_form = open_form
        self._form_timeout = form_timeout
        self._answer = answer
        self._answered_node = answered_node
        self._answered_form = answered_form or {}
        #: The form this attempt opened (the run pauses on it), by node id.
        self.opened: dict[str, dict[str, Any]] = {}
        #: ``human_input_form_filled`` data of the form this attempt took the answer of.
        self.filled: dict[str, Any] | None = None
        #: ``human_input_form_timeout`` data of the form whose expiry this attempt took.
        self.timed_out: dict[str, Any] | None = None

    def __call__(self, context: HITLContext) -> HITLDecision:
        node = self._graph.nodes[context.node_id]
        if self._answer is not None and context.node_id == self._answered_node:
            answer, self._answer = self._answer, None
            return self._completed(_rendered_references(node, context.variable_pool), answer)
        timeout = float(node.config.get("timeout") or self._form_timeout)
        shown = _rendered_references(node, context.variable_pool)
        # Dify's expiration_time is whole seconds: rounded up, so the form is never due before its timeout.
        expires = math.ceil(time.time() + timeout)
        form = public_form(shown, new_ticket(expires), _pool_view(node, context.variable_pool))
        self._open_form(node, form)
        self.opened[node.id] = form
        return PauseRequested(session_id=form["form_id"])

    def _completed(self, node: Node, answer: Mapping[str, Any]) -> Completed:
        """The node's outcome for the answer that ended its wait.

        Raises:
            NodeRunError: the form expired, or the submission does not fit it (the node fails).
        """
        if answer.get("kind") == "timeout":
            self.timed_out = {
                "node_id": node.id,
                "node_title": node.title,
                "expiration_time": self._answered_form.get("expiration_time"),
            }
            raise NodeRunError(FORM_EXPIRED)
        if "kind" in answer:
            inputs, action = answer.get("inputs") or {}, answer.get("action")
        else:  # task messages queued by earlier versions carry the inputs alone
            inputs, action = answer, None
        values, action = check_submission(node, inputs, action, self._answered_form)
        content = rendered_content(node, values)
        self.filled = {
            "node_id": node.id,
            "node_title": node.title,
            "rendered_content": content,
            "action_id": action,
            "action_text": action_title(node, action),
            "submitted_data": values,
        }
        outputs = {**values, "__action_id": action, "__rendered_content": content}
        # The chosen button is the edge taken where the graph branches on it; else the node's one way on.
        handles = self._graph.handles_from(node.id)
        handle = action if action in handles else next(iter(handles)) if len(handles) == 1 else "source"
        return Completed(
            selected_handle=handle,
            inputs={name: build_segment(value) for name, value in values.items()},
            outputs={name: build_segment(value) for name, value in outputs.items()},
        )
