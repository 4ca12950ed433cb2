"""The chat translation of a plain Responses request, built without validating it a second time.

:func:`~backends.responses.to_chat.to_chat` validates the chat request it builds, so that a part
chat cannot carry is refused by name (:class:`~backends.responses.to_chat.Untranslatable`). For a
*plain* request that validation cannot refuse anything, and costs a pydantic validation plus the
chat rules per request (issue 21: the bridge's request side; an agent's turn, whose tools' JSON
Schemas chat's validation walked again, cost twice the calls of the same chat request). Plain means:

- every field it sets is ``model``, ``input``, ``instructions``, ``max_output_tokens``, ``stream``,
  ``stream_options``, ``tools``, ``tool_choice`` (a string form), ``parallel_tool_calls``,
  ``reasoning``, ``include`` (without logprobs), a gateway field that never reaches chat
  (``store``, ``metadata``, ``prompt_cache_key``, ...), or a scalar field chat declares with the
  same type and bounds (``temperature``, ``seed``, ...: each value passed the very check chat's
  schema would make; :data:`PLAIN_FIELDS`);
- ``input`` is a string, or items that are messages (string content, or text parts), reasoning
  items (never sent), function and custom tool calls (the assistant message's ``tool_calls``) and
  their outputs (a string, or text parts: a ``tool`` message);
- its function, namespace and custom tools become at most 128 chat tools whose names are unique
  and at most 64 characters (``<namespace>__<name>`` can be longer than either part).

No chat rule can fail on such a request: the rule fields it sets are ``max_completion_tokens``
(never beside ``max_tokens``), ``stream_options`` (always with ``stream``), ``tools`` (unique
names, checked here), ``tool_choice`` (``none``, or a string form with tools) and
``parallel_tool_calls`` (only with tools); an assistant message without content has its calls.
The tools are made by :mod:`backends.responses.chat_tools` (their declarations are chat's: the
Responses check was chat's own), which records their upstream form beside them.
:func:`plain_chat_request` builds it as validation would: the same values, the same fields set
(``model_construct`` would do it too, but walks all ~90 declared fields: slower than validating).
It records the chat forms it made (:data:`~backends.chat_capabilities.FORMS_NOTE`), so the chat
table's check reads them rather than walking the messages and tools again. Anything else gets None,
and is validated. ``tests/backends/responses/test_plain_chat.py`` holds
the result to validation's, field by field, for generated requests and recorded Codex turns.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from backends.chat_capabilities import FORMS_NOTE
from backends.responses.chat_tools import chat_tools
from backends.responses.model_slots import new as _new
from backends.responses.model_slots import set_dict as _set_dict
from backends.responses.model_slots import set_extra as _set_extra
from backends.responses.model_slots import set_fields_set as _set_fields_set
from backends.responses.model_slots import set_private as _set_private
from schemas import chat_messages as chat
from schemas.chat import TOOLS_NOTE, ChatCompletionRequest, ChatStreamOptions
from schemas.responses import NAMESPACE_SEPARATOR, ResponsesRequest
from schemas.responses_items import (
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputText,
    MessageItem,
    OutputText,
    ReasoningItem,
)

__all__ = ["PLAIN_FIELDS", "SAME_SCALARS", "UNREAD_FIELDS", "plain_chat_request"]

M = TypeVar("M", bound=BaseModel)


class _Trusted(Generic[M]):
    """Instances of one model from values known to be valid for it (pydantic's own slots, set as
    ``model_construct`` sets them; the defaults read once)."""

    __slots__ = ("_cls", "_defaults")

    def __init__(self, cls: type[M]) -> None:
        self._cls = cls
        self._defaults = {name: info.get_default(call_default_factory=True) for name, info in cls.model_fields.items()}

    def __call__(self, values: dict[str, Any]) -> M:
        obj: M = _new(self._cls)
        _set_dict(obj, {**self._defaults, **values})
        _set_fields_set(obj, set(values))
        _set_extra(obj, None)
        _set_private(obj, None)
        return obj


# Scalar fields chat declares with the very type and bounds the Responses schema gave them.
SAME_SCALARS: tuple[str, ...] = (
    "temperature", "top_p", "user", "frequency_penalty", "presence_penalty", "seed", "top_k", "min_p",
    "repetition_penalty", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "priority", "request_id",
)  # fmt: skip
# The gateway's own fields that the translation never reads (``include`` is read: logprobs).
UNREAD_FIELDS: frozenset[str] = frozenset(
    {"store", "previous_response_id", "metadata", "truncation", "prompt_cache_key", "client_metadata", "max_tool_calls"}
)
_SAME_SCALARS = frozenset(SAME_SCALARS)
PLAIN_FIELDS: frozenset[str] = frozenset(
    {"model", "input", "instructions", "max_output_tokens", "stream", "stream_options", *SAME_SCALARS}
    | {"tools", "tool_choice", "parallel_tool_calls", "reasoning", "include"}
    | UNREAD_FIELDS
)
LOGPROBS = "message.output_text.logprobs"  # the one include value the translation reads

_REQUEST: _Trusted[ChatCompletionRequest] = _Trusted(ChatCompletionRequest)
_TEXT: _Trusted[chat.TextPart] = _Trusted(chat.TextPart)
_USER: _Trusted[chat.UserMessage] = _Trusted(chat.UserMessage)
_ASSISTANT: _Trusted[chat.AssistantMessage] = _Trusted(chat.AssistantMessage)
_MESSAGES: dict[str, _Trusted[Any]] = {
    "system": _Trusted(chat.SystemMessage),
    "developer": _Trusted(chat.DeveloperMessage),
    "user": _USER,
    "assistant": _ASSISTANT,
}
_TOOL_MESSAGE = _Trusted(chat.ToolMessage)
_FUNCTION_CALL, _CALLED = _Trusted(chat.FunctionToolCall), _Trusted(chat.FunctionCall)
_CUSTOM_CALL, _CUSTOM_CALLED = _Trusted(chat.CustomToolCall), _Trusted(chat.CustomCall)
_USAGE = ChatStreamOptions.model_validate({"include_usage": True})  # frozen: one instance serves every stream
_REQUEST_DEFAULTS = _REQUEST._defaults
# The chat forms a plain translation can take (chat_capabilities.request_forms' names).
_TEXT_FORM, _USAGE_FORM = ("messages", "text"), ("stream_options", "include_usage")
_STRICT_FORM = ("tools", "strict")
_PARALLEL_FORMS = {True: ("parallel_tool_calls", "true"), False: ("parallel_tool_calls", "false")}


def _texts(content: list[Any]) -> list[Any] | None:
    """Text parts as chat's (None: another part, which validation names)."""
    parts = []
    for part in content:
        if type(part) is not InputText and type(part) is not OutputText:
            return None
        parts.append(_TEXT({"type": "text", "text": part.text}))
    return parts


