"""What differs between the served APIs, in one table; everything else on the request path exists once.

The request path (handler, guard, caps, rate limits, router, service, accounting) sees a
request only through :class:`ServedRequest`, which both
:class:`~schemas.completions.CompletionRequest` and :class:`~schemas.chat.ChatCompletionRequest`
implement. Where the endpoints really differ (which capability table a backend checks the
request against, which backend method an attempt calls) the path asks the request's
:class:`EndpointOps`, picked once per request by endpoint, never by the request's type.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from backends.base import Backend, Call, ChatCall, CompletionResult, CompletionStream, UpstreamCall
from schemas.endpoints import ENDPOINT_PATHS, Endpoint
from schemas.errors import UnsupportedParameterError

__all__ = ["OPS", "EndpointOps", "ServedRequest"]


class ServedRequest(Protocol):
    """The small interface the request path needs from a validated request of any endpoint."""

    @property
    def model(self) -> str: ...
    @property
    def stream(self) -> bool | None: ...
    @property
    def n(self) -> int | None: ...
    @property
    def best_of(self) -> int | None: ...
    @property
    def sequences(self) -> int:
        """Sequences generated per prompt (``max(n, best_of)``)."""

    @property
    def prompt_count(self) -> int: ...
    @property
    def prompt_array(self) -> list[Any] | None:
        """The prompt when it is an array (bounded by ``server.max_prompt_array``), else None."""

    @property
    def output_limit(self) -> int:
        """Tokens each sequence may generate (the endpoint's default or estimate when unset)."""

    @property
    def output_limit_set(self) -> bool:
        """Whether the client set the output limit."""
    @property
    def output_bounded(self) -> bool:
        """False when the client left the output unbounded (chat without a max)."""

    @property
    def output_limit_param(self) -> str:
        """The request field that carries the output limit, for errors."""

    @property
    def include_usage(self) -> bool: ...
    def prompt_estimate(self) -> int: ...
    def routing_text(self) -> str | list[int]: ...


def _completions_refusal(backend: Backend, request: Any) -> UnsupportedParameterError | None:
    return backend.capabilities.refusal(request, backend.name, backend.kind)


def _chat_refusal(backend: Backend, request: Any) -> UnsupportedParameterError | None:
    table = backend.chat_capabilities
    # A backend serving chat without a table checks at send time (its translator refuses by name).
    return None if table is None else table.refusal(request, backend.name, backend.kind)


def _complete(backend: Backend, call: UpstreamCall) -> Awaitable[CompletionResult]:
    return backend.complete(call)


def _stream(backend: Backend, call: UpstreamCall) -> Awaitable[CompletionStream]:
    return backend.stream(call)


def _chat(backend: Backend, call: ChatCall) -> Awaitable[CompletionResult]:
    return backend.chat(call)


def _chat_stream(backend: Backend, call: ChatCall) -> Awaitable[CompletionStream]:
    return backend.chat_stream(call)


@dataclass(frozen=True, slots=True)
class EndpointOps:
    """One endpoint's part of the request path: its capability check and its backend calls."""

    endpoint: Endpoint
    refusal: Callable[[Backend, Any], UnsupportedParameterError | None]
    complete: Callable[[Backend, Call[Any]], Awaitable[CompletionResult]]
    stream: Callable[[Backend, Call[Any]], Awaitable[CompletionStream]]

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]


OPS: Mapping[Endpoint, EndpointOps] = MappingProxyType(
    {
        Endpoint.COMPLETIONS: EndpointOps(Endpoint.COMPLETIONS, _completions_refusal, _complete, _stream),
        Endpoint.CHAT: EndpointOps(Endpoint.CHAT, _chat_refusal, _chat, _chat_stream),
    }
)
