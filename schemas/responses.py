"""The Responses API request (``POST /v1/responses``): every field with its bounds, and the rules that tie them.

Fields are listed in OpenAI's documented order (the openai SDK 3.57 ``ResponseCreateParams``:
the current API), then ``client_metadata`` (sent by the Codex CLI on every turn), then the
vLLM Responses extras that Chat Completions shares (spec responses-and-embeddings.md; vLLM
0.32's ``ResponsesRequest``). Validation is strict (no ``"5"`` for an int), unknown fields are
refused by name, errors name the full path (``input[2].content[0].type``), and ``null`` means
"the default" for every optional field. Items live in :mod:`schemas.responses_items`, tools and
options in :mod:`schemas.responses_tools`, the answer shapes in :mod:`schemas.responses_objects`.

Fields OpenAI keeps server-side state for (``background``, ``conversation``, ``prompt``, ...) are
accepted here and refused by name on backends that cannot honour them; ``store``,
``previous_response_id``, ``metadata`` and ``truncation`` are the gateway's own.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from schemas.common import (
    CHARS_PER_TOKEN,
    CountOrMinusOne,
    FieldDumps,
    FieldRules,
    Int64,
    JsonObject,
    LogitBias,
    NonEmpty,
    Penalty,
    PositiveFloat,
    Stop,
    Temperature,
    TokenId,
    UnitInterval,
    check_logit_bias_keys,
)
from schemas.errors import FieldRuleError
from schemas.responses_items import MESSAGE_ITEM_TYPES, InputItem, OutputText, RefusalPart, item_text
from schemas.responses_tools import (
    AllowedToolsChoice,
    BuiltinTool,
    ConversationRef,
    CustomChoice,
    CustomTool,
    FunctionChoice,
    FunctionTool,
    NamespaceTool,
    PromptRef,
    ReasoningOptions,
    ResponsesStreamOptions,
    TextConfig,
    Tool,
    ToolChoice,
)

__all__ = [
    "DUPLICATE_ITEM",
    "MAX_TOP_LOGPROBS",
    "NAMESPACE_SEPARATOR",
    "UNSET_OUTPUT_ESTIMATE",
    "Includable",
    "ResponsesRequest",
]

MAX_TOP_LOGPROBS = 20
MAX_TOOLS = 128
MAX_INPUT_ITEMS = 10_000  # a bound on the work one request can ask for; OpenAI's context limits come first
UNSET_OUTPUT_ESTIMATE = 16  # an unset max_output_tokens, for rate limits and caps (as chat's)
DUPLICATE_ITEM = "Duplicate item found with id {}. Remove duplicate items from your input and try again."  # OpenAI's
NAMESPACE_SEPARATOR = "__"  # a namespace tool's function, flattened: <namespace>__<name> (as vLLM does)

Includable = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ResponsesRequest(_Strict):
    """``POST /v1/responses``: OpenAI's fields, Codex's ``client_metadata``, then vLLM's extras."""

    # --- OpenAI (documented order) -----------------------------------------------------------
    access_programs: JsonObject | None = None
    background: StrictBool | None = None
    background_options: JsonObject | None = None
    context_management: list[JsonObject] | None = None
    conversation: NonEmpty | ConversationRef | None = None
    image: JsonObject | None = None
    include: list[Includable] | None = None
    input: str | Annotated[list[InputItem], Field(max_length=MAX_INPUT_ITEMS)] | None = None
    instructions: str | None = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1, le=2**63 - 1)] | None = None
    max_tool_calls: Annotated[StrictInt, Field(ge=1, le=2**63 - 1)] | None = None
    metadata: Metadata | None = None
    model: NonEmpty
    moderation: JsonObject | None = None
    parallel_tool_calls: StrictBool | None = None
    previous_response_id: NonEmpty | None = None
    prompt: PromptRef | None = None
    prompt_cache_key: Annotated[str, Field(max_length=1024)] | None = None
    prompt_cache_options: JsonObject | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    reasoning: ReasoningOptions | None = None
    safety_identifier: Annotated[str, Field(max_length=128)] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None
    store: StrictBool | None = None
    stream: StrictBool | None = None
    stream_options: ResponsesStreamOptions | None = None
    temperature: Temperature | None = None
    text: TextConfig | None = None
    tool_choice: ToolChoice | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    top_p: UnitInterval | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None  # deprecated by OpenAI: safety_identifier and prompt_cache_key

    # --- the Codex CLI ---------------------------------------------------------------------------
    client_metadata: dict[str, str] | None = None  # describes the client (ids, turn metadata), not the answer

    # --- vLLM Responses extras that chat shares -------------------------------------------------
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    seed: Int64 | None = None
    stop: Stop | None = None
    top_k: CountOrMinusOne | None = None
    min_p: UnitInterval | None = None
    repetition_penalty: PositiveFloat | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: StrictBool | None = None
    skip_special_tokens: StrictBool | None = None
    include_stop_str_in_output: StrictBool | None = None
    chat_template_kwargs: JsonObject | None = None
    priority: Int64 | None = None
    request_id: NonEmpty | None = None

    # What the request path sets on a request, never the client: the operator's choice for
    # built-in tools (``omit``), the request's chat translation (``bridged``, made once for the
    # capability check and the call), the client's own items once ``previous_response_id``
    # expanded ``input`` (``stored``). Kept in pydantic's private slot, made on first use: declared
    # PrivateAttrs cost an initialisation per validated request (and a ``__getattr__`` per read).

    # --- cross-field rules ------------------------------------------------------------------------
    @model_validator(mode="after")
    def check_rules(self) -> ResponsesRequest:
        """The cross-field rules, in this order (the first one broken is the error); a rule runs only
        when a field that can break it was set."""
        # The input rule comes first, and breaks only for an input that is not a string: a missing
        # one (``model`` is always set, so it ran on every request before) or a list of items.
        if type(self.input) is not str:  # not isinstance: a call on every request
            self._check_input()
        fields_set = self.__pydantic_fields_set__
        if fields_set & _RULE_FIELDS:  # most requests set none of them: no call then
            _RULES.run(self, fields_set)
        return self

    def _check_input(self) -> None:
        if self.input is None:
            if self.prompt is None and self.conversation is None:
                raise FieldRuleError("input", "Missing required parameter: 'input'.")
            return
        if type(self.input) is str:
            return
        if not self.input and self.previous_response_id is None and self.prompt is None:
            raise FieldRuleError("input", "input is an empty array: give at least one item (or previous_response_id)")
        items: list[Any] = self.input  # type: ignore[assignment]  # a list: not a str, not None (above)
        ids: set[str] = set()
        for i, item in enumerate(items):
            # Every item type has an id. Two items with one id are OpenAI's 400; kept, their listing
            # (``input_items``, paged by id) would hand out one cursor for both and never end.
            item_id = item.id
            if item_id:
                if item_id in ids:
                    raise FieldRuleError(f"input[{i}].id", DUPLICATE_ITEM.format(item_id))
                ids.add(item_id)
            if type(item) in MESSAGE_ITEM_TYPES and type(item.content) is not str:
                assistant = item.role == "assistant"
                for j, part in enumerate(item.content):
                    if (type(part) in _ASSISTANT_PARTS) is not assistant:  # OpenAI's rule both ways
                        takes = "output_text and refusal" if assistant else "input_text, input_image and input_file"
                        a = "an" if assistant else "a"
                        raise FieldRuleError(
                            f"input[{i}].content[{j}].type",
                            f"input[{i}].content[{j}]: {a} {item.role} message takes {takes}, not {part.type}",
                        )

    def _check_tools(self) -> None:
        names: set[str] = set()
        tools: list[Any] = self.tools or []  # (Any: the exact-type check below does not narrow for mypy)
        for i, tool in enumerate(tools):
            # A function or custom tool (the commonest) has its one name, with no call.
            named = type(tool) is FunctionTool or type(tool) is CustomTool
            for name in (tool.name,) if named else _namespace_names(tool):
                if name in names:
                    raise _twice(i, tool, name)
                names.add(name)
        choice = self.tool_choice
        if isinstance(choice, str) or choice is None:
            if choice == "required" and not self.tools:
                raise FieldRuleError("tool_choice", "tool_choice 'required' needs tools")
            return
        refs: list[tuple[str, str]]
        if isinstance(choice, _NAMED_CHOICES):
            refs = [(choice.type, choice.name)]
        elif isinstance(choice, AllowedToolsChoice):
            refs = [(ref.type, ref.name) for ref in choice.tools if ref.name is not None]
        else:
            refs = []
        kinds = {(kind, name) for tool in self.tools or () for kind, name in _tool_kinds(tool)}
        for kind, name in refs:
            if (kind, name) not in kinds and not (
                kind == "function" and sum(1 for k, n in kinds if k == kind and _local(n) == name) == 1
            ):
                raise FieldRuleError("tool_choice", f"tool_choice names a {kind} tool {name!r} that is not in tools")

    def _check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise FieldRuleError("stream_options", "stream_options is only allowed when stream is true")

    def _check_background(self) -> None:
        if self.background and self.store is False:
            raise FieldRuleError("background", "background mode needs store to be true")

    def _check_conversation(self) -> None:
        if self.conversation is not None and self.previous_response_id is not None:
            raise FieldRuleError(
                "previous_response_id", "previous_response_id and conversation cannot both be set; use one of them"
            )

    def _check_logit_bias_keys(self) -> None:
        check_logit_bias_keys(self.logit_bias)

    # --- what the request asks, for the path and the translators ------------------------------
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] | None = self.__pydantic_private__
        if state is None:
            state = {}
            object.__setattr__(self, "__pydantic_private__", state)  # a slot: settable on a frozen model
        return state

    @property
    def omits_builtin_tools(self) -> bool:
        """Whether built-in tools a backend cannot run are left out (the operator chose it), not refused."""
        state = self.__pydantic_private__
        return bool(state and "omit" in state)  # set only to True

    def omit_builtin_tools(self) -> None:
        self._state()["omit"] = True

    @property
    def bridged(self) -> Any:
        """The chat translation, once made (``backends.responses.capabilities.chat_request_of``, which
        keeps it in the private slot itself); None before."""
        state = self.__pydantic_private__
        return state["bridged"] if state and "bridged" in state else None

    def with_input(self, items: list[Any]) -> ResponsesRequest:
        """A copy whose ``input`` is ``items`` (``previous_response_id``'s earlier turns, then this
        one's): what the path set carries over (``omit``), except a chat translation made from the
        old input (``bridged``), which would send the model a conversation without its history."""
        copy = self.model_copy(update={"input": items})
        state = copy.__pydantic_private__  # (model_copy copies the dict: the original keeps its own)
        if state is not None:
            state.pop("bridged", None)
        return copy

    @property
    def stored_input(self) -> list[dict[str, Any]] | None:
        """The client's own input items (with ids), kept when ``previous_response_id`` expanded ``input``."""
        state = self.__pydantic_private__
        stored: list[dict[str, Any]] | None = state["stored"] if state and "stored" in state else None
        return stored

    def keep_stored_input(self, items: list[dict[str, Any]]) -> None:
        self._state()["stored"] = items

    def upstream_fields(self) -> dict[str, Any]:
        """The fields the client set, as plain JSON-able data (wire names), in declared order: what
        goes to an upstream serving Responses itself. Top-level nulls (the default) are dropped;
        nested ones the client wrote are kept (OpenAI reads a ``strict: null`` unlike a missing
        ``strict``). Built from the set fields alone, like chat's (``FieldDumps``)."""
        values = self.__dict__
        out: dict[str, Any] = {}
        for name in sorted(self.__pydantic_fields_set__, key=_FIELDS.order.__getitem__):
            value = values[name]
            if value is None:
                continue
            out[name] = value if type(value) in _PLAIN else _FIELDS.serializer(name).to_python(value, **_DUMP)
        return out

    @property
    def builtin_tools(self) -> list[str]:
        """The types of the OpenAI built-in tools offered, in order (empty for most requests)."""
        return [tool.type for tool in self.tools or () if isinstance(tool, BuiltinTool)]

    @property
    def wants_logprobs(self) -> bool:
        return self.include is not None and "message.output_text.logprobs" in self.include

    @property
    def stores(self) -> bool:
        """Whether the gateway keeps this turn (``store`` defaults to true, as on OpenAI)."""
        return self.store is not False

    # --- the request path's common interface (gateway.served.ServedRequest) ---------------
    # What never varies is a class attribute, not a property: the caps read these on every
    # request, and each property read is a Python call (issue 21: the bridge's cost per request).
    n: ClassVar[None] = None  # one answer per request
    best_of: ClassVar[None] = None
    sequences: ClassVar[int] = 1
    prompt_count: ClassVar[int] = 1
    prompt_array: ClassVar[None] = None
    output_limit_param: ClassVar[str] = "max_output_tokens"
    include_usage: ClassVar[bool] = True  # a Response carries its usage, streamed or not

    @property
    def output_limit(self) -> int:
        limit = self.max_output_tokens
        return UNSET_OUTPUT_ESTIMATE if limit is None else limit

    @property
    def output_limit_set(self) -> bool:
        return self.max_output_tokens is not None

    @property
    def output_bounded(self) -> bool:
        return self.max_output_tokens is not None

    def prompt_estimate(self) -> int:
        """~4 characters a token over the instructions, the items' text and the tools, plus a few
        tokens of framing per item (as chat counts per message)."""
        items = self.input
        chars = len(self.instructions or "")
        count = 1
        if isinstance(items, str):
            chars += len(items)
        elif items is not None:
            count = len(items)
            chars += sum(len(item_text(item)) for item in items)
        if self.tools is not None:
            chars += len(str(self.tools))
        if self.text is not None and self.text.format is not None:
            chars += len(str(self.text.format))
        return chars // CHARS_PER_TOKEN + 3 * count + 3

    def routing_text(self) -> str:
        """The conversation's leading part (instructions, then each item's role and text), for prefix routing."""
        head = f"<system>{self.instructions}" if self.instructions else ""
        items = self.input
        if isinstance(items, str):
            return f"{head}<user>{items}"
        return head + "".join(f"<{getattr(item, 'role', item.type)}>{item_text(item)}" for item in items or ())


