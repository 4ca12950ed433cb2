"""Responses through a family's chat translator: the default of :meth:`Backend.responses` and
:meth:`Backend.responses_stream` (``backends.base``) for every family without a native endpoint.

One attempt: the request's chat translation (:func:`~backends.responses.capabilities.chat_request_of`,
made once per request: the capability check already built it) goes to the backend's own
``chat``/``chat_stream`` (a stream with tools through :class:`~backends.tool_call_order.SequentialToolCalls`,
as every chat stream is), and the answer comes back as a Response (:mod:`backends.responses.answer`)
or as Responses events (:mod:`backends.responses.events`). An error that names a chat field
(``max_completion_tokens``) names the Responses field it came from (``max_output_tokens``).
"""

from __future__ import annotations

from dataclasses import fields

from backends.base import Backend, BridgeChatCall, CompletionResult, CompletionStream, ResponsesCall, ResponsesTable
from backends.chat_capabilities import ChatCapabilities
from backends.responses.answer import ResponseFrame, response_from_chat
from backends.responses.capabilities import ResponsesCapabilities, chat_request_of
from backends.responses.events import ChatResponseEvents
from backends.responses.to_chat import CHAT_TO_RESPONSES
from backends.tool_call_order import MAX_HELD_BYTES, SequentialToolCalls
from schemas.errors import GatewayError

__all__ = ["bridged_responses", "bridged_responses_stream", "chat_call_of", "responses_table"]

# A BridgeChatCall made without its dataclass __init__, which sets each field of the frozen class
# through object.__setattr__ (half of chat_call_of's instructions): each slot set through its own
# descriptor, in the fields' order (tests/backends/responses/test_bridge.py: all of them, equal).
_new_call = object.__new__
_set_request, _set_upstream, _set_public, _set_id, _set_trace = (
    getattr(BridgeChatCall, field.name).__set__ for field in fields(BridgeChatCall)
)


def chat_call_of(call: ResponsesCall) -> tuple[BridgeChatCall, ResponseFrame]:
    """The chat attempt a Responses attempt becomes, and the frame its answer is built in."""
    # The routing check made the translation already: chat_request_of's cache, read inline (a call
    # less on every attempt); a request that comes here unchecked has it made now.
    state = call.request.__pydantic_private__
    chat_request, names = state["bridged"] if state and "bridged" in state else chat_request_of(call.request)
    public = call.public_model
    frame = ResponseFrame(call.request, public, names)
    chat_call = _new_call(BridgeChatCall)
    _set_request(chat_call, chat_request)
    _set_upstream(chat_call, call.upstream_model)
    _set_public(chat_call, public)
    _set_id(chat_call, call.request_id)
    _set_trace(chat_call, call.trace)  # the same attempt, so the same trace: its traceparent goes upstream
    return chat_call, frame


def _renamed(exc: GatewayError) -> GatewayError:
    if exc.param in CHAT_TO_RESPONSES:
        exc.param = CHAT_TO_RESPONSES[exc.param]
    return exc


async def bridged_responses(backend: Backend, call: ResponsesCall) -> CompletionResult:
    chat_call, frame = chat_call_of(call)
    try:
        result = await backend.chat(chat_call)
    except GatewayError as exc:
        raise _renamed(exc) from None
    return response_from_chat(result.body, frame, backend.name, result.answer, result.usage)[0]


async def bridged_responses_stream(backend: Backend, call: ResponsesCall) -> CompletionStream:
    chat_call, frame = chat_call_of(call)
    try:
        inner = await backend.chat_stream(chat_call)
    except GatewayError as exc:
        raise _renamed(exc) from None
    if chat_call.request.tools:
        limits = getattr(getattr(backend, "config", None), "limits", None)
        inner = SequentialToolCalls(
            inner, max_held=getattr(limits, "max_response_bytes", MAX_HELD_BYTES), backend=backend.name
        )
    return ChatResponseEvents(inner, frame, backend.name)


_BRIDGED: dict[int, tuple[ChatCapabilities, ResponsesCapabilities]] = {}


def responses_table(backend: Backend) -> ResponsesTable | None:
    """The backend's Responses table: its family's own, else derived from its chat table (cached per
    chat table; a vLLM backend's changes with the server's version). None: it serves no chat either."""
    table = backend.responses_capabilities
    if table is not None:
        return table
    chat = backend.chat_capabilities
    if chat is None:
        return None
    cached = _BRIDGED.get(id(chat))
    if cached is None or cached[0] is not chat:
        if len(_BRIDGED) > 256:  # tables are per family and vLLM version: only a bound, never reached
            _BRIDGED.clear()
        cached = _BRIDGED[id(chat)] = (chat, ResponsesCapabilities.bridged(chat))
    return cached[1]
