"""What differs between the served APIs, in one table; everything else on the request path exists once.

The request path (handler, guard, caps, rate limits, router, service, accounting) sees a
request only through :class:`~gateway.served.ServedRequest`, which both
:class:`~schemas.completions.CompletionRequest` and :class:`~schemas.chat.ChatCompletionRequest`
implement. Where the endpoints really differ (which capability table a backend checks the
request against, which backend method an attempt calls, how a stream ends, and for Responses
the conversation state before and after the call: :class:`~gateway.flow.responses_turns.ResponsesTurns`)
the path asks the request's :class:`EndpointOps`, picked once per request by endpoint, never by
the request's type.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from backends.base import (
    Backend,
    Call,
    CallTrace,
    ChatCall,
    CompletionResult,
    CompletionStream,
    DetokenizeCall,
    EmbeddingCall,
    RerankCall,
    ResponsesCall,
    TokenizeCall,
    UpstreamCall,
)
from backends.responses.bridge import bridged_responses, bridged_responses_stream, responses_table
from backends.responses.event_stream import ResponseEventStream, event_bytes, failure_of
from backends.tool_call_order import MAX_HELD_BYTES, SequentialToolCalls
from gateway.flow.responses_turns import ResponsesTurns
from gateway.served import ServedRequest
from schemas.endpoints import ENDPOINT_PATHS, Endpoint
from schemas.errors import GatewayError, UnsupportedParameterError

__all__ = ["OPS", "EndpointOps", "ServedRequest"]


def _completions_refusal(backend: Backend, request: Any) -> UnsupportedParameterError | None:
    return backend.capabilities.refusal(request, backend.name, backend.kind)


def _chat_refusal(backend: Backend, request: Any) -> UnsupportedParameterError | None:
    table = backend.chat_capabilities
    # A backend serving chat without a table checks at send time (its translator refuses by name).
    return None if table is None else table.refusal(request, backend.name, backend.kind)


def _responses_refusal(backend: Backend, request: Any) -> UnsupportedParameterError | None:
    table = responses_table(backend)
    if table is None:
        return UnsupportedParameterError(
            f"backend '{backend.name}' (type {backend.kind}) serves no responses endpoint",
            param="model",
            backend=backend.name,
        )
    return table.refusal(request, backend.name, backend.kind)


def _complete(backend: Backend, call: UpstreamCall) -> Awaitable[CompletionResult]:
    return backend.complete(call)


def _stream(backend: Backend, call: UpstreamCall) -> Awaitable[CompletionStream]:
    return backend.stream(call)


def _chat(backend: Backend, call: ChatCall) -> Awaitable[CompletionResult]:
    return backend.chat(call)


def _chat_stream(backend: Backend, call: ChatCall) -> Awaitable[CompletionStream]:
    if call.request.tools:
        return _sequential(backend, call)
    return backend.chat_stream(call)  # no tools, no tool calls: nothing to reorder, nothing paid


def _embeddings_refusal(backend: Backend, request: Any) -> UnsupportedParameterError | None:
    table = backend.embedding_capabilities
    return None if table is None else table.refusal(request, backend.name, backend.kind)


def _rerank_refusal(backend: Backend, request: Any) -> UnsupportedParameterError | None:
    table = backend.rerank_capabilities
    return None if table is None else table.refusal(request, backend.name, backend.kind)


def _embed(backend: Backend, call: EmbeddingCall) -> Awaitable[CompletionResult]:
    return backend.embed(call)


def _rerank(backend: Backend, call: RerankCall) -> Awaitable[CompletionResult]:
    return backend.rerank(call)


def _no_refusal(backend: Backend, request: Any) -> UnsupportedParameterError | None:
    return None  # the tokenizer's fields are vLLM's own, on vLLM routes only


def _tokenize(backend: Backend, call: TokenizeCall) -> Awaitable[CompletionResult]:
    return backend.tokenize(call)


def _detokenize(backend: Backend, call: DetokenizeCall) -> Awaitable[CompletionResult]:
    return backend.detokenize(call)


def _no_stream(backend: Backend, call: Call[Any]) -> Awaitable[CompletionStream]:
    # The pooling and tokenizer endpoints' schemas have no ``stream``: the handler never opens one for them.
    raise AssertionError(f"{type(call).__name__} is never streamed")


async def _sequential(backend: Backend, call: ChatCall) -> CompletionStream:
    """Every backend's chat stream with tool calls, re-emitted one call after another (as OpenAI's)."""
    inner = await backend.chat_stream(call)
    # Held calls are bounded like a whole answer: by the backend's limits.max_response_bytes.
    limits = getattr(getattr(backend, "config", None), "limits", None)
    max_held = getattr(limits, "max_response_bytes", MAX_HELD_BYTES)
    return SequentialToolCalls(inner, max_held=max_held, backend=backend.name)


def _responses(backend: Backend, call: ResponsesCall) -> Awaitable[CompletionResult]:
    return backend.responses(call) if backend.responses_native else bridged_responses(backend, call)


def _responses_stream(backend: Backend, call: ResponsesCall) -> Awaitable[CompletionStream]:
    return backend.responses_stream(call) if backend.responses_native else bridged_responses_stream(backend, call)


def _responses_failure(stream: CompletionStream, error: GatewayError) -> bytes:
    """A Responses stream ends in ``response.failed`` (an ``error`` event from a stream that cannot say more)."""
    if isinstance(stream, ResponseEventStream):
        return stream.failed_event(error)
    event = {"type": "error", "sequence_number": 0, **failure_of(error), "param": error.param}
    return event_bytes(event, "gateway")


DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class EndpointOps:
    """One endpoint's part of the request path: its capability check and its backend calls."""

    endpoint: Endpoint
    refusal: Callable[[Backend, Any], UnsupportedParameterError | None]
    # The attempt's type (``UpstreamCall`` or ``ChatCall``) and the backend methods taking it;
    # called with (request, upstream model, public model, request id, trace).
    call: Callable[[Any, str, str, str, CallTrace | None], Call[Any]]
    complete: Callable[[Backend, Any], Awaitable[CompletionResult]]
    stream: Callable[[Backend, Any], Awaitable[CompletionStream]]
    # How a stream ends: after its last event (chat, completions: ``[DONE]``; Responses: nothing),
    # and after a failure midway (None: the error envelope as a ``data:`` event, then ``done``).
    done: bytes = DONE
    failure: Callable[[CompletionStream, GatewayError], bytes] | None = None
    # Responses only: the conversation state and built-in-tools policy around the call.
    turns: ResponsesTurns | None = None

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]


