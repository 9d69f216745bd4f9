"""Our model runtime for graphon's llm, question-classifier and parameter-extractor nodes.

graphon calls a model through its ``LLMProtocol``; Dify's plugin daemon is not here, so this module is
that adapter: the simulated model by default (deterministic, no network: what the tests and the demo
run), or any OpenAI-compatible ``/chat/completions`` endpoint when ``WORKFLOW_MODEL_BASE_URL`` is set.

Both check the run's :class:`StopSignal` between chunks. graphon's dispatcher only looks at its command
channel between nodes, so without this a stop would wait for the model's whole answer.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

import httpx
from graphon.model_runtime.entities.common_entities import I18nObject
from graphon.model_runtime.entities.llm_entities import (
    LLMMode,
    LLMResult,
    LLMResultChunk,
    LLMResultChunkDelta,
    LLMResultChunkWithStructuredOutput,
    LLMResultWithStructuredOutput,
    LLMUsage,
)
from graphon.model_runtime.entities.message_entities import (
    AssistantPromptMessage,
    PromptMessage,
    PromptMessageRole,
    PromptMessageTool,
)
from graphon.model_runtime.entities.model_entities import AIModelEntity, FetchFrom, ModelPropertyKey, ModelType
from graphon.nodes.llm.runtime_protocols import LLMProtocol

_TOKEN = re.compile(r"\s*\S+\s*|\s+")
#: The provider name a DSL may give to ask for the simulated model whatever the settings say.
SIMULATED = "simulated"


class RunStopped(Exception):
    """The run was stopped while the model was answering."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StopSignal:
    """A run's stop, set once by whoever notices it first, read by the model between chunks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self.event = threading.Event()

    def set(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self.event.set()

    @property
    def reason(self) -> str | None:
        return self._reason

    def check(self) -> None:
        """Raises RunStopped once the run is stopped."""
        if self._reason is not None:
            raise RunStopped(self._reason)


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """What the runtime needs of the app's settings (``WORKFLOW_LLM_TOKEN_DELAY``, ``WORKFLOW_MODEL_*``)."""

    token_delay: float = 0.02
    base_url: str | None = None
    api_key: str | None = None
    timeout: float = 60.0


def count_tokens(text: str) -> int:
    """The simulated model's tokenizer: a word with the spaces around it is one token."""
    return len(_TOKEN.findall(text))


def _usage(prompt_tokens: int, completion_tokens: int, latency: float) -> LLMUsage:
    usage = LLMUsage.empty_usage()
    usage.prompt_tokens = prompt_tokens
    usage.completion_tokens = completion_tokens
    usage.total_tokens = prompt_tokens + completion_tokens
    usage.total_price = Decimal(0)
    usage.latency = latency
    return usage


class _Model(LLMProtocol):
    """What both models share: identity, parameters, schema, the non-streaming and structured calls."""

    def __init__(self, provider: str, model_name: str, parameters: Mapping[str, Any], signal: StopSignal) -> None:
        self._provider = provider
        self._model_name = model_name
        self._parameters: Mapping[str, Any] = dict(parameters)
        self.signal = signal

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def parameters(self) -> Mapping[str, Any]:
        return self._parameters

    @parameters.setter
    def parameters(self, value: Mapping[str, Any]) -> None:
        self._parameters = dict(value)

    @property
    def stop(self) -> Sequence[str] | None:
        return None

    def get_model_schema(self) -> AIModelEntity:
        return AIModelEntity(
            model=self._model_name,
            label=I18nObject(en_US=self._model_name),
            model_type=ModelType.LLM,
            fetch_from=FetchFrom.CUSTOMIZABLE_MODEL,
            model_properties={ModelPropertyKey.MODE: LLMMode.CHAT.value, ModelPropertyKey.CONTEXT_SIZE: 128_000},
        )

    def get_llm_num_tokens(self, prompt_messages: Sequence[PromptMessage]) -> int:
        return sum(count_tokens(message.get_text_content()) for message in prompt_messages)

    def _stream(self, prompt_messages: Sequence[PromptMessage]) -> Iterator[str]:
        raise NotImplementedError

    def invoke_llm(  # type: ignore[override]
        self,
        *,
        prompt_messages: Sequence[PromptMessage],
        model_parameters: Mapping[str, Any],
        tools: Sequence[PromptMessageTool] | None,
        stop: Sequence[str] | None,
        stream: bool,
    ) -> LLMResult | Generator[LLMResultChunk, None, None]:
        chunks = self._chunks(prompt_messages)
        if stream:
            return chunks
        text, usage = "", _usage(0, 0, 0.0)
        for chunk in chunks:
            text += chunk.delta.message.get_text_content()
            usage = chunk.delta.usage or usage
        return LLMResult(
            model=self._model_name,
            prompt_messages=list(prompt_messages),
            message=AssistantPromptMessage(content=text),
            usage=usage,
        )

    def _chunks(self, prompt_messages: Sequence[PromptMessage]) -> Generator[LLMResultChunk, None, None]:
        started = time.monotonic()
        completion = 0
        for index, piece in enumerate(self._stream(prompt_messages)):
            completion += 1
            yield LLMResultChunk(
                model=self._model_name,
                delta=LLMResultChunkDelta(index=index, message=AssistantPromptMessage(content=piece)),
            )
        usage = _usage(self.get_llm_num_tokens(prompt_messages), completion, time.monotonic() - started)
        yield LLMResultChunk(
            model=self._model_name,
            delta=LLMResultChunkDelta(
                index=completion, message=AssistantPromptMessage(content=""), usage=usage, finish_reason="stop"
            ),
        )

    def invoke_llm_with_structured_output(  # type: ignore[override]
        self,
        *,
        prompt_messages: Sequence[PromptMessage],
        json_schema: Mapping[str, Any],
        model_parameters: Mapping[str, Any],
        stop: Sequence[str] | None,
        stream: bool,
    ) -> LLMResultWithStructuredOutput | Generator[LLMResultChunkWithStructuredOutput, None, None]:
        raise NotImplementedError("structured output is not supported by this model runtime")

    def is_structured_output_parse_error(self, error: Exception) -> bool:
        return False


