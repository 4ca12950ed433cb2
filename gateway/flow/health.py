"""Backend health: a circuit breaker per backend, and optional active probes feeding it.

States::

    CLOSED --(N failures in a row, or failure rate over the window)--> OPEN
    OPEN   --(cooldown elapsed, or a probe succeeded)--> HALF_OPEN: the next request is the one trial
    HALF_OPEN --trial succeeded--> CLOSED      HALF_OPEN --trial failed--> OPEN (a new cooldown)

What counts (:func:`health_verdict`): no connection, timeouts, 5xx, 408 and broken
responses are failures; any other answer (a 400 about the request, 401, 404) shows the
backend is up and counts as a success; a 429, a client that went away, or any other failure
the request itself caused (:func:`client_caused`: the client gets a 4xx) says nothing.

The breaker is consulted on every attempt, so the closed path is a couple of attribute
reads; transitions report to ``on_change`` (the circuit-state gauge). Not thread-safe:
one event loop. Times come from the injected :class:`~gateway.clock.Clock`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from enum import IntEnum

from backends.base import Backend
from backends.errors import UpstreamError, UpstreamStatusError
from gateway.clock import Clock
from schemas.config import CircuitBreakerConfig, HealthCheckConfig

__all__ = ["CircuitBreaker", "CircuitState", "HealthProber", "Permit", "client_caused", "health_verdict"]

log = logging.getLogger("gateway.health")


class CircuitState(IntEnum):
    """Also the value of the ``gateway_circuit_state`` gauge."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Permit(IntEnum):
    """What :meth:`CircuitBreaker.allow` granted."""

    DENY = 0
    PASS = 1
    TRIAL = 2  # the half-open trial: its holder must report an outcome or ``release_trial``


_CLOSED = CircuitState.CLOSED  # module constants: the closed path runs on every request
_PASS = Permit.PASS


def client_caused(exc: UpstreamError) -> bool:
    """Whether the request, not the backend, is at fault: the client gets a 4xx other than
    408 (a timeout) and 429 (load), e.g. a 400/404/413/422 about what it sent. Such a
    failure never counts against the backend's breaker and is neither retried nor failed over.
    """
    status = exc.status
    return 400 <= status < 500 and status != 408 and status != 429


def health_verdict(exc: UpstreamError) -> bool | None:
    """False: the backend failed; True: it answered sensibly; None: no verdict (429, or a
    failure the request caused, see :func:`client_caused`). A 4xx about the request says
    nothing of the backend's health: counting it as a success would let a client that sends
    bad requests reset a failing backend's streak (the breaker settles a half-open trial on
    it all the same, see :meth:`CircuitBreaker.outcome`)."""
    if isinstance(exc, UpstreamStatusError):
        status = exc.upstream_status
        if status == 429 or client_caused(exc):
            return None
        return not (status >= 500 or status == 408)
    if client_caused(exc):
        return None  # e.g. an adapter that found the request unservable: nothing about the backend
    return False  # no connection, timeout, a cut or garbled response


