"""The request flow after validation: attempts over a model's routes, under each backend's guard.

The router gives the eligible routes in try order (the strategy's choice first). Then,
for each attempt:

1. the backend's circuit breaker must allow it; an open circuit is skipped (failover);
2. the backend's limiter must have a free slot; a full backend is passed over for the
   next route, and waited for (its bounded queue) only when no other route is left;
3. the backend is called through the endpoint's :class:`~gateway.flow.endpoints.EndpointOps`:
   ``complete``/``chat``, or ``stream``/``chat_stream`` plus the stream's first event. For
   streams the client's response has not started yet, so everything up to the first event
   can still fail over; after it nothing is retried (see ``gateway.http.handlers``);
4. a retryable failure (:func:`gateway.flow.retry.retryable`) moves on to the next route at once
   (failover), and the failed backend is queued for another try after a backoff when its
   retry policy allows: failover first, retries after. Anything else goes to the client,
   as does the last failure when no route is left.

When no route could even be tried because every circuit is open, the answer is a 503 with
``Retry-After`` (the shortest remaining cooldown) at once, not after a pile of timeouts.

Cost: the first iteration of the loop is the whole story for a request that does not
fail: one breaker check, one slot, one call. Everything else (the remaining try order,
scheduled retries, passed-over and skipped routes: :class:`~gateway.flow.setbacks.Setbacks`) is allocated only
once something failed or was skipped.

A failure the request caused (:func:`gateway.flow.health.client_caused`, a 4xx other than
408/429) goes to the client at once: no breaker verdict against the backend, no retry, no
failover. While an attempt is with an upstream, the request's record says so
(``RequestRecord.reached``), so a client that leaves meanwhile is charged for the work.

Slots: a non-streaming attempt holds its backend's slot while it runs; a stream keeps it
until :meth:`~gateway.flow.opened.OpenedStream.aclose`. Cancellation (the client left) releases whatever the
attempt held and leaves the breaker's verdict open.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

from backends.base import Call, CompletionResult, CompletionStream
from backends.errors import UpstreamError
from gateway.clock import Clock
from gateway.flow.endpoints import EndpointOps
from gateway.flow.health import Permit
from gateway.flow.opened import OpenedStream, TracedStream
from gateway.flow.retry import retryable
from gateway.flow.router import BackendGuard, ModelEntry, Route
from gateway.flow.setbacks import Setbacks
from gateway.metrics import GatewayMetrics

if TYPE_CHECKING:  # the record is filled in here; gateway.accounting imports nothing of the flow
    from gateway.accounting import RequestRecord

__all__ = ["CompletionService"]

log = logging.getLogger("gateway")

_T = TypeVar("_T")
_Attempt = Callable[[EndpointOps, Route, Call[Any]], Awaitable[_T]]


def _call_complete(ops: EndpointOps, route: Route, call: Call[Any]) -> Awaitable[CompletionResult]:
    return ops.complete(route.backend, call)


async def _call_stream(ops: EndpointOps, route: Route, call: Call[Any]) -> tuple[bytes, CompletionStream]:
    stream = await ops.stream(route.backend, call)
    try:
        first = await stream.__anext__()
    except StopAsyncIteration:
        first = b""
    except BaseException:
        await stream.aclose()
        raise
    return first, stream


class CompletionService:
    """Runs a request's attempts over its routes; owns retrying and failover for the gateway.

    The single retry layer: the transport and the pool dispatcher do not resend a request
    once it may have reached an upstream; each backend's :class:`~gateway.flow.retry.RetryPolicy`
    decides here, between routes, with the breaker and the bulkhead in view.
    """

    def __init__(self, metrics: GatewayMetrics, clock: Clock | None = None) -> None:
        self._metrics = metrics
        self._clock = clock if clock is not None else Clock()

    async def complete(
        self,
        ops: EndpointOps,
        entry: ModelEntry,
        routes: list[Route],
        request: Any,
        request_id: str,
        priority: int = 0,
        record: RequestRecord | None = None,
    ) -> tuple[CompletionResult, Route]:
        """A non-streaming answer on ``ops``'s endpoint (``request``: that endpoint's validated type)."""
        result, route, _ = await self._run(
            ops, entry, routes, request, request_id, priority, _call_complete, hold=False, record=record
        )
        trace = record.trace if record is not None else None
        if trace is not None and trace.sampled:
            trace.answered(result.body)  # finish reasons, response id: read only when recorded
        return result, route

    async def open_stream(
        self,
        ops: EndpointOps,
        entry: ModelEntry,
        routes: list[Route],
        request: Any,
        request_id: str,
        priority: int = 0,
        record: RequestRecord | None = None,
    ) -> OpenedStream:
        (first, stream), route, permit = await self._run(
            ops, entry, routes, request, request_id, priority, _call_stream, hold=True, record=record
        )
        trace = record.trace if record is not None else None
        if trace is not None and trace.sampled:
            return TracedStream(trace, first, stream, route, self._metrics, verdict_due=permit is Permit.PASS)
        return OpenedStream(first, stream, route, self._metrics, verdict_due=permit is Permit.PASS)

    async def _run(
        self,
        ops: EndpointOps,
        entry: ModelEntry,
        routes: list[Route],
        request: Any,
        request_id: str,
        priority: int,
        attempt: _Attempt[_T],
        *,
        hold: bool,
        record: RequestRecord | None,
    ) -> tuple[_T, Route, Permit]:
        """Try ``routes`` in order until one answers (module docstring: the policy)."""
        model = entry.name
        metrics = self._metrics
        started = self._clock.now()
        trace = record.trace if record is not None else None
        recording = trace is not None and trace.sampled  # an unsampled attempt has nothing to end
        setbacks: Setbacks | None = None  # None while nothing failed or was skipped
        route, retry_reason, queue = routes[0], None, False
        while True:
            guard = route.guard
            permit = guard.breaker.allow()
            if permit is Permit.DENY:  # an open circuit: skip it
                setbacks = setbacks or Setbacks(routes, self._clock, started)
                setbacks.deny(route)
            elif guard.limiter.try_acquire() or (queue and await _queue_for(guard, permit, priority)):
                if setbacks is not None and setbacks.left is not None and setbacks.last is not None:
                    if retry_reason is not None:
                        metrics.retried(route.backend.name, retry_reason)
                    else:
                        metrics.failed_over(model, setbacks.left.backend.name, setbacks.last.reason)
                if record is not None:
                    record.reached = True
                    record.route = route
                    record.upstream_started = monotonic()
                # The attempt's client span (gateway.tracing); its headers go upstream inside the call.
                attempt_trace = (
                    trace.attempt(route.backend, route.upstream_model, retry_reason is not None)
                    if trace is not None
                    else None
                )
                try:
                    result = await attempt(
                        ops, route, ops.call(request, route.upstream_model, model, request_id, attempt_trace)
                    )
                except UpstreamError as exc:
                    if attempt_trace is not None:
                        attempt_trace.end(exc)
                    guard.limiter.release()
                    guard.breaker.outcome(exc, permit)
                    metrics.upstream_error(route.backend.name, exc.reason)
                    if record is not None:
                        record.reached = False
                        record.route = None
                    if not retryable(exc):
                        log.info(
                            "request %s: backend %s failed (%s), not retryable",
                            request_id,
                            route.backend.name,
                            exc.reason,
                        )
                        raise
                    setbacks = setbacks or Setbacks(routes, self._clock, started)
                    wait = setbacks.failed(route, exc)
                    log.info(
                        "request %s: backend %s failed (%s)%s%s",
                        request_id,
                        route.backend.name,
                        exc.reason,
                        "" if wait is None else f"; retry in {wait:.2f}s",
                        "; next route" if setbacks.moves_on(route) else "",
                    )
                except BaseException as exc:  # cancelled (the client left) or a bug: no verdict on the backend
                    if attempt_trace is not None:
                        attempt_trace.end(exc)
                    guard.limiter.release()
                    guard.breaker.release(permit)
                    raise
                else:
                    if not hold:
                        if record is not None:
                            record.upstream_ended = monotonic()
                        if recording and attempt_trace is not None:
                            attempt_trace.end()
                        guard.breaker.succeeded()
                        guard.limiter.release()
                    elif permit is Permit.TRIAL:
                        guard.breaker.succeeded()  # the backend answers: the trial is settled by the first event
                    return result, route, permit
            else:  # a full bulkhead: passed over for now, waited on when nothing else is left
                guard.breaker.release(permit)
                setbacks = setbacks or Setbacks(routes, self._clock, started)
                setbacks.busy.append(route)
            after = await setbacks.next()
            if after is None:
                error = setbacks.answer(metrics, model, _skipped(ops, entry, routes, request))
                log.warning("request %s: %s", request_id, error.message)
                raise error
            route, retry_reason, queue = after


def _skipped(ops: EndpointOps, entry: ModelEntry, routes: list[Route], request: Any) -> list[tuple[str, str]]:
    """The model's routes on this endpoint that were never tried because they cannot honour the request
    (computed only for a request that failed on every route it had)."""
    out: list[tuple[str, str]] = []
    for route in entry.served.get(ops.endpoint, ()):
        if route not in routes:
            refusal = ops.refusal(route.backend, request)
            if refusal is not None:
                out.append((route.backend.name, f"skipped, cannot honour `{refusal.param}`"))
    return out


async def _queue_for(guard: BackendGuard, permit: Permit, priority: int) -> bool:
    """Wait in ``guard``'s bounded queue for a slot (raises when refused); the permit is freed then."""
    try:
        await guard.limiter.acquire(priority)
    except BaseException:
        guard.breaker.release(permit)
        raise
    return True