class SimulatedModel(_Model):
    """A deterministic model: answers the text of a trailing assistant message of the prompt (a scripted
    answer), else ``You said: <the last user message>``, one word at a time, ``token_delay`` apart.

    Its parameters (the DSL's ``completion_params``) may set ``token_delay`` and, to test failures,
    ``error_after_tokens`` and ``error``.
    """

    def __init__(
        self, provider: str, model_name: str, parameters: Mapping[str, Any], signal: StopSignal, token_delay: float
    ) -> None:
        super().__init__(provider, model_name, parameters, signal)
        self._token_delay = token_delay

    def _stream(self, prompt_messages: Sequence[PromptMessage]) -> Iterator[str]:
        text = _answer(prompt_messages)
        delay = float(self.parameters.get("token_delay", self._token_delay))
        fail_after = self.parameters.get("error_after_tokens")
        for index, token in enumerate(_TOKEN.findall(text)):
            if fail_after is not None and index >= int(fail_after):
                raise RuntimeError(str(self.parameters.get("error", "the model failed")))
            self.signal.check()
            # Waits on the stop itself: a stop during the delay ends the answer at once.
            if delay > 0 and self.signal.event.wait(delay):
                self.signal.check()
            yield token


def _answer(prompt_messages: Sequence[PromptMessage]) -> str:
    if prompt_messages and prompt_messages[-1].role == PromptMessageRole.ASSISTANT:
        return prompt_messages[-1].get_text_content()
    users = [message for message in prompt_messages if message.role == PromptMessageRole.USER]
    said = users[-1].get_text_content() if users else ""
    return f"You said: {said}"


class OpenAICompatibleModel(_Model):
    """``POST {base_url}/chat/completions`` with ``stream: true``, read as server-sent events."""

    def __init__(
        self,
        provider: str,
        model_name: str,
        parameters: Mapping[str, Any],
        signal: StopSignal,
        settings: ModelSettings,
    ) -> None:
        super().__init__(provider, model_name, parameters, signal)
        self._settings = settings

    def _stream(self, prompt_messages: Sequence[PromptMessage]) -> Iterator[str]:
        assert self._settings.base_url is not None
        headers = {"Authorization": f"Bearer {self._settings.api_key}"} if self._settings.api_key else {}
        body = {
            **{key: value for key, value in self.parameters.items() if key in ("temperature", "top_p", "max_tokens")},
            "model": self._model_name,
            "stream": True,
            "messages": [{"role": m.role.value, "content": m.get_text_content()} for m in prompt_messages],
        }
        url = self._settings.base_url.rstrip("/") + "/chat/completions"
        with (
            httpx.Client(timeout=self._settings.timeout) as client,
            client.stream("POST", url, json=body, headers=headers) as response,
        ):
            response.raise_for_status()
            for line in response.iter_lines():
                self.signal.check()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                choices = json.loads(data).get("choices") or [{}]
                piece = (choices[0].get("delta") or {}).get("content")
                if piece:
                    yield str(piece)


def model_for(
    provider: str, model_name: str, parameters: Mapping[str, Any], signal: StopSignal, settings: ModelSettings
) -> LLMProtocol:
    """The model a node's ``model`` block names: the endpoint of the settings, or the simulated model."""
    if settings.base_url and provider != SIMULATED:
        return OpenAICompatibleModel(provider, model_name, parameters, signal, settings)
    return SimulatedModel(provider, model_name, parameters, signal, settings.token_delay)
