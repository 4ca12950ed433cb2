"""The input items of a Responses request: messages and their content parts, tool calls and their outputs,
reasoning items, references, and the items of OpenAI's hosted tools.

Split from :mod:`schemas.responses` so the request module stays readable. Shapes follow the
openai SDK's ``ResponseInputItemParam`` (3.57: the current API, with ``namespace`` on calls,
``phase`` on assistant messages, ``prompt_cache_breakpoint`` on parts). Items the gateway
translates (messages, ``function_call``, ``function_call_output``, ``reasoning``, custom tool
calls, ``item_reference``) are strict models that refuse unknown keys by name; the items of
OpenAI's hosted tools (``web_search_call``, ``mcp_call``, ``computer_call_output``, ...) only
OpenAI can take, so their type is checked here and their body is left to OpenAI (JSON-safe,
refused by name on every other backend).

An item without ``type`` is a message when it has a ``role``, else an ``item_reference``
(OpenAI's two untyped forms).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StrictBool, Tag, model_validator

from schemas.common import JsonObject, NonEmpty, _json_safe
from schemas.errors import FieldRuleError

__all__ = [
    "HOSTED_ITEM_TYPES",
    "ITEM_TAGS",
    "MESSAGE_ITEM_TYPES",
    "CustomToolCallItem",
    "CustomToolCallOutputItem",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "HostedItem",
    "InputFile",
    "InputImage",
    "InputItem",
    "InputPart",
    "InputText",
    "ItemReference",
    "MessageItem",
    "MessagePart",
    "OpenAIOwned",
    "OutputText",
    "ReasoningItem",
    "ReasoningText",
    "RefusalPart",
    "SummaryText",
    "item_text",
]

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False, populate_by_name=True)


class CacheBreakpoint(_Strict):
    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | None = None


# --- content parts ------------------------------------------------------------------------


class InputText(_Strict):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputImage(_Strict):
    """An image by URL (https or ``data:``) or by OpenAI file id: exactly one of the two."""

    type: Literal["input_image"]
    image_url: NonEmpty | None = None
    file_id: NonEmpty | None = None
    detail: Literal["auto", "low", "high", "original"] | None = None
    prompt_cache_breakpoint: CacheBreakpoint | None = None

    @model_validator(mode="after")
    def _one_source(self) -> InputImage:
        if (self.image_url is None) == (self.file_id is None):
            raise FieldRuleError("image_url", "an input_image needs exactly one of image_url and file_id")
        return self


class InputFile(_Strict):
    """A file as base64 data, an OpenAI file id or a URL: exactly one of the three."""

    type: Literal["input_file"]
    file_data: NonEmpty | None = None
    file_id: NonEmpty | None = None
    file_url: NonEmpty | None = None
    filename: str | None = None
    detail: Literal["auto", "low", "high"] | None = None
    prompt_cache_breakpoint: CacheBreakpoint | None = None

    @model_validator(mode="after")
    def _one_source(self) -> InputFile:
        given = [n for n in ("file_data", "file_id", "file_url") if getattr(self, n) is not None]
        if len(given) != 1:
            raise FieldRuleError("file_data", "an input_file needs exactly one of file_data, file_id and file_url")
        return self


class OutputText(_Strict):
    """Text the assistant produced (an earlier turn's output, sent back as input)."""

    type: Literal["output_text"]
    text: str
    annotations: list[JsonObject] | None = None  # citations OpenAI's tools added; nothing to translate
    logprobs: list[JsonObject] | None = None


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: str


InputPart = Annotated[InputText | InputImage | InputFile, Field(discriminator="type")]
MessagePart = Annotated[InputText | InputImage | InputFile | OutputText | RefusalPart, Field(discriminator="type")]


# --- items ------------------------------------------------------------------------------------


class MessageItem(_Strict):
    """A message. ``output_text`` and ``refusal`` parts belong to the assistant (checked by the request,
    which can say which item it was)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[MessagePart]
    id: NonEmpty | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class Caller(_Strict):
    type: Literal["direct", "program"]
    caller_id: NonEmpty | None = None


class FunctionCallItem(_Strict):
    """A function call the model made (``namespace``: the namespace tool it belongs to)."""

    type: Literal["function_call"]
    call_id: NonEmpty
    name: NonEmpty
    arguments: str  # JSON text as the model produced it (not re-validated: it may be invalid)
    id: NonEmpty | None = None
    namespace: NonEmpty | None = None
    status: ItemStatus | None = None
    caller: Caller | None = None
    async_: StrictBool | None = Field(default=None, alias="async")


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: NonEmpty
    output: str | list[InputPart]
    id: NonEmpty | None = None
    name: NonEmpty | None = None
    namespace: NonEmpty | None = None
    status: ItemStatus | None = None
    caller: Caller | None = None


class SummaryText(_Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Strict):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Strict):
    """An earlier turn's reasoning: its summary, its text (open models), or OpenAI's encrypted form."""

    type: Literal["reasoning"]
    id: NonEmpty | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


class ItemReference(_Strict):
    """An item of an earlier response, by id (OpenAI resolves it from its own store)."""

    type: Literal["item_reference"] = "item_reference"
    id: NonEmpty


class CustomToolCallItem(_Strict):
    type: Literal["custom_tool_call"]
    call_id: NonEmpty
    name: NonEmpty
    input: str
    id: NonEmpty | None = None
    namespace: NonEmpty | None = None
    caller: Caller | None = None


class CustomToolCallOutputItem(_Strict):
    type: Literal["custom_tool_call_output"]
    call_id: NonEmpty
    output: str | list[InputPart]
    id: NonEmpty | None = None
    caller: Caller | None = None


# Items of OpenAI's hosted tools and server-side features: only the openai backend takes them.
HOSTED_ITEM_TYPES: tuple[str, ...] = (
    "file_search_call", "computer_call", "computer_call_output", "web_search_call", "tool_search_call",
    "tool_search_output", "additional_tools", "configuration_update", "compaction", "compaction_trigger",
    "image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output", "shell_call",
    "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request",
    "mcp_approval_response", "mcp_call", "program", "program_output",
)  # fmt: skip


class OpenAIOwned(BaseModel):
    """Something only OpenAI interprets (a hosted tool's item, a built-in tool's options): the
    subclass checks its ``type``, the rest is OpenAI's to validate, JSON-safe (forwarded as sent)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _json_safe_body(self) -> OpenAIOwned:
        _json_safe(self.__pydantic_extra__)
        return self


class HostedItem(OpenAIOwned):
    """An item of OpenAI's hosted tools (``web_search_call``, ``mcp_call``, ...)."""

    type: Literal[HOSTED_ITEM_TYPES]  # type: ignore[valid-type]
    id: str | None = None


def _null_is_default(default: str) -> Any:
    return BeforeValidator(lambda value: default if value is None else value)


class _NullTypedMessage(MessageItem):
    """A message sent with ``"type": null``: null is the default, as for every optional field (an
    openai SDK model dumped whole sends it). Its own member, so no other message pays the check."""

    type: Annotated[Literal["message"], _null_is_default("message")] = "message"


class _NullTypedReference(ItemReference):
    type: Annotated[Literal["item_reference"], _null_is_default("item_reference")] = "item_reference"


# A message item's classes (the null-typed one is a subclass): for checks by exact type, which cost
# no ABCMeta call where isinstance of a model that is not the object's class does.
MESSAGE_ITEM_TYPES: frozenset[type[MessageItem]] = frozenset({MessageItem, _NullTypedMessage})


def item_text(item: Any) -> str:
    """An item's text, for estimates and routing: message text, call names and arguments, outputs, reasoning."""
    kind = type(item)
    if kind in MESSAGE_ITEM_TYPES:
        content: Any = item.content
        if type(content) is str:
            return content
        return "".join(
            part.text if type(part) in _TEXT_PARTS else part.refusal if type(part) is RefusalPart else ""
            for part in content
        )
    if kind is FunctionCallItem:
        call: str = item.name + item.arguments
        return call
    if kind is FunctionCallOutputItem:
        output = item.output
        return output if type(output) is str else "".join(getattr(p, "text", "") for p in output)
    if kind is ReasoningItem:
        return "".join(p.text for p in item.content or ()) + "".join(p.text for p in item.summary)
    return ""


_TEXT_PARTS = frozenset({InputText, OutputText})  # (by exact type: see MESSAGE_ITEM_TYPES)


def _item_tag(value: Any) -> str | None:
    """The item's union tag: its ``type``; untyped (or null), a message when it has a ``role``, else a reference."""
    if isinstance(value, dict):
        kind = value.get("type")
        if kind is None:
            if "type" in value:
                return "message-null" if "role" in value else "item_reference-null"
            return "message" if "role" in value else "item_reference"
        return kind if isinstance(kind, str) else None
    return getattr(value, "type", None)


_TRANSLATED: dict[str, type[BaseModel]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
    "item_reference": ItemReference,
    "custom_tool_call": CustomToolCallItem,
    "custom_tool_call_output": CustomToolCallOutputItem,
}
ITEM_TAGS: frozenset[str] = frozenset((*_TRANSLATED, *HOSTED_ITEM_TYPES))

# The union is built from the type lists (one member per tag), so a new hosted type is one entry above.
_MEMBERS: tuple[Any, ...] = (
    *(Annotated[model, Tag(tag)] for tag, model in _TRANSLATED.items()),
    Annotated[_NullTypedMessage, Tag("message-null")],
    Annotated[_NullTypedReference, Tag("item_reference-null")],
    *(Annotated[HostedItem, Tag(tag)] for tag in HOSTED_ITEM_TYPES),
)
if TYPE_CHECKING:
    InputItem = (
        MessageItem
        | FunctionCallItem
        | FunctionCallOutputItem
        | ReasoningItem
        | ItemReference
        | CustomToolCallItem
        | CustomToolCallOutputItem
        | HostedItem
    )
else:
    InputItem = Annotated[
        Union[_MEMBERS],  # noqa: UP007 - a union of a computed tuple of members
        Discriminator(
            _item_tag,
            custom_error_type="item_type",
            custom_error_message=f"unknown item type; expected one of {', '.join(sorted(ITEM_TAGS))}",
        ),
    ]
