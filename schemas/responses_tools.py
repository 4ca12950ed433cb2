"""The tools of a Responses request, ``tool_choice``, and the small option objects (``text``, ``reasoning``,
``prompt``, ``conversation``, ``stream_options``).

Function, custom and ``namespace`` tools (a named group of functions, as the Codex CLI sends)
are strict models: the gateway translates them for every backend. OpenAI's built-in tools
(``web_search``, ``file_search``, ``code_interpreter``, ``computer_use_preview``, ``mcp``,
``image_generation``, ``shell``, ...) run inside OpenAI: their ``type`` is checked here and their
options are OpenAI's to validate; every other backend refuses them by name (or, where the
operator chose ``responses.builtin_tools: omit``, leaves them out and says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag

from schemas.common import JsonObject, NonEmpty
from schemas.responses_items import InputFile, InputImage, InputText, OpenAIOwned

__all__ = [
    "BUILTIN_CHOICE_TYPES",
    "BUILTIN_TOOL_TYPES",
    "TOOL_TAGS",
    "TOOL_TYPE_MESSAGE",
    "AllowedToolsChoice",
    "BuiltinChoice",
    "BuiltinTool",
    "ConversationRef",
    "CustomTool",
    "FunctionChoice",
    "FunctionTool",
    "JSONObjectFormat",
    "JSONSchemaFormat",
    "NamespaceTool",
    "PromptRef",
    "ReasoningOptions",
    "ResponsesStreamOptions",
    "TextConfig",
    "TextFormat",
    "Tool",
    "ToolChoice",
]

# A tool or schema name: OpenAI's rule (a-z, A-Z, 0-9, underscores and dashes, at most 64).
Name = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False, populate_by_name=True)


# --- tools ------------------------------------------------------------------------------------

Callers = Annotated[list[Literal["direct", "programmatic"]], Field(min_length=1)]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Name
    description: str | None = None
    parameters: JsonObject | None = None  # a JSON schema; null or omitted: no parameters
    strict: StrictBool | None = None
    defer_loading: StrictBool | None = None
    allowed_callers: Callers | None = None
    output_schema: JsonObject | None = None


class Grammar(_Strict):
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: NonEmpty


class PlainText(_Strict):
    type: Literal["text"]


class CustomTool(_Strict):
    """A tool whose input is free text (optionally under a grammar)."""

    type: Literal["custom"]
    name: Name
    description: str | None = None
    format: Annotated[PlainText | Grammar, Field(discriminator="type")] | None = None
    defer_loading: StrictBool | None = None
    allowed_callers: Callers | None = None


class NamespaceTool(_Strict):
    """A named group of tools; the model calls ``<name>`` of namespace ``<namespace>``."""

    type: Literal["namespace"]
    name: Name
    description: str
    tools: Annotated[
        list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]], Field(min_length=1, max_length=128)
    ]


BUILTIN_TOOL_TYPES: tuple[str, ...] = (
    "web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11", "file_search",
    "code_interpreter", "computer", "computer_use_preview", "mcp", "image_generation", "local_shell", "shell",
    "apply_patch", "tool_search", "programmatic_tool_calling",
)  # fmt: skip


class BuiltinTool(OpenAIOwned):
    """One of OpenAI's built-in tools: the type is checked, the options are OpenAI's."""

    type: Literal[BUILTIN_TOOL_TYPES]  # type: ignore[valid-type]


def _type_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else None


TOOL_TAGS: frozenset[str] = frozenset(("function", "custom", "namespace", *BUILTIN_TOOL_TYPES))

# The tools' union is told apart by its "type" key, read by pydantic itself: a Python discriminator
# (a callable) is handed the tool as Python data, so pydantic makes the whole tool (a JSON Schema of
# hundreds of nodes) into Python objects first, only to read its type (issue 21: half again the cost
# of validating an agent's tool). The errors of a tool whose type is missing, unknown or that is no
# object are pydantic's own union errors here; gateway/http/validation.py words them as before
# (TOOL_TYPE_MESSAGE, "expected an object").
TOOL_TYPE_MESSAGE = f"unknown tool type; expected one of {', '.join(sorted(TOOL_TAGS))}"
if TYPE_CHECKING:
    Tool = FunctionTool | CustomTool | NamespaceTool | BuiltinTool
else:
    Tool = Annotated[FunctionTool | CustomTool | NamespaceTool | BuiltinTool, Field(discriminator="type")]


# --- tool_choice ------------------------------------------------------------------------------


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: NonEmpty


class CustomChoice(_Strict):
    type: Literal["custom"]
    name: NonEmpty


class McpChoice(_Strict):
    type: Literal["mcp"]
    server_label: NonEmpty
    name: NonEmpty | None = None


BUILTIN_CHOICE_TYPES: tuple[str, ...] = (
    "file_search", "web_search_preview", "web_search_preview_2025_03_11", "computer", "computer_use_preview",
    "computer_use", "image_generation", "code_interpreter", "shell", "apply_patch", "programmatic_tool_calling",
)  # fmt: skip


class BuiltinChoice(_Strict):
    """Force one of OpenAI's built-in tools."""

    type: Literal[BUILTIN_CHOICE_TYPES]  # type: ignore[valid-type]


