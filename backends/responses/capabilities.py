"""Which Responses fields (and forms) a backend can honour, as frozen data: native, or derived from chat.

A Responses table (:class:`ResponsesCapabilities`) has a level per field of
:class:`~schemas.responses.ResponsesRequest` and per *form* (``tools=web_search``,
``tool_choice=mcp``, ``input=item_reference``, ``include=...``), like the chat tables. There are
two kinds:

- **native** (``openai``): the upstream serves ``/v1/responses`` itself; the table lists what it
  cannot take (vLLM's extras on OpenAI's API);
- **bridged** (:meth:`ResponsesCapabilities.bridged`, every family that serves Responses through
  its chat translator, :mod:`backends.responses.to_chat`): the fields and forms only OpenAI can
  run (its built-in tools, hosted items, ``background``, ``conversation``, ``prompt``, ...) are
  unsupported; everything that becomes chat is checked by translating the request and asking
  the family's own chat table. So a bridged table cannot drift from the chat table it is built
  on: there is no second list of what, say, Ollama does with ``tool_choice``.

:meth:`ResponsesCapabilities.refusal` names the Responses field in the 400, never the chat
field it became (``max_output_tokens``, not ``max_completion_tokens``). Built-in tools the
operator chose to omit (``models[].responses.builtin_tools: omit``,
:meth:`~schemas.responses.ResponsesRequest.omits_builtin_tools`) are not refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from backends.capabilities import Capabilities, Level
from backends.chat_capabilities import ChatCapabilities, Refusal
from backends.responses.plain_chat import plain_chat_request
from backends.responses.to_chat import CHAT_TO_RESPONSES, NO_TOOL_NAMES, ToolNames, Untranslatable, to_chat
from schemas.chat import ChatCompletionRequest
from schemas.errors import UnsupportedParameterError
from schemas.responses import ResponsesRequest
from schemas.responses_items import (
    HOSTED_ITEM_TYPES,
    MESSAGE_ITEM_TYPES,
    FunctionCallItem,
    InputFile,
    InputImage,
    InputText,
)
from schemas.responses_tools import BUILTIN_CHOICE_TYPES, BUILTIN_TOOL_TYPES, CustomTool, FunctionTool

__all__ = [
    "GATEWAY_FIELDS",
    "OPENAI_ONLY_RESPONSES_FIELDS",
    "RESPONSES_FIELDS",
    "RESPONSES_PARAMS",
    "VLLM_RESPONSES_EXTRAS",
    "ResponsesCapabilities",
    "chat_request_of",
    "request_forms",
]

N, T, E, U = Level.NATIVE, Level.TRANSLATED, Level.EMULATED, Level.UNSUPPORTED

RESPONSES_FIELDS: tuple[str, ...] = tuple(ResponsesRequest.model_fields)
# Every param a Responses refusal can name: the fields, and the options named by their path.
RESPONSES_PARAMS: frozenset[str] = frozenset(
    (*RESPONSES_FIELDS, "text.format", "text.verbosity", "reasoning.effort", "reasoning.summary")
)
VLLM_RESPONSES_EXTRAS: frozenset[str] = frozenset(RESPONSES_FIELDS[RESPONSES_FIELDS.index("frequency_penalty") :])

# State and services only OpenAI's API keeps (stored prompts, conversations, background runs, ...).
OPENAI_ONLY_RESPONSES_FIELDS: frozenset[str] = frozenset(
    {
        "access_programs", "background", "background_options", "context_management", "conversation", "image",
        "moderation", "prompt", "prompt_cache_options", "prompt_cache_retention",
    }
)  # fmt: skip
_INPUT_ONLY = frozenset({"input"})
_NEUTRAL: Mapping[str, tuple[Any, ...]] = MappingProxyType({"background": (False,), "context_management": ([],)})

# The gateway's own fields: honoured here on every backend, never sent to a chat translator.
GATEWAY_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "store": "the gateway keeps the turn (its conversation store)",
        "previous_response_id": "the gateway sends the stored earlier turns upstream",
        "metadata": "kept with the stored response and echoed in the answer",
        "truncation": "the gateway drops the oldest turns when the context would overflow",
        "prompt_cache_key": "a caching hint; self-hosted servers cache prefixes on their own, so nothing is left to do",
        "client_metadata": "describes the client (Codex's ids), not the answer: nothing to honour",
        "max_tool_calls": "caps built-in tool calls, which never run here",
        "include": "translated per value: logprobs, and reasoning given in the clear (no encrypted form)",
    }
)

# Forms only OpenAI can honour, refused on every bridged table.
_OPENAI_ONLY_FORMS: tuple[str, ...] = (
    *(f"tools={kind}" for kind in BUILTIN_TOOL_TYPES),
    "tools=defer_loading", "tools=allowed_callers", "tools=output_schema",
    *(f"tool_choice={kind}" for kind in (*BUILTIN_CHOICE_TYPES, "mcp")),
    *(f"input={kind}" for kind in HOSTED_ITEM_TYPES),
    "input=item_reference", "input=input_image.file_id", "input=input_image.detail=original",
    "input=input_file.file_url", "input=prompt_cache_breakpoint", "input=phase", "input=caller",
    "reasoning=context", "reasoning=mode", "stream_options=include_obfuscation",
)  # fmt: skip
_BRIDGE_REASONS: Mapping[str, str] = MappingProxyType(
    {
        **{f"tools={kind}": "an OpenAI built-in tool runs inside OpenAI" for kind in BUILTIN_TOOL_TYPES},
        "input=item_reference": "a reference resolves only in OpenAI's own store",
        **{f"input={kind}": "an item of an OpenAI built-in tool" for kind in HOSTED_ITEM_TYPES},
        "input=input_image.file_id": "an OpenAI file id resolves only at OpenAI",
    }
)


def request_forms(request: ResponsesRequest) -> Iterator[tuple[str, str]]:
    """``(field, form)`` for every value-level form the request uses (repeats possible)."""
    # By exact type, not isinstance: isinstance of a model that is not the object's own class asks
    # ABCMeta, a thousand instructions per check (validation makes exactly these classes; the
    # null-typed message, a subclass, is in MESSAGE_ITEM_TYPES).
    items: Any = request.input  # (Any: the exact-type checks below do not narrow for mypy)
    if items is not None and type(items) is not str:
        for item in items:
            kind = type(item)
            yield "input", item.type
            if kind in MESSAGE_ITEM_TYPES:
                if item.phase is not None:
                    yield "input", "phase"
                content = item.content
                if type(content) is not str:
                    for part in content:
                        part_kind = type(part)
                        if part_kind is InputImage:
                            if part.file_id is not None:
                                yield "input", "input_image.file_id"
                            if part.detail == "original":
                                yield "input", "input_image.detail=original"
                        elif part_kind is InputFile:
                            if part.file_url is not None:
                                yield "input", "input_file.file_url"
                        elif part_kind is not InputText:
                            continue  # output_text, refusal: no form of their own
                        if part.prompt_cache_breakpoint:
                            yield "input", "prompt_cache_breakpoint"
            elif kind is FunctionCallItem and (item.caller is not None or item.async_ is not None):
                yield "input", "caller"
    for tool in request.tools or ():
        yield "tools", tool.type
        if type(tool) is FunctionTool or type(tool) is CustomTool:
            if tool.defer_loading is not None:
                yield "tools", "defer_loading"
            if tool.allowed_callers is not None:
                yield "tools", "allowed_callers"
            if type(tool) is FunctionTool and tool.output_schema is not None:
                yield "tools", "output_schema"
    choice: Any = request.tool_choice
    if choice is not None:
        yield "tool_choice", choice if type(choice) is str else choice.type
    for value in request.include or ():
        yield "include", value
    reasoning = request.reasoning
    if reasoning is not None:
        for option in ("summary", "generate_summary", "context", "mode"):
            if getattr(reasoning, option) is not None:
                yield "reasoning", option
    if request.stream_options is not None and request.stream_options.include_obfuscation:
        yield "stream_options", "include_obfuscation"


def chat_request_of(request: ResponsesRequest) -> tuple[ChatCompletionRequest, ToolNames]:
    """The request's chat translation, made once per request (the check and the call share it)."""
    # ResponsesRequest.bridged, read and kept inline: twice on every bridged request's path.
    state: dict[str, Any] | None = request.__pydantic_private__
    if state is not None and "bridged" in state:
        cached: tuple[ChatCompletionRequest, ToolNames] = state["bridged"]
        return cached
    if request.tools:
        names = ToolNames(request)
        chat = to_chat(request, names, stream=bool(request.stream))
    else:  # (to_chat's own first step, without its call)
        names = NO_TOOL_NAMES
        stream = bool(request.stream)
        plain = plain_chat_request(request, stream=stream)
        chat = plain if plain is not None else to_chat(request, names, stream=stream)
    cached = (chat, names)
    if state is None:  # (a client's request: its private slot is made here, on a frozen model)
        object.__setattr__(request, "__pydantic_private__", {"bridged": cached})
    else:
        state["bridged"] = cached
    return cached


