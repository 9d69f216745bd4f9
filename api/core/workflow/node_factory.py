"""Builds graphon's nodes for a Dify DSL graph, with our collaborators in place of Dify's.

graphon's own DSL factory reaches models and tools through Dify's plugin daemon and has no human-input
node; ours gives the model nodes our model runtime, the human-input node our forms' callback, the
template nodes jinja2, and the HTTP node a text-only file manager. A node type that needs a service
this app does not have is not built: :data:`REFUSED` says why, and ``dsl.load_app`` refuses the app.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jinja2
from graphon.entities.graph_config import NodeConfigDict
from graphon.enums import BuiltinNodeTypes, NodeExecutionType
from graphon.file.enums import FileType
from graphon.file.models import File
from graphon.model_runtime.entities.llm_entities import LLMMode
from graphon.model_runtime.entities.message_entities import PromptMessage
from graphon.nodes.answer.answer_node import AnswerNode
from graphon.nodes.base.node import Node
from graphon.nodes.end.end_node import EndNode
from graphon.nodes.http_request.config import build_http_request_config
from graphon.nodes.http_request.entities import HttpRequestNodeData
from graphon.nodes.http_request.exc import HttpRequestNodeError
from graphon.nodes.http_request.node import HttpRequestNode, HttpRequestNodeDependencies
from graphon.nodes.human_input.entities import HITLCallback, HumanInputNodeData
from graphon.nodes.human_input.human_input_node import HumanInputNode
from graphon.nodes.if_else.if_else_node import IfElseNode
from graphon.nodes.iteration.iteration_node import IterationNode
from graphon.nodes.iteration.iteration_start_node import IterationStartNode
from graphon.nodes.list_operator.entities import ListOperatorNodeData
from graphon.nodes.list_operator.node import ListOperatorNode
from graphon.nodes.llm import LLMNode, LLMNodeData
from graphon.nodes.llm.exc import LLMNodeError
from graphon.nodes.loop.loop_end_node import LoopEndNode
from graphon.nodes.loop.loop_node import LoopNode
from graphon.nodes.loop.loop_start_node import LoopStartNode
from graphon.nodes.parameter_extractor.entities import ParameterExtractorNodeData
from graphon.nodes.parameter_extractor.parameter_extractor_node import ParameterExtractorNode
from graphon.nodes.question_classifier import (
    QuestionClassifierNode,
    QuestionClassifierNodeData,
    QuestionClassifierNodeDependencies,
)
from graphon.nodes.start import StartNode
from graphon.nodes.template_transform.entities import TemplateTransformNodeData
from graphon.nodes.template_transform.template_transform_node import TemplateTransformNode
from graphon.nodes.variable_aggregator.entities import VariableAggregatorNodeData
from graphon.nodes.variable_aggregator.variable_aggregator_node import VariableAggregatorNode
from graphon.nodes.variable_assigner.v1.node import VariableAssignerNode as VariableAssignerV1
from graphon.nodes.variable_assigner.v1.node_data import VariableAssignerData
from graphon.nodes.variable_assigner.v2.entities import VariableAssignerNodeData
from graphon.nodes.variable_assigner.v2.node import VariableAssignerNode as VariableAssignerV2
from graphon.runtime.init_params import InitParams
from graphon.runtime.runtime_state import RuntimeState
from graphon.template_rendering import Jinja2TemplateRenderer, TemplateRenderError

from .model_runtime import ModelSettings, StopSignal, model_for

#: Node types this app cannot run, and the one line that says why.
REFUSED: dict[str, str] = {
    "code": "a code node needs Dify's code sandbox, which this app does not have",
    "tool": "a tool node needs Dify's plugin daemon, which this app does not have",
    "agent": "an agent node needs Dify's plugin daemon, which this app does not have",
    "knowledge-retrieval": "a knowledge-retrieval node needs Dify's datasets, which this app does not have",
    "document-extractor": "a document-extractor node needs the 'documents' extra and file storage of Dify",
    "datasource": "a datasource node belongs to Dify's RAG pipelines, which this app does not run",
    "knowledge-index": "a knowledge-index node belongs to Dify's RAG pipelines, which this app does not run",
    "trigger-webhook": "a trigger node needs Dify's trigger service, which this app does not have",
    "trigger-schedule": "a trigger node needs Dify's trigger service, which this app does not have",
    "trigger-plugin": "a trigger node needs Dify's trigger service, which this app does not have",
}
MODEL_NODES = frozenset({"llm", "question-classifier", "parameter-extractor"})


class _Jinja2(Jinja2TemplateRenderer):
    """jinja2 itself, declared by the app: graphon's fallback without it substitutes plain names only."""

    _environment = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined)

    def render_template(self, template: str, variables: Mapping[str, Any]) -> str:
        try:
            return str(self._environment.from_string(template).render(**dict(variables)))
        except jinja2.TemplateError as error:
            raise TemplateRenderError(str(error)) from error


