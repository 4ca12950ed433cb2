"""The retry policy's decisions, driven directly: what is retried, how long it waits, when it stops."""

from __future__ import annotations

import pytest

from backends.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeoutError,
)
from gateway.flow.retry import RetryPolicy, retryable
from schemas.config import RetryConfig
from tests.gateway.flow.conftest import FakeClock


def policy(clock: FakeClock | None = None, **config: float) -> RetryPolicy:
    settings = {"attempts": 5, "backoff_base": 0.1, "backoff_max": 1.0, "jitter": 0.0, **config}
    return RetryPolicy.from_config(RetryConfig.model_validate(settings), clock or FakeClock())


def status(code: int, retry_after: float | None = None) -> UpstreamStatusError:
    return UpstreamStatusError(code, "upstream said no", retry_after=retry_after, backend="b")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (UpstreamConnectError("refused"), True),
        (UpstreamTimeoutError("slow"), True),
        (status(429), True),
        (status(500), True),
        (status(502), True),
        (status(503), True),
        (status(504), True),
        (UpstreamProtocolError("cut", reason="stream_cut"), True),  # before the first byte only
        (UpstreamProtocolError("silent", reason="stream_idle"), True),
        (status(400), False),
        (status(401), False),
        (status(404), False),
        (status(413), False),
        (status(422), False),
        (status(501), False),
        (UpstreamProtocolError("not json"), False),
        (UpstreamProtocolError("error event", reason="stream_error"), False),
        (ValueError("a bug"), False),
    ],
)
def test_what_is_retryable(exc: BaseException, expected: bool) -> None:
    assert retryable(exc) is expected
    state = policy().start(1000.0)
    assert (state.next_wait(exc) is not None) is expected


def test_backoff_doubles_up_to_its_cap_then_attempts_run_out() -> None:
    state = policy(attempts=6, backoff_base=0.1, backoff_max=0.5).start(1000.0)
    waits = [state.next_wait(status(503)) for _ in range(6)]
    assert waits == [pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.4), 0.5, 0.5, None]


def test_one_attempt_means_no_retry() -> None:
    assert policy(attempts=1).start(1000.0).next_wait(UpstreamConnectError("x")) is None


def test_jitter_stays_within_its_bound() -> None:
    waits = [policy(jitter=0.05, backoff_base=0.1).start(1000.0).next_wait(status(503)) for _ in range(200)]
    assert all(w is not None and 0.1 <= w <= 0.15 for w in waits)
    assert len(set(waits)) > 1  # it is random


def test_retry_after_is_honoured_over_a_shorter_backoff() -> None:
    state = policy(backoff_base=0.1, max_retry_after=10).start(1000.0)
    assert state.next_wait(status(429, retry_after=3)) == 3.0
    assert state.next_wait(status(503, retry_after=0)) == pytest.approx(0.2)  # backoff wins over a shorter pause


def test_retry_after_beyond_the_cap_means_no_retry_of_that_backend() -> None:
    state = policy(max_retry_after=2).start(1000.0)
    assert state.next_wait(status(429, retry_after=30)) is None


def test_deadline_includes_the_wait_before_the_next_try() -> None:
    clock = FakeClock()
    state = policy(clock, attempts=10, backoff_base=1.0, backoff_max=1.0, deadline=2.5).start(clock.now())
    assert state.next_wait(status(503)) == 1.0  # next try at t+1
    clock.advance(1.0)
    assert state.next_wait(status(503)) == 1.0  # next try at t+2
    clock.advance(1.0)
    assert state.next_wait(status(503)) is None  # a try at t+3 would be past the 2.5 s deadline


def test_time_spent_in_attempts_counts_against_the_deadline() -> None:
    clock = FakeClock()
    state = policy(clock, attempts=10, backoff_base=0.1, deadline=5).start(clock.now())
    clock.advance(4.95)  # a slow first attempt
    assert state.next_wait(UpstreamTimeoutError("slow")) is None


def test_attempt_numbers_are_per_state() -> None:
    p = policy(attempts=2)
    first, second = p.start(1000.0), p.start(1000.0)
    assert first.next_wait(status(503)) is not None
    assert first.next_wait(status(503)) is None
    assert second.next_wait(status(503)) is not None  # the policy itself holds no per-request state


def test_policy_is_built_from_composable_tenacity_objects() -> None:
    from tenacity.retry import retry_all
    from tenacity.stop import stop_any

    p = policy()
    assert isinstance(p.stop, stop_any)
    assert isinstance(p.retry, retry_all)


def test_an_error_without_retry_after_attribute_is_fine() -> None:
    class Odd(UpstreamError):
        retryable = True

    assert policy().start(1000.0).next_wait(Odd("x")) == pytest.approx(0.1)