@dataclass(frozen=True)
class ResponsesCapabilities:
    """A backend type's Responses table; build with :meth:`native` or :meth:`bridged`."""

    fields: Mapping[str, Level]
    forms: Mapping[str, Level] = field(default_factory=lambda: MappingProxyType({}))
    reasons: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    chat: ChatCapabilities | None = None  # bridged: the family's chat table checks what becomes chat

    @classmethod
    def native(cls, unsupported: frozenset[str], reasons: Mapping[str, str] | None = None) -> ResponsesCapabilities:
        table = {name: (U if name in unsupported else N) for name in RESPONSES_FIELDS}
        return cls(MappingProxyType(table), reasons=MappingProxyType(dict(reasons or {})))

    @classmethod
    def bridged(cls, chat: ChatCapabilities) -> ResponsesCapabilities:
        """The table of a family serving Responses through ``chat`` (derived: nothing to keep in step)."""
        table = {name: _bridged_level(name, chat) for name in RESPONSES_FIELDS}
        forms = {**_chat_forms(chat), **dict.fromkeys(_OPENAI_ONLY_FORMS, U)}
        reasons = {
            name: "an OpenAI-only feature (state or services OpenAI keeps)" for name in OPENAI_ONLY_RESPONSES_FIELDS
        }
        return cls(
            MappingProxyType(table), MappingProxyType(forms), MappingProxyType({**reasons, **_BRIDGE_REASONS}), chat
        )

    def level(self, name: str, form: str | None = None) -> Level:
        if form is not None and (level := self.forms.get(f"{name}={form}")) is not None:
            return level
        return self.fields[name]

    def first_refusal(self, request: ResponsesRequest) -> Refusal | None:
        """The first thing this backend cannot honour: fields (schema order), forms, then the chat check."""
        fields_set = request.__pydantic_fields_set__
        touched = self._unsupported & fields_set  # operators, not .intersection(): no call per request
        if touched:
            for name in RESPONSES_FIELDS:
                if name in touched and not _neutral(name, getattr(request, name)):
                    return Refusal(name, name, self.reasons.get(name))
        forms_set = self._form_fields & fields_set
        if forms_set and not (forms_set == _INPUT_ONLY and type(request.input) is str):  # a string has none
            omit = request.omits_builtin_tools
            refused = self._refused_forms
            for pair in request_forms(request):
                if pair in refused:  # (a pair, not the "field=form" key: no string made per form)
                    name, form = pair
                    if not (omit and name == "tools" and form in BUILTIN_TOOL_TYPES):
                        key = f"{name}={form}"
                        return Refusal(name, key, self.reasons.get(key))
        if self.chat is None:
            return None
        if request.tool_choice is not None and omit_all_builtin_choice(request):
            return Refusal("tool_choice", "tool_choice", "it forces an OpenAI built-in tool, which is omitted here")
        try:
            chat_request, _ = chat_request_of(request)
        except Untranslatable as exc:
            return Refusal(exc.param, exc.param, exc.why)
        refusal = self.chat.first_refusal(chat_request)
        if refusal is None:
            return None
        return Refusal(CHAT_TO_RESPONSES.get(refusal.param, refusal.param), _renamed(refusal.key), refusal.why)

    def refusal(self, request: ResponsesRequest, backend: str, kind: str) -> UnsupportedParameterError | None:
        """The 400 for the first thing this backend cannot honour (None: it can serve the request)."""
        refusal = self.first_refusal(request)
        if refusal is None:
            return None
        what = None if refusal.key == refusal.param else _describe(refusal.key)
        why = refusal.why
        if why is None and ">" in refusal.key:
            why = f"at most {refusal.key.split('>', 1)[1]} on this backend"
        return Capabilities.refusal_error(refusal.param, backend, kind, why, what=what)

    def rows(self) -> Iterator[tuple[str, Level]]:
        """Every field, then every form, with its level (for the capability matrix)."""
        for name in RESPONSES_FIELDS:
            yield name, self.fields[name]
        yield from sorted(self.forms.items())

    @cached_property
    def _unsupported(self) -> frozenset[str]:
        return frozenset(name for name, level in self.fields.items() if level is U)

    @cached_property
    def _refused_forms(self) -> frozenset[tuple[str, str]]:
        """The refused forms as ``(field, form)`` pairs (a field's name holds no ``=``: one pair per key)."""
        return frozenset(tuple(key.split("=", 1)) for key, level in self.forms.items() if level is U)  # type: ignore[misc]

    @cached_property
    def _form_fields(self) -> frozenset[str]:
        """The fields with a refused form: a request that sets none of them needs no walk over its forms."""
        return frozenset(key.split("=", 1)[0] for key, level in self.forms.items() if level is U)


