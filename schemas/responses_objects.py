"""The Responses answer shapes: the Response object, its output items, usage, and the stream events.

Used for OpenAPI and tests, and as the contract the translators build to (the bridge writes these
shapes as plain dicts, not through the models: the request path's cost). Unknown keys are
allowed (``extra="allow"``): OpenAI adds fields to its objects, and a client may want them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "RESPONSE_STATUSES",
    "TERMINAL_EVENTS",
    "FunctionCallOut",
    "IncompleteDetails",
    "InputTokensDetails",
    "OutputMessage",
    "OutputTextOut",
    "OutputTokensDetails",
    "ReasoningOut",
    "ResponseError",
    "ResponseObject",
    "ResponseStreamEvent",
    "ResponseUsage",
]

ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]
RESPONSE_STATUSES: tuple[str, ...] = ("completed", "failed", "in_progress", "cancelled", "queued", "incomplete")
# The events that end a stream: the last one a client gets (an ``error`` event may precede failed).
TERMINAL_EVENTS: tuple[str, ...] = ("response.completed", "response.incomplete", "response.failed")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class OutputTextOut(_Open):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] | None = None


class RefusalOut(_Open):
    type: Literal["refusal"] = "refusal"
    refusal: str


class OutputMessage(_Open):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputTextOut | RefusalOut]


class FunctionCallOut(_Open):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]
    namespace: str | None = None


class ReasoningOut(_Open):
    """The backend's reasoning: ``content`` (reasoning_text parts), ``summary`` when asked for."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = []
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class InputTokensDetails(_Open):
    cached_tokens: int = 0


class OutputTokensDetails(_Open):
    reasoning_tokens: int = 0


class ResponseUsage(_Open):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(_Open):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(_Open):
    code: str
    message: str


class ResponseObject(_Open):
    """OpenAI's Response object; ``model`` is the name the client asked for."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: ResponseStatus
    model: str
    output: list[OutputMessage | FunctionCallOut | ReasoningOut | dict[str, Any]]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | list[Any] | None = None
    usage: ResponseUsage | None = None
    metadata: dict[str, str] = {}
    parallel_tool_calls: bool = True
    tool_choice: Any = "auto"
    tools: list[Any] = []
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None


class ResponseStreamEvent(_Open):
    """One streamed event (``event: <type>`` / ``data: {...}``): ``sequence_number`` counts from 0."""

    type: str
    sequence_number: int