def _namespace_names(tool: Any) -> list[str]:
    """The names a tool that is not a function or custom one takes: a namespace's own and its members'
    flattened ones; none for a built-in tool."""
    if type(tool) is NamespaceTool:
        return [tool.name, *(f"{tool.name}{NAMESPACE_SEPARATOR}{t.name}" for t in tool.tools)]
    return []


def _twice(i: int, tool: Any, name: str) -> FieldRuleError:
    """A name given twice (the error path): a namespace's own member by its path and its own name,
    never the flattened ``<namespace>__<name>`` the client did not write."""
    if isinstance(tool, NamespaceTool) and name.startswith(tool.name + NAMESPACE_SEPARATOR):
        local = name[len(tool.name) + len(NAMESPACE_SEPARATOR) :]
        k = max(k for k, member in enumerate(tool.tools) if member.name == local)
        if sum(1 for member in tool.tools if member.name == local) > 1:
            return FieldRuleError(
                f"tools[{i}].tools[{k}].name",
                f"the names in a namespace must be unique; {local!r} is given twice in {tool.name!r}",
            )
    return FieldRuleError(f"tools[{i}]", f"the names in tools must be unique; {name!r} is given twice")


def _tool_kinds(tool: Any) -> list[tuple[str, str]]:
    if type(tool) in _NAMED_TOOLS:
        return [(tool.type, tool.name)]
    if type(tool) is NamespaceTool:
        return [(t.type, f"{tool.name}{NAMESPACE_SEPARATOR}{t.name}") for t in tool.tools]
    return []


