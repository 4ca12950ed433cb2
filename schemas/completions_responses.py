"""The Completions API's answer shapes: a ``text_completion`` and its streamed chunks.

Used by the mock backend, the OpenAPI document and tests; the relay path does not re-validate
upstream bodies.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["Choice", "CompletionChunk", "CompletionResponse", "Logprobs", "Usage"]


class Logprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = Field(default_factory=list)


class Choice(BaseModel):
    text: str
    index: int
    logprobs: Logprobs | None = None
    finish_reason: Literal["stop", "length", "content_filter"] | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[Choice]
    system_fingerprint: str | None = None
    usage: Usage | None = None


class CompletionChunk(CompletionResponse):
    """A streamed chunk: the same shape, ``usage`` null except on the final usage chunk."""