def omit_all_builtin_choice(request: ResponsesRequest) -> bool:
    """Whether ``tool_choice`` forces a built-in tool that this request's policy omits."""
    choice = request.tool_choice
    return (
        choice is not None
        and not isinstance(choice, str)
        and choice.type in BUILTIN_CHOICE_TYPES
        and request.omits_builtin_tools
    )


# A Responses field's level on a bridged table: the chat field it becomes decides.
_BECOMES: Mapping[str, str] = MappingProxyType(
    {
        "input": "messages", "instructions": "messages", "max_output_tokens": "max_completion_tokens",
        "text": "response_format", "reasoning": "messages", "model": "model", "stream": "stream",
        "stream_options": "stream",
    }
)  # fmt: skip


def _bridged_level(name: str, chat: ChatCapabilities) -> Level:
    if name in OPENAI_ONLY_RESPONSES_FIELDS:
        return U
    if name in GATEWAY_FIELDS:
        return N
    target = _BECOMES.get(name, name)
    level = chat.level(target) if target in _CHAT_FIELDS else N
    if level is N and name in _BECOMES:
        return T  # a Responses field carried by another chat field
    return level


_CHAT_FIELDS = frozenset(ChatCompletionRequest.model_fields)

# The chat forms a Responses request can use, by their Responses names (for the matrix and
# :meth:`ResponsesCapabilities.level`; the refusal itself asks the chat table).
_CHAT_FORM_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "messages=image_url": "input=input_image", "messages=remote_image_url": "input=input_image.remote_url",
        "messages=file": "input=input_file", "tools=custom": "tools=custom", "tools=strict": "tools=strict",
        "tool_choice=none": "tool_choice=none", "tool_choice=auto": "tool_choice=auto",
        "tool_choice=required": "tool_choice=required", "tool_choice=function": "tool_choice=function",
        "tool_choice=custom": "tool_choice=custom", "tool_choice=allowed_tools": "tool_choice=allowed_tools",
        "response_format=json_object": "text=json_object", "response_format=json_schema": "text=json_schema",
        "parallel_tool_calls=false": "parallel_tool_calls=false",
    }
)  # fmt: skip


