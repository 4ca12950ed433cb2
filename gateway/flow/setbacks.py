"""A request's attempts after its first setback: the routes left, the retries due, the answer when none is left.

:class:`~gateway.flow.service.CompletionService` allocates a :class:`Setbacks` only once an attempt
failed, a circuit was open or a backend was full, so a request that goes through on its first
route pays for none of it. Failover first, retries (each after its backoff) after, then the full
backends again, this time waiting for a slot; when nothing is left, :meth:`Setbacks.answer` is the
client's error: the last failure, or a 503 when every circuit was open, saying what each route did.
"""

from __future__ import annotations

from backends.errors import UpstreamError
from gateway.clock import Clock
from gateway.flow.retry import RetryState
from gateway.flow.router import BackendGuard, Route
from gateway.metrics import GatewayMetrics
from schemas.errors import ServiceUnavailableError

__all__ = ["Setbacks"]


class Setbacks:
    """A request's attempts after its first setback (a failure, an open circuit, a full backend).

    Allocated only then, so a request that goes through on its first route pays for none of
    it. Holds the try order from the second route on (retries are appended to it with the
    time they may start), the full backends passed over, the open circuits skipped, and the
    latest retryable failure (the answer when nothing is left).
    """

    __slots__ = ("account", "busy", "clock", "denied", "due", "i", "last", "left", "retries", "started", "tries")

    def __init__(self, routes: list[Route], clock: Clock, started: float) -> None:
        self.tries = list(routes)  # copied: it is the caller's list, and retries grow it
        self.i = 1  # every setback happens on the first route: nothing passed it before
        self.clock = clock
        self.started = started
        self.due: dict[int, tuple[float, str]] = {}  # index in tries -> (start no sooner, reason)
        self.retries: dict[BackendGuard, RetryState] = {}
        self.busy: list[Route] = []  # full backends, passed over for now
        self.denied: list[Route] = []  # open circuits
        self.last: UpstreamError | None = None  # the latest retryable failure
        self.left: Route | None = None  # the route that failure came from
        self.account: list[tuple[str, str]] = []  # (backend, what happened there), in order: the answer's story

    async def next(self) -> tuple[Route, str | None, bool] | None:
        """The next route: (route, the retry's reason or None, whether to queue for a slot).

        Routes in order, each retry after its backoff; then the full backends again, this
        time waiting for a slot; None when nothing is left.
        """
        if self.i < len(self.tries):
            i = self.i
            self.i += 1
            scheduled = self.due.pop(i, None)
            if scheduled is None:
                return self.tries[i], None, False
            at, reason = scheduled
            delay = at - self.clock.now()
            if delay > 0:
                await self.clock.sleep(delay)
            return self.tries[i], reason, False
        if self.busy:
            return self.busy.pop(0), None, True
        return None

    def failed(self, route: Route, exc: UpstreamError) -> float | None:
        """A retryable failure on ``route``: remembered, and a later try of the same backend
        scheduled when its retry policy allows one. Returns that try's backoff, or None."""
        self.last, self.left = exc, route
        self.account.append((route.backend.name, _what(exc)))
        policy = route.guard.retry
        if policy.attempts == 1:
            return None
        state = self.retries.get(route.guard)
        if state is None:
            state = self.retries[route.guard] = policy.start(self.started)
        wait = state.next_wait(exc)
        if wait is not None:
            self.tries.append(route)
            self.due[len(self.tries) - 1] = (self.clock.now() + wait, exc.reason)
        return wait

    def deny(self, route: Route) -> None:
        """``route``'s circuit is open: skipped."""
        self.denied.append(route)
        self.account.append(
            (route.backend.name, f"skipped, circuit open (retry in {route.guard.breaker.retry_in():.1f}s)")
        )

    def moves_on(self, route: Route) -> bool:
        """Whether the next try goes to another route than ``route`` (for the log)."""
        return self.i < len(self.tries) and self.tries[self.i] is not route

    def answer(
        self, metrics: GatewayMetrics, model: str, skipped: list[tuple[str, str]]
    ) -> UpstreamError | ServiceUnavailableError:
        """What the client gets when no route is left: the last failure, or 503 when every circuit was open.

        With more than one route in the story (``account``, plus the routes ``skipped`` before any try
        because they cannot honour the request), the message says what each did, in order.
        """
        error: UpstreamError | ServiceUnavailableError
        if self.last is not None:
            error = self.last
        else:
            assert self.denied, "every route is tried, skipped as busy then waited for, or denied"
            metrics.unavailable(model)
            wait = min(r.guard.breaker.retry_in() for r in self.denied)
            error = ServiceUnavailableError(
                "no healthy backend can serve this model right now; retry later",
                code="no_healthy_upstream",
                retry_after=max(1.0, wait),
            )
        story = _merged(self.account + skipped)
        if len(story) > 1 or len(self.account) > 1:
            routes = "; ".join(f"{name}: {', then '.join(what)}" for name, what in story)
            error.message = f"No route of model '{model}' could answer: {routes}."
        return error


def _what(exc: UpstreamError) -> str:
    """One failure, short: its message (already redacted and bounded) cut to a line."""
    text = exc.message if len(exc.message) <= _WHAT_MAX else exc.message[:_WHAT_MAX] + "..."
    return text.replace("\n", " ")


_WHAT_MAX = 200


def _merged(account: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """``account`` by backend, in order of first appearance (a backend retried says each try)."""
    out: dict[str, list[str]] = {}
    for name, what in account:
        out.setdefault(name, []).append(what)
    return list(out.items())
