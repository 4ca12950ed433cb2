"""Admission control: caps on requests in flight, each with a bounded priority wait queue.

One :class:`Limiter` is the gateway-wide cap (``server.admission``); every backend has one
too: capped at its ``max_concurrency`` (a bulkhead), or uncapped, when it only counts the
backend's requests in flight (for the ``least_outstanding`` strategy).

Contract of a limiter:
- ``try_acquire()`` takes a slot at once or returns False. It never barges past waiters.
- ``await acquire(priority)`` takes a slot, waiting if need be: interactive before batch,
  first come first served within a priority, at most ``timeout`` seconds; raises
  :class:`QueueRejected` (a 429 with ``Retry-After``) when the queue is full or the wait
  timed out. A waiter that is cancelled (its client left) leaves the queue at once, and a
  slot handed to it in that instant is passed on, so no slot leaks.
- every successful acquire is paired with exactly one ``release()``. A released slot goes
  straight to the first waiter, so the cap holds exactly.

Memory is bounded: at most ``queue_size`` waiters, one future each. The fast path (a free
slot, nobody waiting) is two comparisons and an increment. Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Mapping

from gateway.metrics import GATEWAY_SCOPE, GatewayMetrics
from schemas.config import PRIORITIES, AdmissionConfig
from schemas.errors import InvalidRequestError, RateLimitError

__all__ = ["GATEWAY_SCOPE", "Admission", "Limiter", "QueueRejected"]

_LEVELS = {name: level for level, name in enumerate(PRIORITIES)}
_RETRY_AFTER = 1.0  # seconds: saturation comes and goes in bursts; a client should come back soon


class QueueRejected(RateLimitError):
    """429: no slot free and no room (``queue_full``) or no time (``queue_timeout``) to wait for one."""

    def __init__(self, scope: str, reason: str) -> None:
        where = "the gateway" if scope == GATEWAY_SCOPE else "the model's backend"
        why = "its wait queue is full" if reason == "queue_full" else "no capacity freed up in time"
        super().__init__(f"{where} is at capacity ({why}); retry shortly", code=reason, retry_after=_RETRY_AFTER)
        self.scope = scope
        self.reason = reason


class Limiter:
    __slots__ = ("_metrics", "_queued", "_queues", "active", "limit", "name", "queue_size", "timeout")

    def __init__(
        self,
        name: str,
        limit: int | None,
        *,
        queue_size: int,
        timeout: float,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.name = name
        self.limit = limit if limit is not None else sys.maxsize
        self.queue_size = queue_size
        self.timeout = timeout
        self.active = 0  # slots held
        self._queued = 0  # futures waiting across all priorities
        self._queues: tuple[deque[asyncio.Future[None]], ...] = tuple(deque() for _ in PRIORITIES)
        self._metrics = metrics

    @property
    def waiting(self) -> int:
        return self._queued

    def try_acquire(self) -> bool:
        if self.active < self.limit and not self._queued:
            self.active += 1
            return True
        return False

    async def acquire(self, priority: int) -> None:
        if self.active < self.limit and not self._queued:
            self.active += 1
            return
        await self._wait(priority)

    def release(self) -> None:
        if self._queued:
            for queue in self._queues:
                while queue:
                    fut = queue.popleft()
                    self._queued -= 1
                    if not fut.done():  # a waiter that gave up may still sit here for an instant
                        fut.set_result(None)  # the slot changes hands: ``active`` stays
                        self._depth_changed()
                        return
            self._depth_changed()
        self.active -= 1

    async def _wait(self, priority: int) -> None:
        if self._queued >= self.queue_size:
            raise self._reject("queue_full")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        queue = self._queues[priority]
        queue.append(fut)
        self._queued += 1
        self._depth_changed()
        started = loop.time()
        try:
            async with asyncio.timeout(self.timeout):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot just as we gave up: pass it on
            else:
                try:
                    queue.remove(fut)
                except ValueError:
                    pass  # ``release`` already dropped it
                else:
                    self._queued -= 1
                    self._depth_changed()
            if isinstance(exc, TimeoutError):
                raise self._reject("queue_timeout") from None
            raise
        if self._metrics is not None:
            self._metrics.queue_wait(self.name, loop.time() - started)

    def _reject(self, reason: str) -> QueueRejected:
        if self._metrics is not None:
            self._metrics.admission_rejected(self.name, reason)
        return QueueRejected(self.name, reason)

    def _depth_changed(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth(self.name, self._queued)


class Admission:
    """The gateway-wide limiter plus the request's priority, read from a header."""

    __slots__ = ("_default", "_header", "limiter")

    def __init__(self, config: AdmissionConfig, metrics: GatewayMetrics | None = None) -> None:
        self.limiter = Limiter(
            GATEWAY_SCOPE,
            config.max_in_flight,
            queue_size=config.queue_size,
            timeout=config.queue_timeout,
            metrics=metrics,
        )
        self._header = config.priority_header
        self._default = _LEVELS[config.default_priority]

    def priority_of(self, headers: Mapping[str, str]) -> int:
        """0 (interactive) or 1 (batch); an unknown value is refused, not guessed at."""
        value = headers.get(self._header)
        if value is None:
            return self._default
        level = _LEVELS.get(value.strip().lower())
        if level is None:
            raise InvalidRequestError(
                f"header {self._header} must be one of {', '.join(PRIORITIES)}", code="invalid_priority"
            )
        return level