OPS: Mapping[Endpoint, EndpointOps] = MappingProxyType(
    {
        Endpoint.COMPLETIONS: EndpointOps(Endpoint.COMPLETIONS, _completions_refusal, UpstreamCall, _complete, _stream),
        Endpoint.CHAT: EndpointOps(Endpoint.CHAT, _chat_refusal, ChatCall, _chat, _chat_stream),
        Endpoint.EMBEDDINGS: EndpointOps(Endpoint.EMBEDDINGS, _embeddings_refusal, EmbeddingCall, _embed, _no_stream),
        Endpoint.RERANK: EndpointOps(Endpoint.RERANK, _rerank_refusal, RerankCall, _rerank, _no_stream),
        Endpoint.RESPONSES: EndpointOps(
            Endpoint.RESPONSES,
            _responses_refusal,
            ResponsesCall,
            _responses,
            _responses_stream,
            done=b"",
            failure=_responses_failure,
            turns=ResponsesTurns(),
        ),
        Endpoint.TOKENIZE: EndpointOps(Endpoint.TOKENIZE, _no_refusal, TokenizeCall, _tokenize, _no_stream),
        Endpoint.DETOKENIZE: EndpointOps(Endpoint.DETOKENIZE, _no_refusal, DetokenizeCall, _detokenize, _no_stream),
    }
)
