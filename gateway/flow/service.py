"""The request flow after validation: attempts over a model's routes, under each backend's guard.

The router gives the eligible routes in try order (the strategy's choice first). Then,
for each attempt:

1. the backend's circuit breaker must allow it; an open circuit is skipped (failover);
2. the backend's limiter must have a free slot; a full backend is passed over for the
   next route, and waited for (its bounded queue) only when no other route is left;
3. the backend is called: ``complete``, or ``stream`` plus the stream's first event. For
   streams the client's response has not started yet, so everything up to the first event
   can still fail over; after it nothing is retried (see ``gateway.http.handlers``);
4. a retryable failure (:func:`gateway.flow.retry.retryable`) moves on to the next route at once
   (failover), and the failed backend is queued for another try after a backoff when its
   retry policy allows: failover first, retries after. Anything else goes to the client,
   as does the last failure when no route is left.

When no route could even be tried because every circuit is open, the answer is a 503 with
``Retry-After`` (the shortest remaining cooldown) at once, not after a pile of timeouts.

Cost: the first iteration of the loop is the whole story for a request that does not
fail: one breaker check, one slot, one call. Retry state, schedules and lists are only
allocated once something failed or was skipped.

Slots: a non-streaming attempt holds its backend's slot while it runs; a stream keeps it
until :meth:`OpenedStream.aclose`. Cancellation (the client left) releases whatever the
attempt held and leaves the breaker's verdict open.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from backends.base import CompletionResult, CompletionStream, UpstreamCall
from backends.errors import UpstreamError
from gateway.clock import Clock
from gateway.flow.health import Permit, health_verdict
from gateway.flow.retry import RetryState, retryable
from gateway.flow.router import BackendGuard, ModelEntry, Route
from gateway.metrics import GatewayMetrics
from schemas.completions import CompletionRequest
from schemas.errors import ServiceUnavailableError

__all__ = ["CompletionService", "OpenedStream"]

log = logging.getLogger("gateway")

_T = TypeVar("_T")
_Attempt = Callable[[Route, UpstreamCall], Awaitable[_T]]


class OpenedStream:
    """A stream whose first event is in hand. Holds its backend's slot until :meth:`aclose`.

    The breaker hears how the stream ended: a failure after the first event counts
    against the backend (:meth:`failed`); a clean end counts for it, at :meth:`aclose`
    (a half-open trial was already settled by the first event); a client that left says
    nothing. Success is not counted at the first event, or a backend that always cuts its
    streams midway would look healthy.
    """

    __slots__ = ("_closed", "_verdict_due", "first", "route", "stream")

    def __init__(self, first: bytes, stream: CompletionStream, route: Route, *, verdict_due: bool) -> None:
        self.first = first
        self.stream = stream
        self.route = route
        self._verdict_due = verdict_due
        self._closed = False

    def failed(self, exc: UpstreamError) -> None:
        """The upstream failed after the first event: its breaker hears of it."""
        self._verdict_due = False
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


def _call_complete(route: Route, call: UpstreamCall) -> Awaitable[CompletionResult]:
    return route.backend.complete(call)


async def _call_stream(route: Route, call: UpstreamCall) -> tuple[bytes, CompletionStream]:
    stream = await route.backend.stream(call)
    try:
        first = await stream.__anext__()
    except StopAsyncIteration:
        first = b""
    except BaseException:
        await stream.aclose()
        raise
    return first, stream


class CompletionService:
    def __init__(self, metrics: GatewayMetrics, clock: Clock | None = None) -> None:
        self._metrics = metrics
        self._clock = clock if clock is not None else Clock()

    async def complete(
        self, entry: ModelEntry, routes: list[Route], request: CompletionRequest, request_id: str, priority: int = 0
    ) -> tuple[CompletionResult, Route]:
        result, route, _ = await self._run(
            entry.name, routes, request, request_id, priority, _call_complete, hold=False
        )
        return result, route

    async def open_stream(
        self, entry: ModelEntry, routes: list[Route], request: CompletionRequest, request_id: str, priority: int = 0
    ) -> OpenedStream:
        (first, stream), route, permit = await self._run(
            entry.name, routes, request, request_id, priority, _call_stream, hold=True
        )
        return OpenedStream(first, stream, route, verdict_due=permit is Permit.PASS)

    async def _run(
        self,
        model: str,
        routes: list[Route],
        request: CompletionRequest,
        request_id: str,
        priority: int,
        attempt: _Attempt[_T],
        *,
        hold: bool,
    ) -> tuple[_T, Route, Permit]:
        clock = self._clock
        metrics = self._metrics
        started = clock.now()
        tries = routes  # grows when a retry is scheduled (copied first: it is the caller's list)
        i = 0
        # Allocated only once something failed or was skipped:
        due: dict[int, tuple[float, str]] | None = None  # index in tries -> (start no sooner, reason)
        states: dict[BackendGuard, RetryState] | None = None
        busy: list[Route] | None = None  # full backends, passed over for now
        denied: list[Route] | None = None  # open circuits
        last: UpstreamError | None = None  # the latest retryable failure
        left: Route | None = None  # the route that failure came from
        while True:
            retry_reason: str | None = None
            may_wait = False
            if i < len(tries):
                route = tries[i]
                if due is not None and i in due:
                    at, retry_reason = due.pop(i)
                    delay = at - clock.now()
                    if delay > 0:
                        await clock.sleep(delay)
                i += 1
            elif busy:
                route = busy.pop(0)
                may_wait = True  # nothing else left: queue for this backend
            else:
                break
            guard = route.guard
            permit = guard.breaker.allow()
            if permit is Permit.DENY:
                if denied is None:
                    denied = []
                denied.append(route)
                continue
            if not guard.limiter.try_acquire():
                if not may_wait:
                    guard.breaker.release(permit)
                    if busy is None:
                        busy = []
                    busy.append(route)
                    continue
                try:
                    await guard.limiter.acquire(priority)
                except BaseException:
                    guard.breaker.release(permit)
                    raise
            if last is not None and left is not None:
                if retry_reason is not None:
                    metrics.retried(route.backend.name, retry_reason)
                else:
                    metrics.failed_over(model, left.backend.name, last.reason)

            call = UpstreamCall(request, route.upstream_model, model, request_id)
            try:
                result = await attempt(route, call)
            except UpstreamError as exc:
                guard.limiter.release()
                guard.breaker.outcome(exc, permit)
                metrics.upstream_error(route.backend.name, exc.reason)
                if not retryable(exc):
                    log.info(
                        "request %s: backend %s failed (%s), not retryable", request_id, route.backend.name, exc.reason
                    )
                    raise
                last, left = exc, route
                wait = None
                if guard.retry.attempts > 1:
                    if states is None:
                        states = {}
                    state = states.get(guard)
                    if state is None:
                        state = states[guard] = guard.retry.start(started)
                    wait = state.next_wait(exc)
                    if wait is not None:
                        if tries is routes:
                            tries = list(routes)
                        tries.append(route)
                        if due is None:
                            due = {}
                        due[len(tries) - 1] = (clock.now() + wait, exc.reason)
                log.info(
                    "request %s: backend %s failed (%s)%s%s",
                    request_id,
                    route.backend.name,
                    exc.reason,
                    "" if wait is None else f"; retry in {wait:.2f}s",
                    "; next route" if i < len(tries) and tries[i] is not route else "",
                )
                continue
            except BaseException:  # cancelled (the client left) or a bug: no verdict on the backend
                guard.limiter.release()
                guard.breaker.release(permit)
                raise
            if not hold:
                guard.breaker.succeeded()
                guard.limiter.release()
            elif permit is Permit.TRIAL:
                guard.breaker.succeeded()  # the backend answers: the trial is settled by the first event
            return result, route, permit

        if last is not None:
            raise last
        assert denied, "every route is tried, skipped as busy then waited for, or denied"
        metrics.unavailable(model)
        wait = min(r.guard.breaker.retry_in() for r in denied)
        raise ServiceUnavailableError(
            "no healthy backend can serve this model right now; retry later",
            code="no_healthy_upstream",
            retry_after=max(1.0, wait),
        )