def _local(name: str) -> str:
    return name.rsplit(NAMESPACE_SEPARATOR, 1)[-1]


# Checked by exact type (``type(x) in``), not isinstance: for a model that is not the object's own
# class isinstance asks ABCMeta (pydantic's metaclass): about a thousand instructions (issue 21: every
# request's rules). Validation makes exactly these classes (the unions' members; none is subclassed
# but the null-typed message, which MESSAGE_ITEM_TYPES holds).
_ASSISTANT_PARTS = frozenset({OutputText, RefusalPart})
_NAMED_TOOLS = frozenset({FunctionTool, CustomTool})
_NAMED_CHOICES = (FunctionChoice, CustomChoice)  # (isinstance: the error path only)

# Each rule after the input's (check_rules runs that one first), in order, with the fields without
# which it cannot fail.
_RULES: FieldRules[ResponsesRequest] = FieldRules(
    (frozenset({"tools", "tool_choice"}), ResponsesRequest._check_tools),
    (frozenset({"stream_options"}), ResponsesRequest._check_stream_options),
    (frozenset({"background"}), ResponsesRequest._check_background),
    (frozenset({"conversation"}), ResponsesRequest._check_conversation),
    (frozenset({"logit_bias"}), ResponsesRequest._check_logit_bias_keys),
)
_RULE_FIELDS: frozenset[str] = frozenset().union(*(fields for fields, _ in _RULES))

# upstream_fields' fast path (as chat's): declared order and per-field serializers.
_FIELDS = FieldDumps(ResponsesRequest)
_PLAIN: frozenset[type] = frozenset({str, int, float, bool})
_DUMP: dict[str, Any] = {"by_alias": True, "exclude_unset": True, "mode": "json"}
