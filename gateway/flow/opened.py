"""A stream whose first event is in hand: the backend's slot it holds, and what the breaker hears of it.

:class:`~gateway.flow.service.CompletionService` opens a stream and hands the client's side an
:class:`OpenedStream` (a :class:`TracedStream` for a recorded request). It keeps its backend's slot
until :meth:`OpenedStream.aclose`; a failure after the first event counts against the backend, a
clean end for it, a client that left says nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.base import CompletionStream
from backends.errors import UpstreamError
from gateway.flow.health import health_verdict
from gateway.flow.router import Route
from gateway.metrics import GatewayMetrics

if TYPE_CHECKING:
    from gateway.tracing import RequestTrace

__all__ = ["OpenedStream", "TracedStream"]


class OpenedStream:
    """A stream whose first event is in hand. Holds its backend's slot until :meth:`aclose`.

    The breaker hears how the stream ended: a failure after the first event counts
    against the backend (:meth:`failed`); a clean end counts for it, at :meth:`aclose`
    (a half-open trial was already settled by the first event); a client that left says
    nothing. Success is not counted at the first event, or a backend that always cuts its
    streams midway would look healthy.
    """

    __slots__ = ("_closed", "_metrics", "_verdict_due", "first", "route", "stream")

    def __init__(
        self, first: bytes, stream: CompletionStream, route: Route, metrics: GatewayMetrics, *, verdict_due: bool
    ) -> None:
        self.first = first
        self.stream = stream
        self.route = route
        self._metrics = metrics
        self._verdict_due = verdict_due
        self._closed = False

    def __aiter__(self) -> OpenedStream:
        return self

    async def __anext__(self) -> bytes:
        """The stream's next chunk; an upstream failure is reported to the breaker, then raised."""
        try:
            return await self.stream.__anext__()
        except UpstreamError as exc:
            self.failed(exc)
            raise

    def failed(self, exc: UpstreamError) -> None:
        """The upstream failed after the first event: its breaker and the metrics hear of it."""
        self._verdict_due = False
        self._metrics.upstream_error(self.route.backend.name, exc.reason)
        if health_verdict(exc) is False:
            self.route.guard.breaker.failed()

    async def aclose(self) -> None:
        """Release the upstream and the backend's slot; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._verdict_due and self.stream.finished:
            self.route.guard.breaker.succeeded()
        try:
            await self.stream.aclose()
        finally:
            self.route.guard.limiter.release()


class TracedStream(OpenedStream):
    """An :class:`OpenedStream` of a recorded request: its chunks tell the trace the finish reasons,
    and its end ends the attempt's span. Only sampled requests pay for it."""

    __slots__ = ("_trace",)

    def __init__(
        self,
        trace: RequestTrace,
        first: bytes,
        stream: CompletionStream,
        route: Route,
        metrics: GatewayMetrics,
        *,
        verdict_due: bool,
    ) -> None:
        super().__init__(first, stream, route, metrics, verdict_due=verdict_due)
        self._trace = trace
        trace.first_chunk()
        if trace.tracing.capture_content:
            trace.output = []
        trace.chunk(first)

    async def __anext__(self) -> bytes:
        chunk = await super().__anext__()
        self._trace.chunk(chunk)
        return chunk

    def failed(self, exc: UpstreamError) -> None:
        super().failed(exc)
        self._trace.stream_error = exc
        if self._trace.last is not None:
            self._trace.last.end(exc)

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            if self._trace.last is not None:
                self._trace.last.end()
