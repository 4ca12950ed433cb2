"""The retry policy of one backend, built from tenacity's composable stop / wait / retry objects.

This is the gateway's one retry layer (the transport and the pool dispatcher do not resend
a request that may have reached an upstream); ``gateway.flow.service`` applies it.

The service runs the loop itself, because one request's attempts also move between a
model's routes, which tenacity's ``Retrying`` cannot express, and because ``Retrying``
times attempts with ``time.monotonic`` where we need the injectable clock. After a failed
try of a backend it asks that backend's policy the way tenacity's own loop does, through
tenacity's public strategy contract: each ``stop``/``wait``/``retry`` object is called with
a ``RetryCallState`` (its public constructor, ``set_exception``, ``prepare_for_next_attempt``
and the documented ``start_time``, ``outcome_timestamp``, ``idle_for``, ``upcoming_sleep``).
``pyproject.toml`` pins the tenacity range that has them all (``stop_before_delay`` and
``upcoming_sleep`` came in 8.3):

- ``retry``: is the failure worth another try here? Only failures that left nothing at the
  client and may pass (:func:`retryable`: no connection, timeout before any byte, a stream
  cut or silent before its first event, 429, 500/502/503/504), and only when the upstream's
  ``Retry-After``, if any, is within ``max_retry_after``. Never a 4xx about the request, nor
  a failure that would repeat on this backend (``retry_here``: a refused certificate, refused
  proxy credentials), which only fails over.
- ``wait``: how long first? Exponential backoff with jitter, and at least the Retry-After.
- ``stop``: out of attempts, or would the next try start past the deadline?

Never after the first byte of a stream: a stream's attempt ends when its first event is
in hand, and only attempts are retried; later failures end the stream (``gateway.http.handlers``).

Cost: nothing here runs while nothing fails. A :class:`RetryState` (one tenacity
``RetryCallState``) is created at a backend's first failure within a request; policies are
built once per backend at start-up and shared by every request.
"""

from __future__ import annotations

from tenacity import AsyncRetrying, RetryCallState
from tenacity.retry import retry_base, retry_if_exception
from tenacity.stop import stop_after_attempt, stop_base, stop_before_delay
from tenacity.wait import wait_base, wait_exponential_jitter

from backends.errors import RETRYABLE_BEFORE_FIRST_BYTE, UpstreamError
from backends.errors import retryable as upstream_retryable
from gateway.clock import Clock
from gateway.flow.health import client_caused
from schemas.config import RetryConfig

__all__ = [
    "RETRYABLE_BEFORE_FIRST_BYTE",
    "RetryPolicy",
    "RetryState",
    "retry_if_retry_after_within",
    "retryable",
    "retryable_here",
    "wait_retry_after",
]


def retryable(exc: BaseException) -> bool:
    """Whether another try (of this backend or of another route) may succeed where ``exc`` failed.

    The backends' rule (:func:`backends.errors.retryable`, also the one a pool uses to move a
    call to another worker), and never when the request caused it
    (:func:`gateway.flow.health.client_caused`): any backend would refuse it the same way.
    """
    return upstream_retryable(exc) and isinstance(exc, UpstreamError) and not client_caused(exc)


def retryable_here(exc: BaseException) -> bool:
    """Whether another try of the same backend may succeed: :func:`retryable`, unless the failure
    is one its next try would meet again (``UpstreamError.retry_here``, e.g. a TLS verification failure)."""
    return retryable(exc) and isinstance(exc, UpstreamError) and exc.retry_here


def _retry_after(state: RetryCallState) -> float | None:
    outcome = state.outcome
    if outcome is None or not outcome.failed:
        return None
    value = getattr(outcome.exception(), "retry_after", None)
    return value if isinstance(value, (int, float)) else None


class retry_if_retry_after_within(retry_base):  # lower case like tenacity's own
    """Retry unless the upstream asked for a longer pause than ``cap`` seconds.

    Such a backend is left alone for this request: waiting that long here would hold the
    client for longer than any other route or the client's own retry would take.
    """

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def __call__(self, retry_state: RetryCallState) -> bool:
        after = _retry_after(retry_state)
        return after is None or after <= self.cap


class wait_retry_after(wait_base):  # lower case like tenacity's own
    """``fallback``'s wait, but at least the upstream's ``Retry-After`` (itself at most ``cap``)."""

    def __init__(self, fallback: wait_base, cap: float) -> None:
        self.fallback = fallback
        self.cap = cap

    def __call__(self, retry_state: RetryCallState) -> float:
        wait = self.fallback(retry_state)
        after = _retry_after(retry_state)
        if after is None:
            return wait
        return max(wait, min(after, self.cap))


class RetryPolicy:
    """Shared, stateless decisions about one backend; per-request state lives in :class:`RetryState`."""

    __slots__ = ("attempts", "clock", "retry", "retrying", "stop", "wait")

    def __init__(self, *, stop: stop_base, wait: wait_base, retry: retry_base, clock: Clock, attempts: int = 0) -> None:
        self.stop = stop
        self.wait = wait
        self.retry = retry
        self.clock = clock
        # How many tries a request may make on this backend (0: unknown, decided by ``stop``);
        # lets the service skip the retry machinery for a backend that never retries.
        self.attempts = attempts
        # The same policy as tenacity's own controller; each ``RetryCallState`` names it (tenacity
        # uses that for repr and statistics only). Never iterated, so it holds no request's state.
        self.retrying = AsyncRetrying(stop=stop, wait=wait, retry=retry, sleep=clock.sleep)

    @classmethod
    def from_config(cls, config: RetryConfig, clock: Clock) -> RetryPolicy:
        backoff = wait_exponential_jitter(multiplier=config.backoff_base, max=config.backoff_max, jitter=config.jitter)
        return cls(
            stop=stop_after_attempt(config.attempts) | stop_before_delay(config.deadline),
            wait=wait_retry_after(backoff, cap=config.max_retry_after),
            retry=retry_if_exception(retryable_here) & retry_if_retry_after_within(config.max_retry_after),
            clock=clock,
            attempts=config.attempts,
        )

    def start(self, started: float) -> RetryState:
        """Retry bookkeeping for one request whose first attempt began at ``started`` (``clock.now()``)."""
        return RetryState(self, started)


class RetryState:
    """One backend's tries within one request. Not shared between requests."""

    __slots__ = ("_policy", "_state")

    def __init__(self, policy: RetryPolicy, started: float) -> None:
        self._policy = policy
        self._state = RetryCallState(policy.retrying, None, (), {})
        self._state.start_time = started

    @property
    def attempt_number(self) -> int:
        return self._state.attempt_number

    def next_wait(self, exc: BaseException) -> float | None:
        """Record a failed try; the seconds to wait before the next one, or None: no more tries here.

        Asks in tenacity's order: retry (is it worth it?), wait (how long?), stop (given
        that wait, are we out of attempts or past the deadline?).
        """
        policy, state = self._policy, self._state
        state.set_exception((type(exc), exc, exc.__traceback__))
        state.outcome_timestamp = policy.clock.now()  # our clock, so tests can fake time
        if not policy.retry(state):
            return None
        wait = state.upcoming_sleep = float(policy.wait(state))
        if policy.stop(state):
            return None
        state.idle_for += wait
        state.prepare_for_next_attempt()
        return wait