class CircuitBreaker:
    __slots__ = (
        "_clock", "_cooldown", "_enabled", "_fails", "_i", "_max_streak", "_min", "_n", "_on_change",
        "_opened_at", "_rate", "_ring", "_streak", "_trial", "last_probe", "name", "state",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        config: CircuitBreakerConfig,
        clock: Clock,
        on_change: Callable[[str, CircuitState], None] | None = None,
    ) -> None:
        self.name = name
        self.state = CircuitState.CLOSED
        self._enabled = config.enabled
        self._max_streak = config.consecutive_failures
        self._rate = config.failure_rate or 0.0  # only read when the ring exists
        self._min = config.min_requests
        self._cooldown = config.cooldown
        self._clock = clock
        self._on_change = on_change
        self._streak = 0
        self._trial = False
        self._opened_at = 0.0
        # The last ``window`` outcomes (1 = failure) as a ring, with their count and sum.
        self._ring: list[int] | None = [0] * config.window if config.failure_rate is not None else None
        self._i = 0
        self._n = 0
        self._fails = 0
        self.last_probe: tuple[float, bool] | None = None  # (epoch seconds, healthy) of the last active probe

    # --- asking ------------------------------------------------------------------------
    def allow(self) -> Permit:
        """May a request go to this backend now? A TRIAL permit must be resolved by its holder."""
        if self.state is _CLOSED:
            return _PASS
        if self.state is CircuitState.OPEN:
            if self._clock.now() - self._opened_at < self._cooldown:
                return Permit.DENY
            self._set(CircuitState.HALF_OPEN)
        if self._trial:
            return Permit.DENY  # one trial at a time
        self._trial = True
        return Permit.TRIAL

    def retry_in(self) -> float:
        """Seconds until this backend may be tried again (0 when it may be now)."""
        if self.state is CircuitState.OPEN:
            return max(0.0, self._cooldown - (self._clock.now() - self._opened_at))
        if self.state is CircuitState.HALF_OPEN and self._trial:
            return 1.0  # a trial is under way; its answer comes within a request's time
        return 0.0

    # --- telling -------------------------------------------------------------------------
    def succeeded(self) -> None:
        if self.state is _CLOSED:
            self._streak = 0
            if self._ring is not None:
                if self._fails:
                    self._record(0)
                elif self._n < len(self._ring):
                    self._n += 1  # all zeros: where this success goes in the ring does not matter
        elif self.state is CircuitState.HALF_OPEN:
            self._close()
        # OPEN: a request that started before the circuit opened; the cooldown stands.

    def failed(self) -> None:
        if not self._enabled or self.state is CircuitState.OPEN:
            return  # OPEN: a late failure of a request that started before; the cooldown stands
        if self.state is CircuitState.HALF_OPEN:
            self._open()  # the trial failed: a new cooldown
            return
        self._streak += 1
        if self._streak >= self._max_streak:
            self._open()
            return
        if self._ring is not None:
            self._record(1)
            if self._n >= self._min and self._fails >= self._rate * self._n:
                self._open()

    def outcome(self, exc: UpstreamError, permit: Permit) -> None:
        """Report a failed attempt that was made under ``permit``."""
        verdict = health_verdict(exc)
        if verdict is None and permit is Permit.TRIAL and isinstance(exc, UpstreamStatusError) and client_caused(exc):
            self.succeeded()  # a trial only asks whether the backend answers: it did
        elif verdict is None:
            self.release(permit)
        elif verdict:
            self.succeeded()
        else:
            self.failed()

    def release(self, permit: Permit) -> None:
        """The holder of ``permit`` made no attempt, or got no verdict: free the trial."""
        if permit is Permit.TRIAL:
            self._trial = False

    def probe(self, healthy: bool) -> None:
        """An active probe's result: a failure counts like a request's; a success ends a cooldown early."""
        self.last_probe = (time.time(), healthy)
        if not healthy:
            if self.state is CircuitState.OPEN:
                self._opened_at = self._clock.now()  # still down: no trial yet
            else:
                self.failed()
        elif self.state is CircuitState.OPEN:
            self._set(CircuitState.HALF_OPEN)  # the next request is the trial

    # --- internals -------------------------------------------------------------------------
    def _record(self, failed: int) -> None:
        ring = self._ring
        assert ring is not None
        i = self._i
        self._fails += failed - ring[i]
        ring[i] = failed
        self._i = (i + 1) % len(ring)
        if self._n < len(ring):
            self._n += 1

    def _reset_counts(self) -> None:
        self._streak = 0
        self._trial = False
        if self._ring is not None:
            self._ring = [0] * len(self._ring)
            self._i = self._n = self._fails = 0

    def _open(self) -> None:
        self._reset_counts()
        self._opened_at = self._clock.now()
        if self.state is not CircuitState.OPEN:
            log.warning("backend %s: circuit open for %.1fs", self.name, self._cooldown)
        self._set(CircuitState.OPEN)

    def _close(self) -> None:
        self._reset_counts()
        if self.state is not CircuitState.CLOSED:
            log.info("backend %s: circuit closed", self.name)
        self._set(CircuitState.CLOSED)

    def _set(self, state: CircuitState) -> None:
        if state is not self.state:
            self.state = state
            if self._on_change is not None:
                self._on_change(self.name, state)


class HealthProber:
    """Periodic ``backend.health()`` per configured backend, fed into its breaker.

    Lifecycle: ``start()`` after the backends started, ``await close()`` before they close
    (both from the app's ``cleanup_ctx``); one task per probed backend, the first probe at
    once. A probe that raises or outlives ``timeout`` counts as unhealthy.
    """

    def __init__(self, targets: Iterable[tuple[Backend, CircuitBreaker, HealthCheckConfig]]) -> None:
        self._targets = list(targets)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for backend, breaker, config in self._targets:
            self._tasks.append(asyncio.create_task(self._run(backend, breaker, config), name=f"probe:{backend.name}"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _run(self, backend: Backend, breaker: CircuitBreaker, config: HealthCheckConfig) -> None:
        while True:
            await self.probe_once(backend, breaker, config)
            await asyncio.sleep(config.interval)  # real time, even under a test's fake clock

    @staticmethod
    async def probe_once(backend: Backend, breaker: CircuitBreaker, config: HealthCheckConfig) -> bool:
        try:
            async with asyncio.timeout(config.timeout):
                healthy = await backend.health()
        except Exception as exc:  # a probe must never kill its loop; the reason goes to the log
            log.debug("backend %s: probe failed (%s)", backend.name, type(exc).__name__)
            healthy = False
        breaker.probe(healthy)
        return healthy