class ToolRef(OpenAIOwned):
    """A built-in tool named in ``allowed_tools`` (``{"type": "mcp", "server_label": ...}``): options OpenAI's."""

    type: NonEmpty
    name: NonEmpty | None = None


class FunctionRef(_Strict):
    """A function or custom tool named in ``allowed_tools``: the gateway translates it, so it is checked."""

    type: Literal["function", "custom"]
    name: NonEmpty


def _ref_tag(value: Any) -> str:
    return "named" if _type_tag(value) in ("function", "custom") else "builtin"


AllowedRef = Annotated[
    Annotated[FunctionRef, Tag("named")] | Annotated[ToolRef, Tag("builtin")], Discriminator(_ref_tag)
]


class AllowedToolsChoice(_Strict):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: Annotated[list[AllowedRef], Field(min_length=1)]


ToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[
        Annotated[FunctionChoice, Tag("function")]
        | Annotated[CustomChoice, Tag("custom")]
        | Annotated[McpChoice, Tag("mcp")]
        | Annotated[AllowedToolsChoice, Tag("allowed_tools")]
        | Annotated[BuiltinChoice, Tag("builtin")],
        Discriminator(
            lambda v: (
                t if (t := _type_tag(v)) in ("function", "custom", "mcp", "allowed_tools") else "builtin" if t else None
            ),
            custom_error_type="tool_choice_type",
            custom_error_message="tool_choice needs a type",
        ),
    ]
)


# --- text.format, reasoning and the small options ------------------------------------------------


class TextFormat(_Strict):
    type: Literal["text"]


class JSONObjectFormat(_Strict):
    type: Literal["json_object"]


class JSONSchemaFormat(_Strict):
    type: Literal["json_schema"]
    name: Name
    # ``schema`` shadows a BaseModel attribute, hence the alias.
    schema_: JsonObject = Field(alias="schema")
    description: str | None = None
    strict: StrictBool | None = None


class TextConfig(_Strict):
    format: Annotated[TextFormat | JSONObjectFormat | JSONSchemaFormat, Field(discriminator="type")] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
SummaryLevel = Literal["auto", "concise", "detailed"]


class ReasoningOptions(_Strict):
    effort: Effort | None = None
    summary: SummaryLevel | None = None
    generate_summary: SummaryLevel | None = None  # deprecated by OpenAI in favour of summary
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: NonEmpty | None = None


class PromptRef(_Strict):
    """A prompt template stored at OpenAI."""

    id: NonEmpty
    version: str | None = None
    variables: dict[str, str | Annotated[InputText | InputImage | InputFile, Field(discriminator="type")]] | None = None


class ConversationRef(_Strict):
    id: NonEmpty


class ResponsesStreamOptions(_Strict):
    include_obfuscation: StrictBool | None = None
