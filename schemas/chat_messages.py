"""The nested pieces of a Chat Completions request: messages, content parts, tools and their choices.

Split from :mod:`schemas.chat` so that the request module stays readable; every model here
is strict (``"5"`` is not an int, ``1`` is not a bool) and refuses unknown keys by name,
like the request itself. Unions are discriminated by ``role`` / ``type`` so that an error
points at the member the client meant instead of listing every alternative.

Shapes follow OpenAI's ``CreateChatCompletionRequest`` (spec chat-protocol.md section 1).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from schemas.common import JsonObject

__all__ = [
    "AllowedToolsChoice",
    "AssistantMessage",
    "ChatMessage",
    "ContentPart",
    "CustomTool",
    "CustomToolCall",
    "DeveloperMessage",
    "FilePart",
    "FunctionCallChoice",
    "FunctionDefinition",
    "FunctionMessage",
    "FunctionTool",
    "FunctionToolCall",
    "ImageURLPart",
    "InputAudioPart",
    "JSONObjectResponseFormat",
    "JSONSchemaResponseFormat",
    "JSONSchemaSpec",
    "NamedCustomChoice",
    "NamedFunctionChoice",
    "RefusalPart",
    "ResponseFormat",
    "SystemMessage",
    "TextPart",
    "TextResponseFormat",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolMessage",
    "UserMessage",
    "message_text",
    "message_upstream_fields",
]

# A tool or json_schema name: OpenAI's own rule (a-z, A-Z, 0-9, underscores and dashes, at most 64).
Name = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
NonEmpty = Annotated[str, Field(min_length=1)]
# A participant's name: no control characters (NUL, newlines, ...). Templates render it into the
# prompt next to role markers, where a newline could start a turn of its own; OpenAI refuses even
# whitespace in it.
ParticipantName = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


# --- content parts ------------------------------------------------------------------------


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageURL(_Strict):
    url: NonEmpty  # an https URL or a data: URL; backends that take only one kind refuse the other
    detail: Literal["auto", "low", "high"] | None = None


class ImageURLPart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL


class InputAudio(_Strict):
    data: NonEmpty  # base64
    format: Literal["wav", "mp3"]


class InputAudioPart(_Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


class FileRef(_Strict):
    file_data: NonEmpty | None = None
    file_id: NonEmpty | None = None
    filename: str | None = None


class FilePart(_Strict):
    type: Literal["file"]
    file: FileRef


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[TextPart | ImageURLPart | InputAudioPart | FilePart, Field(discriminator="type")]
AssistantPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]
TextParts = Annotated[list[TextPart], Field(min_length=1)]


# --- tool calls an assistant made ----------------------------------------------------------


class FunctionCall(_Strict):
    name: NonEmpty
    arguments: str  # JSON text, as the model produced it (not re-validated: it may be invalid)


class FunctionToolCall(_Strict):
    id: NonEmpty
    type: Literal["function"]
    function: FunctionCall


class CustomCall(_Strict):
    name: NonEmpty
    input: str


class CustomToolCall(_Strict):
    id: NonEmpty
    type: Literal["custom"]
    custom: CustomCall


ToolCall = Annotated[FunctionToolCall | CustomToolCall, Field(discriminator="type")]


class AudioRef(_Strict):
    id: NonEmpty


# --- messages ------------------------------------------------------------------------------


class SystemMessage(_Strict):
    role: Literal["system"]
    content: str | TextParts
    name: ParticipantName | None = None


class DeveloperMessage(_Strict):
    role: Literal["developer"]
    content: str | TextParts
    name: ParticipantName | None = None


class UserMessage(_Strict):
    role: Literal["user"]
    content: str | Annotated[list[ContentPart], Field(min_length=1)]
    name: ParticipantName | None = None


class AssistantMessage(_Strict):
    """``content`` may be null only when the message carries ``tool_calls``, ``function_call`` or
    ``audio`` (checked by the request, which can say which message it was)."""

    role: Literal["assistant"]
    content: str | Annotated[list[AssistantPart], Field(min_length=1)] | None = None
    refusal: str | None = None
    name: ParticipantName | None = None
    audio: AudioRef | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = None
    function_call: FunctionCall | None = None  # deprecated by OpenAI, still accepted


class ToolMessage(_Strict):
    role: Literal["tool"]
    content: str | TextParts
    tool_call_id: NonEmpty  # required: it ties the result to the call


class FunctionMessage(_Strict):
    """Deprecated by OpenAI (use ``tool``), still accepted by its API."""

    role: Literal["function"]
    content: str | None
    name: NonEmpty


ChatMessage = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage,
    Field(discriminator="role"),
]
_ROLE_CONTENT = frozenset({"role", "content"})


def message_upstream_fields(message: ChatMessage) -> dict[str, Any]:
    """A message as the upstream gets it (set, non-null fields; wire names). The common
    ``{"role", "content": str}`` is built directly (a third of the serializer's cost, issue 14);
    any other goes through its model's serializer."""
    if type(message.content) is str and message.__pydantic_fields_set__ <= _ROLE_CONTENT:
        return {"role": message.role, "content": message.content}
    return message.__pydantic_serializer__.to_python(  # type: ignore[no-any-return]
        message, by_alias=True, exclude_unset=True, exclude_none=True
    )


def message_text(message: ChatMessage) -> str:
    """A message's text: string content, text/refusal parts, tool-call names and arguments.

    Attributes are read by type, never with ``getattr(..., default)``: a pydantic model's
    missing attribute costs an ``AttributeError`` (microseconds, on every request's estimate).
    """
    content = message.content  # every role has one
    if isinstance(content, str):
        text = content
    elif content is None:
        text = ""
    else:
        text = "".join(
            part.text if isinstance(part, TextPart) else part.refusal if isinstance(part, RefusalPart) else ""
            for part in content
        )
    if isinstance(message, AssistantMessage) and message.tool_calls:
        for call in message.tool_calls:
            text += str(call)
    return text


# --- tools the model may call ----------------------------------------------------------------


class FunctionDefinition(_Strict):
    name: Name
    description: str | None = None
    parameters: JsonObject | None = None  # a JSON schema; omitted means "no parameters"
    strict: StrictBool | None = None


class FunctionTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class TextFormat(_Strict):
    type: Literal["text"]


class Grammar(_Strict):
    syntax: Literal["lark", "regex"]
    definition: NonEmpty


class GrammarFormat(_Strict):
    type: Literal["grammar"]
    grammar: Grammar


class CustomDefinition(_Strict):
    name: Name
    description: str | None = None
    format: Annotated[TextFormat | GrammarFormat, Field(discriminator="type")] | None = None


class CustomTool(_Strict):
    type: Literal["custom"]
    custom: CustomDefinition


Tool = Annotated[FunctionTool | CustomTool, Field(discriminator="type")]


# --- tool_choice -----------------------------------------------------------------------------


class _ToolName(_Strict):
    name: NonEmpty


class NamedFunctionChoice(_Strict):
    type: Literal["function"]
    function: _ToolName


class NamedCustomChoice(_Strict):
    type: Literal["custom"]
    custom: _ToolName


class AllowedTools(_Strict):
    mode: Literal["auto", "required"]
    # Tool references as OpenAI writes them ({"type": "function", "function": {"name": ...}}).
    tools: Annotated[list[NamedFunctionChoice | NamedCustomChoice], Field(min_length=1)]


class AllowedToolsChoice(_Strict):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[NamedFunctionChoice | NamedCustomChoice | AllowedToolsChoice, Field(discriminator="type")]
)
FunctionCallChoice = Literal["none", "auto"] | _ToolName  # deprecated ``function_call``


# --- response_format -------------------------------------------------------------------------


class TextResponseFormat(_Strict):
    type: Literal["text"]


class JSONObjectResponseFormat(_Strict):
    type: Literal["json_object"]


class JSONSchemaSpec(_Strict):
    name: Name
    description: str | None = None
    # ``schema`` shadows a BaseModel attribute, hence the alias.
    schema_: JsonObject | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class JSONSchemaResponseFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = Annotated[
    TextResponseFormat | JSONObjectResponseFormat | JSONSchemaResponseFormat, Field(discriminator="type")
]