# Options inside a Responses object that become a chat field of their own.
_CHAT_FIELD_FORMS: Mapping[str, str] = MappingProxyType(
    {
        "reasoning=effort": "reasoning_effort",
        "text=verbosity": "verbosity",
        "include=message.output_text.logprobs": "logprobs",
    }
)


def _chat_forms(chat: ChatCapabilities) -> dict[str, Level]:
    """The chat table's levels for the forms a Responses request can take, by their Responses names."""
    forms: dict[str, Level] = {key: chat.level(field) for key, field in _CHAT_FIELD_FORMS.items()}
    for chat_key, key in _CHAT_FORM_NAMES.items():
        field, form = chat_key.split("=", 1)
        forms[key] = chat.level(field, form)
    return forms


def _neutral(name: str, value: Any) -> bool:
    return value is None or any(value == candidate for candidate in _NEUTRAL.get(name, ()))


def _renamed(key: str) -> str:
    """A chat table's key (``response_format=json_schema``) in Responses names (``text.format=json_schema``)."""
    if "+" in key:
        return "+".join(CHAT_TO_RESPONSES.get(part, part) for part in key.split("+"))
    for sep in ("=", ">"):
        if sep in key:
            name, rest = key.split(sep, 1)
            return f"{CHAT_TO_RESPONSES.get(name, name)}{sep}{rest}"
    return CHAT_TO_RESPONSES.get(key, key)


def _describe(key: str) -> str:
    if "=" in key:
        name, form = key.split("=", 1)
        return f'{name} "{form}"'
    if ">" in key:
        name, limit = key.split(">", 1)
        return f"{name} above {limit}"
    return " together with ".join(key.split("+"))
