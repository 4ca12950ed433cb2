"""The circuit breaker's state machine, driven directly with a fake clock."""

from __future__ import annotations

from typing import Any

from backends.errors import UpstreamConnectError, UpstreamStatusError
from gateway.flow.health import CircuitBreaker, CircuitState, Permit, health_verdict
from schemas.config import CircuitBreakerConfig
from tests.gateway.flow.conftest import FakeClock


def breaker(clock: FakeClock, **config: Any) -> tuple[CircuitBreaker, list[tuple[str, CircuitState]]]:
    changes: list[tuple[str, CircuitState]] = []
    settings = {"consecutive_failures": 3, "failure_rate": None, "cooldown": 10, **config}
    b = CircuitBreaker(
        "b1", CircuitBreakerConfig.model_validate(settings), clock, lambda name, s: changes.append((name, s))
    )
    return b, changes


def test_opens_after_n_consecutive_failures() -> None:
    b, changes = breaker(FakeClock())
    for _ in range(2):
        assert b.allow() is Permit.PASS
        b.failed()
    assert b.state is CircuitState.CLOSED
    b.failed()
    assert b.state is CircuitState.OPEN
    assert b.allow() is Permit.DENY
    assert changes == [("b1", CircuitState.OPEN)]


def test_a_success_resets_the_streak() -> None:
    b, _ = breaker(FakeClock())
    for _ in range(10):
        b.failed()
        b.failed()
        b.succeeded()
    assert b.state is CircuitState.CLOSED


def test_half_open_after_cooldown_lets_exactly_one_trial_through() -> None:
    clock = FakeClock()
    b, changes = breaker(clock)
    for _ in range(3):
        b.failed()
    clock.advance(9.9)
    assert b.allow() is Permit.DENY
    assert 0 < b.retry_in() <= 0.1 + 1e-9
    clock.advance(0.2)
    assert b.allow() is Permit.TRIAL
    assert b.state is CircuitState.HALF_OPEN
    assert b.allow() is Permit.DENY  # one trial at a time
    b.succeeded()
    assert b.state is CircuitState.CLOSED
    assert b.allow() is Permit.PASS
    assert [s for _, s in changes] == [CircuitState.OPEN, CircuitState.HALF_OPEN, CircuitState.CLOSED]


def test_a_failed_trial_reopens_for_a_new_cooldown() -> None:
    clock = FakeClock()
    b, _ = breaker(clock)
    for _ in range(3):
        b.failed()
    clock.advance(10)
    assert b.allow() is Permit.TRIAL
    b.failed()
    assert b.state is CircuitState.OPEN
    clock.advance(5)
    assert b.allow() is Permit.DENY  # the cooldown restarted at the trial's failure
    clock.advance(5)
    assert b.allow() is Permit.TRIAL


def test_a_trial_without_verdict_frees_the_trial_slot() -> None:
    clock = FakeClock()
    b, _ = breaker(clock)
    for _ in range(3):
        b.failed()
    clock.advance(10)
    permit = b.allow()
    assert permit is Permit.TRIAL
    b.outcome(UpstreamStatusError(429, "slow down"), permit)  # rate limited: says nothing about health
    assert b.state is CircuitState.HALF_OPEN
    assert b.allow() is Permit.TRIAL  # someone else may try


def test_failure_rate_over_the_window() -> None:
    b, _ = breaker(FakeClock(), consecutive_failures=100, failure_rate=0.5, window=10, min_requests=10)
    for _ in range(9):  # alternate: never two failures in a row
        b.failed()
        b.succeeded()
        if b.state is CircuitState.OPEN:
            break
    # After 10 outcomes, half of them failures: open.
    assert b.state is CircuitState.OPEN


def test_failure_rate_needs_min_requests() -> None:
    b, _ = breaker(FakeClock(), consecutive_failures=100, failure_rate=0.5, window=20, min_requests=10)
    b.succeeded()
    b.failed()
    b.failed()  # 2 of 3 failed, but only 3 outcomes known
    assert b.state is CircuitState.CLOSED


def test_old_outcomes_leave_the_window() -> None:
    b, _ = breaker(FakeClock(), consecutive_failures=100, failure_rate=0.5, window=4, min_requests=4)
    b.failed()
    b.succeeded()
    for _ in range(3):
        b.succeeded()  # the failure slides out
    b.failed()
    assert b.state is CircuitState.CLOSED  # 1 of the last 4


def test_disabled_breaker_never_opens() -> None:
    b, _ = breaker(FakeClock(), enabled=False)
    for _ in range(100):
        b.failed()
    assert b.allow() is Permit.PASS


def test_verdicts() -> None:
    assert health_verdict(UpstreamConnectError("x")) is False
    assert health_verdict(UpstreamStatusError(503, "x")) is False
    assert health_verdict(UpstreamStatusError(408, "x")) is False
    # A 4xx about the request is no verdict on the backend (issue 13.13): not a failure, and no
    # success that would reset a failing backend's streak either.
    assert health_verdict(UpstreamStatusError(400, "bad prompt")) is None
    assert health_verdict(UpstreamStatusError(429, "x")) is None


def test_a_client_error_settles_a_half_open_trial() -> None:
    clock = FakeClock()
    b, _ = breaker(clock)
    for _ in range(3):
        b.failed()
    clock.advance(60)
    assert b.allow() is Permit.TRIAL
    b.outcome(UpstreamStatusError(400, "bad prompt"), Permit.TRIAL)  # the backend answered: it is back
    assert b.state is CircuitState.CLOSED


def test_probes_feed_the_same_state() -> None:
    clock = FakeClock()
    b, _ = breaker(clock)
    for _ in range(3):
        b.probe(False)
    assert b.state is CircuitState.OPEN
    clock.advance(8)
    b.probe(False)  # still down: the cooldown starts over
    clock.advance(8)
    assert b.allow() is Permit.DENY
    b.probe(True)  # back: no need to wait out the cooldown, the next request is the trial
    assert b.state is CircuitState.HALF_OPEN
    assert b.allow() is Permit.TRIAL
    b.succeeded()
    assert b.state is CircuitState.CLOSED
