"""The Chat Completions answer shapes: ``chat.completion`` and ``chat.completion.chunk``.

Used for OpenAPI and tests (the relay path does not re-validate upstream bodies). Unknown keys
are allowed (``extra="allow"``): upstreams add fields (``reasoning_content``, ``service_tier``,
``obfuscation``) that a client may still want to see.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletionChunk",
    "ChatCompletionResponse",
    "ChatDelta",
    "ChatLogprobs",
    "ChatMessageOut",
    "ChatUsage",
    "TokenLogprob",
    "ToolCallDelta",
    "ToolCallOut",
]

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TopLogprob(_Open):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Open):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class FunctionOut(_Open):
    name: str
    arguments: str


class ToolCallOut(_Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionOut


class ChatMessageOut(_Open):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(_Open):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatUsage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionResponse(_Open):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    system_fingerprint: str | None = None
    usage: ChatUsage | None = None


class FunctionDelta(_Open):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Open):
    """One piece of a streamed call: ``id``/``type``/``name`` only in the first piece of each ``index``."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class ChatDelta(_Open):
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Open):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(_Open):
    """A streamed chunk: ``usage`` is null except on the final usage chunk, whose ``choices`` is empty."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    system_fingerprint: str | None = None
    usage: ChatUsage | None = None
