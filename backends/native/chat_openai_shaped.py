"""Reading chat servers that answer in OpenAI's own shape (TGI's Messages API, llama.cpp's server).

Both take OpenAI's messages and tools and answer ``chat.completion`` / ``chat.completion.chunk``
bodies, each with its quirks; :class:`OpenAIShapedChat` reads either into
:class:`~backends.native.chat.ChatPiece`s and the subclass says what differs: the body it
sends, its finish reasons, and whether its tool-call ids can be passed on.

Tolerated shapes (seen in the servers' history): ``tool_calls`` as one object instead of a
list (TGI 2.x), ``arguments`` as a JSON object instead of a string (TGI 2.x), ids ``""``,
a usage-only chunk with ``choices: []`` after the finish (llama.cpp) or usage on the
finishing chunk (TGI). Not tolerated (an upstream error, never dropped or guessed): a
whole answer without ``finish_reason``, ``tool_calls`` or a ``delta`` that are not objects,
``content`` that is not a string, arguments that are neither text nor an object. A native
error event (``{"error": ...}``) ends the stream with an error naming what the server said
(redacted, bounded: ``backends.error_bodies.error_fields``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from backends.base import TokenUsage
from backends.errors import UpstreamProtocolError
from backends.native.chat import (
    CallPiece,
    ChatPiece,
    ChatTranslator,
    arguments_text,
    as_dict,
    call_objects,
    chat_logprobs,
    text_field,
)
from backends.native.common import count, finish_of, upstream_failed
from schemas.chat import ChatCompletionRequest
from schemas.chat_messages import DeveloperMessage

__all__ = ["OpenAIShapedChat", "openai_messages", "openai_tools"]


def openai_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The conversation as sent: OpenAI's shape, ``developer`` as ``system`` (neither server knows it)."""
    out = []
    for message in request.messages:
        data = message.model_dump(exclude_none=True, by_alias=True)
        if isinstance(message, DeveloperMessage):
            data["role"] = "system"
        out.append(data)
    return out


def openai_tools(request: ChatCompletionRequest, *, strict: bool) -> list[dict[str, Any]] | None:
    """Function tools as sent; ``strict`` dropped where the server constrains arguments anyway."""
    if not request.tools:
        return None
    tools = [tool.model_dump(exclude_none=True, by_alias=True) for tool in request.tools]
    if not strict:
        for tool in tools:
            tool["function"].pop("strict", None)
    return tools


def _usage(obj: Any) -> TokenUsage | None:
    if not isinstance(obj, dict):
        return None
    prompt, completion = count(obj.get("prompt_tokens")), count(obj.get("completion_tokens"))
    if prompt is None or completion is None:  # absent or not a plausible count: estimated instead
        return None
    return TokenUsage(prompt, completion)


class OpenAIShapedChat(ChatTranslator):
    path = "/v1/chat/completions"
    framing = "sse"
    finishes: ClassVar[Mapping[str, str]]  # the server's finish reasons -> OpenAI's
    trusts_call_ids: ClassVar[bool] = True  # False: the server's ids are not unique ("", "0")

    def _finish(self, reason: Any) -> str | None:
        return None if reason is None else finish_of(self.finishes, reason, self.backend)

    def _answer_finish(self, reason: Any) -> str:
        """A whole answer's finish reason: required (a missing one is never taken for ``stop``)."""
        mapped = self._finish(reason)
        if mapped is None:
            raise UpstreamProtocolError("the upstream sent a chat answer without a finish_reason", backend=self.backend)
        return mapped

    def _calls(self, raw: Any) -> list[CallPiece]:
        calls = []
        for position, call in enumerate(call_objects(raw, self.backend)):
            function = as_dict(call.get("function"), "tool call function", self.backend)
            index = call.get("index")
            call_id = call.get("id") if self.trusts_call_ids else None
            calls.append(
                CallPiece(
                    index if isinstance(index, int) else position,
                    call_id if isinstance(call_id, str) and call_id else None,
                    function.get("name") if isinstance(function.get("name"), str) else None,
                    arguments_text(function.get("arguments"), self.backend),  # TGI 2.x: an object
                )
            )
        return calls

    def _logprobs(self, raw: Any) -> list[dict[str, Any]] | None:
        return chat_logprobs(raw.get("content")) if isinstance(raw, dict) else None

    def answer(self, obj: Any, request: ChatCompletionRequest) -> ChatPiece:
        choices = obj.get("choices") if isinstance(obj, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise UpstreamProtocolError("the upstream sent a chat answer without one choice", backend=self.backend)
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise UpstreamProtocolError("the upstream sent a chat choice without a message", backend=self.backend)
        return ChatPiece(
            content=text_field(message.get("content"), "message content", self.backend),
            reasoning=text_field(message.get("reasoning_content"), "message reasoning_content", self.backend),
            calls=self._calls(message.get("tool_calls")),
            logprobs=self._logprobs(choice.get("logprobs")),
            finish=self._answer_finish(choice.get("finish_reason")),
            usage=_usage(obj.get("usage")),
        )

    def event(self, obj: dict[str, Any], request: ChatCompletionRequest) -> ChatPiece | None:
        if "error" in obj:
            raise upstream_failed(self.backend, obj)
        usage = _usage(obj.get("usage"))
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            if choices is not None and not isinstance(choices, list):  # not a usage-only chunk: a lie
                raise UpstreamProtocolError(
                    "the upstream sent a chunk whose choices is not a list", backend=self.backend
                )
            return ChatPiece(usage=usage) if usage is not None else None
        choice = choices[0]
        if len(choices) != 1 or not isinstance(choice, dict):
            raise UpstreamProtocolError("the upstream sent a chunk with several choices", backend=self.backend)
        delta = as_dict(choice.get("delta"), "chunk delta", self.backend)
        return ChatPiece(
            content=text_field(delta.get("content"), "delta content", self.backend),
            reasoning=text_field(delta.get("reasoning_content"), "delta reasoning_content", self.backend),
            calls=self._calls(delta.get("tool_calls")),
            logprobs=self._logprobs(choice.get("logprobs")),
            finish=self._finish(choice.get("finish_reason")),
            usage=usage,
        )