def _messages(request: ResponsesRequest) -> tuple[list[Any], bool] | None:
    """The messages, and whether one has a list of (text) parts."""
    messages: list[Any] = []
    parts = False
    if request.instructions is not None:
        messages.append(_MESSAGES["system"]({"role": "system", "content": request.instructions}))
    items = request.input
    if type(items) is str:
        messages.append(_USER({"role": "user", "content": items}))
        return messages, False
    listed: list[Any] = items or []  # type: ignore[assignment]  # not a str (just above): a list, or None
    assistant: dict[str, Any] | None = None  # the open assistant message's values: the calls after it join it
    for item in listed:
        kind = type(item)
        if kind is ReasoningItem:
            continue  # never sent (backends.responses.to_chat)
        if kind is FunctionCallItem or kind is CustomToolCallItem:
            if assistant is None:
                assistant = {"role": "assistant", "content": None}
                messages.append(assistant)  # a dict until the walk ends: its calls are still coming
            call: chat.FunctionToolCall | chat.CustomToolCall
            if kind is FunctionCallItem:
                namespace = item.namespace
                name = f"{namespace}{NAMESPACE_SEPARATOR}{item.name}" if namespace else item.name
                called = _CALLED({"name": name, "arguments": item.arguments})
                call = _FUNCTION_CALL({"id": item.call_id, "type": "function", "function": called})
            else:
                custom = _CUSTOM_CALLED({"name": item.name, "input": item.input})
                call = _CUSTOM_CALL({"id": item.call_id, "type": "custom", "custom": custom})
            if "tool_calls" in assistant:
                assistant["tool_calls"].append(call)
            else:
                assistant["tool_calls"] = [call]
            continue
        assistant = None
        if kind is FunctionCallOutputItem or kind is CustomToolCallOutputItem:
            output = item.output
            if type(output) is not str:
                output = _texts(output)
                if output is None:
                    return None  # an image or file: to_chat names it
                output = output or ""  # no parts: an empty output
                parts = parts or bool(output)
            messages.append(_TOOL_MESSAGE({"role": "tool", "tool_call_id": item.call_id, "content": output}))
            continue
        if kind is not MessageItem:
            return None
        content = item.content
        if type(content) is not str:
            if not content:
                return None  # an empty message: to_chat sends chat an empty string
            content = _texts(content)
            if content is None:
                return None
            parts = True
        if item.role == "assistant":
            assistant = {"role": "assistant", "content": content}
            messages.append(assistant)
        else:
            messages.append(_MESSAGES[item.role]({"role": item.role, "content": content}))
    if not messages:
        return None
    return [_ASSISTANT(m) if type(m) is dict else m for m in messages], parts