class _Prompts:
    """The prompts in a model node's process data, as Dify shows them: role, text, files."""

    def serialize(self, *, model_mode: LLMMode, prompt_messages: Sequence[PromptMessage]) -> Any:
        return [
            {"role": message.role.value, "text": message.get_text_content(), "files": []} for message in prompt_messages
        ]


class _TextOnlyFiles:
    """The model and HTTP nodes' file collaborators: this app stores no files they produce."""

    def save_binary_string(
        self, data: bytes, mime_type: str, file_type: FileType, extension_override: str | None = None
    ) -> File:
        raise LLMNodeError("this app's model runtime answers text only")

    def save_remote_url(self, url: str, file_type: FileType) -> File:
        raise LLMNodeError("this app's model runtime answers text only")

    def download(self, f: File, /) -> bytes:
        raise HttpRequestNodeError("this app's HTTP request node sends text only")

    def create_file_by_raw(self, *, file_binary: bytes, mimetype: str, filename: str | None = None) -> object:
        raise HttpRequestNodeError("this app's HTTP request node keeps text responses only")

    def get_file_generator_by_tool_file_id(self, tool_file_id: str) -> tuple[None, None]:
        return None, None

    def build_from_mapping(self, *, mapping: Mapping[str, Any]) -> File:
        raise HttpRequestNodeError("this app's HTTP request node keeps text responses only")


@dataclasses.dataclass(frozen=True)
class Collaborators:
    """What one run's nodes are given: the model settings, the stop signal and the forms' callback."""

    models: ModelSettings
    signal: StopSignal
    human_input: HITLCallback


_SIMPLE: dict[str, type[Node[Any]]] = {
    "start": StartNode,
    "end": EndNode,
    "answer": AnswerNode,
    "if-else": IfElseNode,
    "iteration": IterationNode,
    "iteration-start": IterationStartNode,
    "loop": LoopNode,
    "loop-start": LoopStartNode,
    "loop-end": LoopEndNode,
}
#: Node data models for the types whose data graphon's nodes do not validate themselves.
_DATA: dict[str, Any] = {
    "template-transform": TemplateTransformNodeData,
    "http-request": HttpRequestNodeData,
    "variable-aggregator": VariableAggregatorNodeData,
    "list-operator": ListOperatorNodeData,
    "llm": LLMNodeData,
    "question-classifier": QuestionClassifierNodeData,
    "parameter-extractor": ParameterExtractorNodeData,
    "human-input": HumanInputNodeData,
}
SUPPORTED = frozenset({*_SIMPLE, *_DATA, "variable-assigner"})


def _assigner_data(payload: Mapping[str, Any]) -> VariableAssignerData | VariableAssignerNodeData:
    """Dify's two variable-assigner shapes: v2 has ``items``; v1 one selector, a write mode and an input."""
    if "items" in payload or str(payload.get("version") or "") == "2":
        return VariableAssignerNodeData.model_validate(payload)
    return VariableAssignerData.model_validate(payload)


