"""Counters in this process: exact for one replica (see :mod:`gateway.security.ratelimit`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.security.ratelimit.base import CONCURRENCY_RETRY, MINUTE, Limits, LimitStore, Reservation, Verdict

__all__ = ["MemoryStore"]


class _Bucket:
    __slots__ = ("level", "stamp")

    def __init__(self, level: float, stamp: float) -> None:
        self.level = level
        self.stamp = stamp

    def refill(self, capacity: int, now: float) -> float:
        level = self.level + (now - self.stamp) * capacity / MINUTE
        self.level = level if level < capacity else float(capacity)
        self.stamp = now
        return self.level


class _KeyState:
    __slots__ = ("active", "requests", "tokens")

    def __init__(self, limits: Limits, now: float) -> None:
        self.requests = _Bucket(float(limits.rpm or 0), now)
        self.tokens = _Bucket(float(limits.tpm or 0), now)
        self.active = 0


class MemoryStore(LimitStore):
    """Counters in this process: exact for one replica. ``clock`` returns seconds (monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keys: dict[str, _KeyState] = {}

    def _state(self, key: str, limits: Limits, now: float) -> _KeyState:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _KeyState(limits, now)
        return state

    def decide(self, key: str, limits: Limits, tokens: int) -> tuple[Verdict, Reservation | None]:
        now = self._clock()
        state = self._state(key, limits, now)
        rpm, tpm, most = limits.rpm, limits.tpm, limits.max_concurrent
        requests = state.requests.refill(rpm, now) if rpm else 0.0
        budget = state.tokens.refill(tpm, now) if tpm else 0.0
        reason: str | None = None
        wait: float | None = None
        if most is not None and state.active >= most:
            reason, wait = "concurrency", CONCURRENCY_RETRY
        elif rpm and requests < 1:
            reason, wait = "requests", (1 - requests) * MINUTE / rpm
        elif tpm and tokens > tpm:
            reason = "too_large"
        elif tpm and budget < tokens:
            reason, wait = "tokens", (tokens - budget) * MINUTE / tpm
        if reason is not None:
            return Verdict(False, requests, budget, reason, wait), None
        if rpm:
            state.requests.level = requests = requests - 1
        if tpm:
            state.tokens.level = budget = budget - tokens
        state.active += 1
        return Verdict(True, requests, budget), Reservation(self, key, limits, tokens)

    async def acquire(self, key: str, limits: Limits, tokens: int) -> tuple[Verdict, Reservation | None]:
        return self.decide(key, limits, tokens)

    def release(self, reservation: Reservation, used: int | None) -> None:
        state = self._keys.get(reservation.key)
        if state is None:
            return
        state.active = max(0, state.active - 1)
        tpm = reservation.limits.tpm
        if tpm and used is not None and used != reservation.tokens:
            level = state.tokens.refill(tpm, self._clock()) + reservation.tokens - used
            state.tokens.level = min(float(tpm), level)

    def levels(self, key: str, limits: Limits) -> Verdict:
        now = self._clock()
        state = self._state(key, limits, now)
        requests = state.requests.refill(limits.rpm, now) if limits.rpm else 0.0
        budget = state.tokens.refill(limits.tpm, now) if limits.tpm else 0.0
        return Verdict(True, requests, budget)

    async def peek(self, key: str, limits: Limits) -> Verdict:
        return self.levels(key, limits)
