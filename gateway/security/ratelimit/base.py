"""What every limit store shares: the limits, a decision (:class:`Verdict`), a held
:class:`Reservation`, the :class:`LimitStore` interface. The package docstring says how the
counters work."""

from __future__ import annotations

import itertools
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass

__all__ = ["CONCURRENCY_RETRY", "MINUTE", "LimitStore", "Limits", "Reservation", "Verdict", "format_reset", "new_lease"]

MINUTE = 60.0
CONCURRENCY_RETRY = 1.0  # seconds: a slot frees when some request ends; no better estimate


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_concurrent is not None


@dataclass(slots=True)
class Verdict:
    """One admission decision, and the bucket levels after it (for the x-ratelimit-* headers).

    ``reason`` when refused: ``requests``, ``tokens``, ``concurrency``, or ``too_large``
    (the reservation exceeds ``tpm`` itself: waiting cannot help, so no ``retry_after``).
    """

    allowed: bool
    requests_level: float
    tokens_level: float
    reason: str | None = None
    retry_after: float | None = None

    def headers(self, limits: Limits) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for the limits that are set."""
        out: dict[str, str] = {}
        rpm, tpm = limits.rpm, limits.tpm
        if rpm is not None:
            level = self.requests_level
            out["x-ratelimit-limit-requests"] = str(rpm)
            out["x-ratelimit-remaining-requests"] = str(int(level)) if level > 0 else "0"
            out["x-ratelimit-reset-requests"] = format_reset((rpm - level) * MINUTE / rpm)
        if tpm is not None:
            level = self.tokens_level
            out["x-ratelimit-limit-tokens"] = str(tpm)
            out["x-ratelimit-remaining-tokens"] = str(int(level)) if level > 0 else "0"
            out["x-ratelimit-reset-tokens"] = format_reset((tpm - level) * MINUTE / tpm)
        return out


def format_reset(seconds: float) -> str:
    """Time until a bucket is full again, as OpenAI writes it: ``20ms``, ``1.5s``, ``6m0s``."""
    ms = int(seconds * 1000 + 0.5)
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, ms = divmod(ms, 60_000)
    whole, frac = divmod(ms, 1000)
    text = f"{whole}.{frac:03d}".rstrip("0").rstrip(".") if frac else str(whole)
    return f"{minutes}m{text}s" if minutes else f"{text}s"


@dataclass(slots=True)
class Reservation:
    """What one admitted request holds until :meth:`LimitStore.release` (exactly once)."""

    store: LimitStore  # the store that admitted it (a degraded Redis store's fallback, maybe)
    key: str
    limits: Limits
    tokens: int
    lease: str = ""  # the concurrency slot's id in a shared store


class LimitStore(ABC):
    """Where the counters live. ``acquire``/``peek`` are awaited on the request path; ``release``
    never blocks the response (a networked store finishes it in the background)."""

    @abstractmethod
    async def acquire(self, key: str, limits: Limits, tokens: int) -> tuple[Verdict, Reservation | None]:
        """Admit a request reserving ``tokens``, or refuse it; a reservation only when admitted."""

    @abstractmethod
    def release(self, reservation: Reservation, used: int | None) -> None:
        """End a request: free its concurrency slot and settle its tokens (``used`` None = the
        upstream reported no usage: keep what was reserved)."""

    @abstractmethod
    async def peek(self, key: str, limits: Limits) -> Verdict:
        """The current levels, taking nothing (headers of answers that reserved nothing)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; called once at shutdown."""


# Lease ids: a random per-process prefix plus a counter, re-made in a forked child (else it
# repeats the parent's ids, and in Redis one release frees another process's slot).
def _new_lease_prefix() -> None:
    global _LEASE_PREFIX, _lease_ids
    _LEASE_PREFIX = os.urandom(6).hex()
    _lease_ids = itertools.count(1)


_LEASE_PREFIX = ""
_lease_ids = itertools.count(1)
_new_lease_prefix()
os.register_at_fork(after_in_child=_new_lease_prefix)


def new_lease() -> str:
    return f"{_LEASE_PREFIX}-{next(_lease_ids)}"
