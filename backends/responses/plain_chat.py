"""The chat translation of a plain Responses request, built without validating it a second time.

:func:`~backends.responses.to_chat.to_chat` validates the chat request it builds, so that a part
chat cannot carry is refused by name (:class:`~backends.responses.to_chat.Untranslatable`). For a
*plain* request that validation cannot refuse anything, and costs a pydantic validation plus the
chat rules per request (issue 21's Performance: the bridge's non-stream path). Plain means:

- every field it sets is ``model``, ``input``, ``instructions``, ``max_output_tokens``, ``stream``,
  ``stream_options``, a gateway field that never reaches chat (``store``, ``metadata``, ...), or a
  scalar field chat declares with the same type and bounds (``temperature``, ``seed``, ...: each
  value passed the very check chat's schema would make; :data:`PLAIN_FIELDS`);
- ``input`` is a string, or items that are messages (string content, or text parts) and reasoning
  items (never sent); so every message is one chat ``system``/``developer``/``user``/``assistant``
  message chat's schema takes, and at least one message is sent.

No chat rule can fail on such a request: the only rule fields it sets are
``max_completion_tokens`` (never beside ``max_tokens``) and ``stream_options`` (always with
``stream``). :func:`plain_chat_request` builds it as validation would: the same values, the same
fields set (``model_construct`` would do it too, but walks all ~90 declared fields: slower than
validating). Anything else gets None, and is validated. ``tests/backends/responses/test_plain_chat.py``
holds the result to validation's, field by field, for generated requests.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from schemas.chat import ChatCompletionRequest, ChatStreamOptions
from schemas.chat_messages import AssistantMessage, DeveloperMessage, SystemMessage, TextPart, UserMessage
from schemas.responses import ResponsesRequest
from schemas.responses_items import InputText, MessageItem, OutputText, ReasoningItem

__all__ = ["PLAIN_FIELDS", "SAME_SCALARS", "UNREAD_FIELDS", "plain_chat_request"]

M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__


class _Trusted(Generic[M]):
    """Instances of one model from values known to be valid for it (pydantic's own slots, set as
    ``model_construct`` sets them; the defaults read once)."""

    __slots__ = ("_cls", "_defaults")

    def __init__(self, cls: type[M]) -> None:
        self._cls = cls
        self._defaults = {name: info.get_default(call_default_factory=True) for name, info in cls.model_fields.items()}

    def __call__(self, values: dict[str, Any]) -> M:
        obj = self._cls.__new__(self._cls)
        _set(obj, "__dict__", {**self._defaults, **values})
        _set(obj, "__pydantic_fields_set__", set(values))
        _set(obj, "__pydantic_extra__", None)
        _set(obj, "__pydantic_private__", None)
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
    {"model", "input", "instructions", "max_output_tokens", "stream", "stream_options", *SAME_SCALARS} | UNREAD_FIELDS
)

_REQUEST: _Trusted[ChatCompletionRequest] = _Trusted(ChatCompletionRequest)
_TEXT: _Trusted[TextPart] = _Trusted(TextPart)
_USER: _Trusted[UserMessage] = _Trusted(UserMessage)
_MESSAGES: dict[str, _Trusted[Any]] = {
    "system": _Trusted(SystemMessage),
    "developer": _Trusted(DeveloperMessage),
    "user": _USER,
    "assistant": _Trusted(AssistantMessage),
}
_USAGE = ChatStreamOptions.model_validate({"include_usage": True})  # frozen: one instance serves every stream


def _messages(request: ResponsesRequest) -> list[Any] | None:
    messages: list[Any] = []
    if request.instructions is not None:
        messages.append(_MESSAGES["system"]({"role": "system", "content": request.instructions}))
    items = request.input
    if type(items) is str:
        messages.append(_USER({"role": "user", "content": items}))
        return messages
    listed: list[Any] = items or []  # type: ignore[assignment]  # not a str (just above): a list, or None
    for item in listed:
        kind = type(item)
        if kind is ReasoningItem:
            continue  # never sent (backends.responses.to_chat)
        if kind is not MessageItem:
            return None
        content = item.content
        if type(content) is not str:
            if not content:
                return None  # an empty message: to_chat sends chat an empty string
            parts = []
            for part in content:
                if type(part) is not InputText and type(part) is not OutputText:
                    return None
                parts.append(_TEXT({"type": "text", "text": part.text}))
            content = parts
        messages.append(_MESSAGES[item.role]({"role": item.role, "content": content}))
    return messages or None


def plain_chat_request(request: ResponsesRequest, *, stream: bool) -> ChatCompletionRequest | None:
    """The chat request of a plain ``request`` (module docstring), as validation would build it; None
    for any other request."""
    fields_set = request.__pydantic_fields_set__
    if not fields_set <= PLAIN_FIELDS:
        return None
    values = request.__dict__
    text = values["input"]
    if type(text) is str and values["instructions"] is None:  # the commonest request: one user message
        messages: list[Any] | None = [_USER({"role": "user", "content": text})]  # (no walk: no _messages call)
    else:
        messages = _messages(request)
        if messages is None:
            return None
    fields: dict[str, Any] = {"model": values["model"], "messages": messages}
    for name in _SAME_SCALARS & fields_set:  # usually one or two (their order is the defaults')
        value = values[name]
        if value is not None:
            fields[name] = value
    limit = values["max_output_tokens"]
    if limit is not None:
        fields["max_completion_tokens"] = limit
    if stream:
        fields["stream"] = True
        fields["stream_options"] = _USAGE
    return _REQUEST(fields)
