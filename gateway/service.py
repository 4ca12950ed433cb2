"""The request flow after validation: try the eligible routes in order.

A route's attempt that fails in a retryable way (no connection, timeout or
cut before any byte reached the client, 429, 5xx) moves on to the next route;
anything else, or the last failure, goes to the client. For streams the first
event is awaited *before* the client's response starts, so everything up to it
can still fail over; after it, nothing is retried (see ``gateway.streaming``).
"""

from __future__ import annotations

from backends.base import CompletionResult, CompletionStream, UpstreamCall
from backends.errors import UpstreamError
from gateway.metrics import GatewayMetrics
from gateway.router import ModelEntry, Route
from schemas.completions import CompletionRequest

__all__ = ["CompletionService", "OpenedStream"]

# Failures of a stream that are safe to retry while nothing has reached the client.
_RETRYABLE_BEFORE_FIRST_BYTE = frozenset({"stream_cut", "stream_idle"})


class OpenedStream:
    __slots__ = ("first", "route", "stream")

    def __init__(self, first: bytes, stream: CompletionStream, route: Route) -> None:
        self.first = first
        self.stream = stream
        self.route = route


class CompletionService:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    async def complete(
        self, entry: ModelEntry, routes: list[Route], request: CompletionRequest, request_id: str
    ) -> tuple[CompletionResult, Route]:
        last: UpstreamError | None = None
        for route in routes:
            call = UpstreamCall(request, route.upstream_model, entry.name, request_id)
            try:
                return await route.backend.complete(call), route
            except UpstreamError as exc:
                self._metrics.upstream_error(route.backend.name, exc.reason)
                if not exc.retryable:
                    raise
                last = exc
        assert last is not None
        raise last

    async def open_stream(
        self, entry: ModelEntry, routes: list[Route], request: CompletionRequest, request_id: str
    ) -> OpenedStream:
        last: UpstreamError | None = None
        for route in routes:
            call = UpstreamCall(request, route.upstream_model, entry.name, request_id)
            try:
                stream = await route.backend.stream(call)
                try:
                    first = await stream.__anext__()
                except StopAsyncIteration:
                    first = b""
                except BaseException:
                    await stream.aclose()
                    raise
                return OpenedStream(first, stream, route)
            except UpstreamError as exc:
                self._metrics.upstream_error(route.backend.name, exc.reason)
                if not (exc.retryable or exc.reason in _RETRYABLE_BEFORE_FIRST_BYTE):
                    raise
                last = exc
        assert last is not None
        raise last