def plain_chat_request(request: ResponsesRequest, *, stream: bool) -> ChatCompletionRequest | None:
    """The chat request of a plain ``request`` (module docstring), as validation would build it; None
    for any other request."""
    fields_set = request.__pydantic_fields_set__
    if not fields_set <= PLAIN_FIELDS:
        return None
    values = request.__dict__
    text = values["input"]
    if type(text) is str and values["instructions"] is None:  # the commonest request: one user message
        messages = [_USER({"role": "user", "content": text})]  # (no walk: no _messages call)
        parts = False
    else:
        made = _messages(request)
        if made is None:
            return None
        messages, parts = made
    fields: dict[str, Any] = {"model": values["model"], "messages": messages}
    for name in _SAME_SCALARS & fields_set:  # usually one or two (their order is the defaults')
        value = values[name]
        if value is not None:
            fields[name] = value
    limit = values["max_output_tokens"]
    if limit is not None:
        fields["max_completion_tokens"] = limit
    include = values["include"]
    if include is not None and LOGPROBS in include:
        return None
    # The forms chat's check would read from the request (chat_capabilities.request_forms: its order,
    # each once), recorded as they are made: no second walk over the messages and tools.
    forms: list[tuple[str, str]] = [_TEXT_FORM] if parts else []
    if stream:
        forms.append(_USAGE_FORM)
    tools = values["tools"]
    strict = False
    made_tools = None
    tools_note: tuple[Any, ...] = ()
    if tools:
        built = chat_tools(tools, forms)  # (backends.responses.chat_tools)
        if built is None:
            return None
        made_tools, strict, tools_note = built
    if made_tools:
        fields["tools"] = made_tools
    choice = values["tool_choice"]
    if choice is not None:
        if type(choice) is not str:
            return None  # a named tool: resolved and checked by to_chat and validation
        if choice == "none" or made_tools:
            fields["tool_choice"] = choice  # (another without tools: chat's default, as to_chat leaves it)
            forms.append(("tool_choice", choice))
    if made_tools:
        parallel = values["parallel_tool_calls"]
        if parallel is not None:
            fields["parallel_tool_calls"] = parallel
            forms.append(_PARALLEL_FORMS[parallel])
        if strict:
            forms.append(_STRICT_FORM)
    reasoning = values["reasoning"]
    if reasoning is not None and reasoning.effort is not None:
        fields["reasoning_effort"] = reasoning.effort
    if stream:
        fields["stream"] = True
        fields["stream_options"] = _USAGE
    chat_values = {**_REQUEST_DEFAULTS, **fields}
    made_request: ChatCompletionRequest = _new(ChatCompletionRequest)
    _set_dict(made_request, chat_values)
    _set_fields_set(made_request, set(fields))
    _set_extra(made_request, None)
    notes: dict[str, Any] = {FORMS_NOTE: (chat_values, tuple(forms))}
    if tools_note:
        notes[TOOLS_NOTE] = tools_note  # the tools' upstream form (schemas.chat.TOOLS_NOTE)
    _set_private(made_request, notes)
    return made_request