@dataclasses.dataclass(frozen=True)
class NodeFactory:
    """graphon's ``NodeFactory``: one per run frame (graphon copies it for iteration and loop bodies)."""

    init_params: InitParams
    runtime_state: RuntimeState
    collaborators: Collaborators

    def with_runtime_state(self, runtime_state: RuntimeState) -> NodeFactory:
        return dataclasses.replace(self, runtime_state=runtime_state)

    def with_graph_config(self, graph_config: Mapping[str, Any]) -> NodeFactory:
        params = self.init_params.model_copy(update={"graph_config": graph_config})
        return dataclasses.replace(self, init_params=params)

    def validate_node(self, node_config: NodeConfigDict) -> NodeExecutionType:
        node_type, payload = _type_and_payload(node_config)
        if node_type == "variable-assigner":
            data = _assigner_data(payload)
            return (
                VariableAssignerV2 if isinstance(data, VariableAssignerNodeData) else VariableAssignerV1
            ).execution_type
        node_class = self._node_class(node_type)
        node_class.validate_node_data(_DATA[node_type].model_validate(payload) if node_type in _DATA else payload)
        return node_class.execution_type

    def _node_class(self, node_type: str) -> type[Node[Any]]:
        if node_type in _SIMPLE:
            return _SIMPLE[node_type]
        classes: dict[str, type[Node[Any]]] = {
            "template-transform": TemplateTransformNode,
            "http-request": HttpRequestNode,
            "variable-aggregator": VariableAggregatorNode,
            "list-operator": ListOperatorNode,
            "llm": LLMNode,
            "question-classifier": QuestionClassifierNode,
            "parameter-extractor": ParameterExtractorNode,
            "human-input": HumanInputNode,
        }
        if node_type not in classes:
            raise ValueError(REFUSED.get(node_type, f"node type {node_type!r} is not supported"))
        return classes[node_type]

    def create_node(self, node_config: NodeConfigDict) -> Node[Any]:
        node_id = str(node_config["id"])
        node_type, payload = _type_and_payload(node_config)
        common: dict[str, Any] = {
            "node_id": node_id,
            "init_params": self.init_params,
            "runtime_state": self.runtime_state,
        }
        if node_type in _SIMPLE:
            node_class = _SIMPLE[node_type]
            return node_class(data=node_class.validate_node_data(payload), **common)
        build: Callable[[dict[str, Any], Mapping[str, Any]], Node[Any]] | None = getattr(
            self, "_build_" + node_type.replace("-", "_"), None
        )
        if build is None:
            raise ValueError(REFUSED.get(node_type, f"node type {node_type!r} is not supported"))
        return build(common, payload)

    def _model(self, payload: Mapping[str, Any]) -> Any:
        model = payload.get("model") or {}
        return model_for(
            str(model.get("provider") or ""),
            str(model.get("name") or ""),
            model.get("completion_params") or {},
            self.collaborators.signal,
            self.collaborators.models,
        )

    def _build_template_transform(self, common: dict[str, Any], payload: Mapping[str, Any]) -> Node[Any]:
        data = TemplateTransformNodeData.model_validate(payload)
        return TemplateTransformNode(data=data, jinja2_template_renderer=_Jinja2(), **common)

    def _build_http_request(self, common: dict[str, Any], payload: Mapping[str, Any]) -> Node[Any]:
        files = _TextOnlyFiles()
        dependencies = HttpRequestNodeDependencies(
            tool_file_manager_factory=_TextOnlyFiles, file_manager=files, file_reference_factory=files
        )
        return HttpRequestNode(
            data=HttpRequestNodeData.model_validate(payload),
            http_request_config=build_http_request_config(),
            dependencies=dependencies,
            **common,
        )

    def _build_variable_aggregator(self, common: dict[str, Any], payload: Mapping[str, Any]) -> Node[Any]:
        return VariableAggregatorNode(data=VariableAggregatorNodeData.model_validate(payload), **common)

    def _build_list_operator(self, common: dict[str, Any], payload: Mapping[str, Any]) -> Node[Any]:
        return ListOperatorNode(data=ListOperatorNodeData.model_validate(payload), **common)

    def _build_variable_assigner(self, common: dict[str, Any], payload: Mapping[str, Any]) -> Node[Any]:
        data = _assigner_data(payload)
        if isinstance(data, VariableAssignerNodeData):
            return VariableAssignerV2(data=data, **common)
        return VariableAssignerV1(data=data, **common)

    def _build_llm(self, common: dict[str, Any], payload: Mapping[str, Any]) -> Node[Any]:
        return LLMNode(
            data=LLMNodeData.model_validate(payload),
            model_instance=self._model(payload),
            llm_file_saver=_TextOnlyFiles(),
            prompt_message_serializer=_Prompts(),
            jinja2_template_renderer=_Jinja2(),
            default_query_selector=("sys", "query"),
            **common,
        )

    def _build_question_classifier(self, common: dict[str, Any], payload: Mapping[str, Any]) -> Node[Any]:
        dependencies = QuestionClassifierNodeDependencies(
            model_instance=self._model(payload),
            template_renderer=_Jinja2(),
            llm_file_saver=_TextOnlyFiles(),
            prompt_message_serializer=_Prompts(),
        )
        data = QuestionClassifierNodeData.model_validate(payload)
        return QuestionClassifierNode(data=data, dependencies=dependencies, **common)

    def _build_parameter_extractor(self, common: dict[str, Any], payload: Mapping[str, Any]) -> Node[Any]:
        data = ParameterExtractorNodeData.model_validate(payload)
        node: Node[Any] = ParameterExtractorNode(
            common["node_id"],
            data,
            init_params=self.init_params,
            runtime_state=self.runtime_state,
            model_instance=self._model(payload),
            prompt_message_serializer=_Prompts(),
        )
        return node

    def _build_human_input(self, common: dict[str, Any], payload: Mapping[str, Any]) -> Node[Any]:
        data = HumanInputNodeData.model_validate(payload)
        return HumanInputNode(data=data, hitl_callback=self.collaborators.human_input, **common)


def _type_and_payload(node_config: NodeConfigDict) -> tuple[str, dict[str, Any]]:
    data = node_config["data"]
    payload: dict[str, Any] = data.model_dump(mode="python") if hasattr(data, "model_dump") else dict(data)
    return str(payload["type"]), payload


#: graphon's names for the types above, checked against its enum so that a rename fails here first.
assert {value for name, value in vars(BuiltinNodeTypes).items() if name.isupper()} >= SUPPORTED
