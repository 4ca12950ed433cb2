"""The request flow's policy, as a specification: failover, retries, streams and client errors.

Each test drives :class:`gateway.flow.service.CompletionService` as the app factory builds
it, over scripted in-memory backends (``tests.fakes.ScriptedBackend``) and a fake clock,
and asserts what the flow did: which backends were called in which order, how long it
slept, what it answered or raised, what the metrics counted. Breakers and bulkheads:
``test_flow_spec_guards.py``.
"""

from __future__ import annotations

import pytest

from backends.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeoutError,
)
from gateway.flow.health import CircuitState
from tests.fakes import Reply
from tests.gateway.flow.scripted import flow


def retry(attempts: int = 3, **fields: float) -> dict[str, float]:
    return {"attempts": attempts, "backoff_base": 0.5, "backoff_max": 10, "jitter": 0, **fields}


def retryable_errors() -> list[UpstreamError]:
    return [
        UpstreamConnectError("refused"),
        UpstreamTimeoutError("no first byte"),
        UpstreamStatusError(429, "slow down"),
        UpstreamStatusError(500, "boom"),
        UpstreamStatusError(502, "bad gateway"),
        UpstreamStatusError(503, "unavailable"),
        UpstreamStatusError(504, "timeout"),
        UpstreamProtocolError("cut before the first event", reason="stream_cut"),
        UpstreamProtocolError("silent before the first event", reason="stream_idle"),
    ]


# --- failover ---------------------------------------------------------------------------------


async def test_routes_are_tried_in_configuration_order_until_one_answers() -> None:
    f = flow("a", "b", "c")
    f["a"].queue(Reply.fail(UpstreamConnectError("refused")))
    f["b"].queue(Reply.fail(UpstreamStatusError(503, "busy")))
    _, answered = await f.complete()
    assert answered == "c"
    assert f.called() == ["a", "b", "c"]
    assert [c.upstream_model for c in f.journal] == ["up-a", "up-b", "up-c"]
    assert f.clock.sleeps == []  # failover does not wait


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("error", retryable_errors(), ids=lambda e: e.reason)
async def test_a_retryable_failure_fails_over_to_the_next_route(error: UpstreamError, stream: bool) -> None:
    f = flow("a", "b")
    f["a"].queue(Reply.fail(error))
    if stream:
        opened = await f.open_stream()
        answered = opened.route.backend.name
        await opened.aclose()
    else:
        _, answered = await f.complete()
    assert answered == "b"
    assert f.called() == ["a", "b"]


async def test_a_failover_is_counted_by_model_backend_left_and_reason() -> None:
    f = flow("a", "b")
    f["a"].queue(Reply.fail(UpstreamConnectError("refused")))
    await f.complete()
    assert f.metric("gateway_failovers_total", model="m", backend="a", reason="connect") == 1
    assert f.metric("gateway_upstream_errors_total", backend="a", reason="connect") == 1
    assert f.metric("gateway_retries_total", backend="a", reason="connect") == 0


async def test_when_every_route_fails_the_last_failure_goes_to_the_client() -> None:
    f = flow("a", "b")
    last = UpstreamStatusError(502, "bad gateway")
    f["a"].queue(Reply.fail(UpstreamConnectError("refused")))
    f["b"].queue(Reply.fail(last))
    with pytest.raises(UpstreamStatusError) as raised:
        await f.complete()
    assert raised.value is last
    assert f.called() == ["a", "b"]


async def test_a_broken_answer_is_neither_retried_nor_failed_over_but_counts_against_the_backend() -> None:
    f = flow("a", "b", a={"retry": retry(), "circuit_breaker": {"consecutive_failures": 1}})
    f["a"].queue(Reply.fail(UpstreamProtocolError("not JSON")))
    with pytest.raises(UpstreamProtocolError):
        await f.complete()
    assert f.called() == ["a"]
    assert f.metric("gateway_circuit_state", backend="a") == CircuitState.OPEN


# --- retries ----------------------------------------------------------------------------------


async def test_a_backend_is_retried_with_exponential_backoff_up_to_its_attempts() -> None:
    f = flow("a", a={"retry": retry(attempts=3)})
    f["a"].default = Reply.fail(UpstreamStatusError(503, "busy"))
    with pytest.raises(UpstreamStatusError):
        await f.complete()
    assert f.called() == ["a", "a", "a"]
    assert f.clock.sleeps == [0.5, 1.0]
    assert f.metric("gateway_retries_total", backend="a", reason="status_503") == 2


async def test_a_retry_that_succeeds_is_the_answer() -> None:
    f = flow("a", a={"retry": retry(attempts=3)})
    f["a"].queue(Reply.fail(UpstreamTimeoutError("slow")))
    _, answered = await f.complete()
    assert answered == "a"
    assert f.called() == ["a", "a"]
    assert f.clock.sleeps == [0.5]


async def test_one_attempt_means_no_retry() -> None:
    f = flow("a", a={"retry": retry(attempts=1)})
    f["a"].queue(Reply.fail(UpstreamConnectError("refused")))
    with pytest.raises(UpstreamConnectError):
        await f.complete()
    assert f.called() == ["a"]
    assert f.clock.sleeps == []


async def test_failover_comes_first_and_retries_after_their_backoff() -> None:
    f = flow("a", "b", a={"retry": retry(attempts=2)})
    f["a"].queue(Reply.fail(UpstreamConnectError("refused")))
    f["b"].queue(Reply.fail(UpstreamStatusError(500, "boom")))
    _, answered = await f.complete()
    assert answered == "a"
    assert f.called() == ["a", "b", "a"]
    assert f.clock.sleeps == [0.5]
    assert f.metric("gateway_failovers_total", model="m", backend="a", reason="connect") == 1
    assert f.metric("gateway_retries_total", backend="a", reason="connect") == 1


@pytest.mark.parametrize(
    ("retry_after", "slept"),
    [(None, 0.5), (0.1, 0.5), (2.0, 2.0), (10.0, 10.0)],
    ids=["none-backoff", "shorter-backoff", "longer-waited", "at-the-cap-waited"],
)
async def test_retry_after_is_waited_for_when_longer_than_the_backoff(retry_after: float | None, slept: float) -> None:
    f = flow("a", a={"retry": retry(attempts=2, max_retry_after=10)})
    f["a"].queue(Reply.fail(UpstreamStatusError(429, "slow down", retry_after=retry_after)))
    await f.complete()
    assert f.called() == ["a", "a"]
    assert f.clock.sleeps == [slept]


async def test_a_retry_after_beyond_the_cap_is_not_waited_for_and_reaches_the_client() -> None:
    f = flow("a", a={"retry": retry(attempts=3, max_retry_after=10)})
    f["a"].queue(Reply.fail(UpstreamStatusError(429, "slow down", retry_after=30)))
    with pytest.raises(UpstreamStatusError) as raised:
        await f.complete()
    assert (raised.value.status, raised.value.retry_after) == (429, 30)
    assert f.called() == ["a"]
    assert f.clock.sleeps == []


async def test_a_retry_after_beyond_the_cap_still_fails_over() -> None:
    f = flow("a", "b", a={"retry": retry(attempts=3, max_retry_after=10)})
    f["a"].queue(Reply.fail(UpstreamStatusError(429, "slow down", retry_after=30)))
    _, answered = await f.complete()
    assert answered == "b"
    assert f.called() == ["a", "b"]


async def test_no_retry_starts_past_the_deadline() -> None:
    # 0.5 s backoff fits in a 1 s deadline, the next (1 s) would not.
    f = flow("a", a={"retry": retry(attempts=5, deadline=1)})
    f["a"].default = Reply.fail(UpstreamConnectError("refused"))
    with pytest.raises(UpstreamConnectError):
        await f.complete()
    assert f.called() == ["a", "a"]
    assert f.clock.sleeps == [0.5]


async def test_time_spent_in_attempts_counts_against_the_deadline() -> None:
    f = flow("a", a={"retry": retry(attempts=5, deadline=1)})
    f["a"].default = Reply.fail(UpstreamTimeoutError("slow"), takes=0.6)  # 0.6 + 0.5 backoff > 1
    with pytest.raises(UpstreamTimeoutError):
        await f.complete()
    assert f.called() == ["a"]


# --- streams ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        Reply.fail(UpstreamConnectError("refused")),
        Reply.stream_then_fail(0, UpstreamProtocolError("cut", reason="stream_cut")),
        Reply.stream_then_fail(0, UpstreamTimeoutError("silent", reason="stream_idle")),
    ],
    ids=["at-the-call", "cut-before-first-event", "silent-before-first-event"],
)
async def test_a_stream_failing_before_its_first_event_is_retried_then_failed_over(reply: Reply) -> None:
    f = flow("a", "b", a={"retry": retry(attempts=2)})
    f["a"].queue(reply, reply)
    opened = await f.open_stream()
    assert opened.route.backend.name == "b"
    assert f.called() == ["a", "b"]
    await opened.aclose()
    assert f["a"].active == 0  # the failed attempt released its upstream


async def test_a_stream_is_never_retried_nor_failed_over_after_its_first_event() -> None:
    f = flow("a", "b", a={"retry": retry(attempts=3)})
    f["a"].queue(Reply.stream_then_fail(1, UpstreamConnectError("reset")))
    opened = await f.open_stream()
    assert opened.route.backend.name == "a"
    assert b" a1" in opened.first
    with pytest.raises(UpstreamConnectError):
        await opened.stream.__anext__()
    await opened.aclose()
    assert f.called() == ["a"]
    assert f.clock.sleeps == []
    assert f.metric("gateway_retries_total", backend="a", reason="connect") == 0
    assert f.metric("gateway_failovers_total", model="m", backend="a", reason="connect") == 0


# --- client errors ----------------------------------------------------------------------------

CLIENT_ERRORS = [400, 413, 422]


@pytest.mark.parametrize("status", CLIENT_ERRORS)
async def test_a_client_error_is_neither_retried_nor_failed_over(status: int) -> None:
    f = flow("a", "b", a={"retry": retry(attempts=3)})
    error = UpstreamStatusError(status, "bad prompt")
    f["a"].queue(Reply.fail(error))
    with pytest.raises(UpstreamStatusError) as raised:
        await f.complete()
    assert raised.value is error
    assert raised.value.status in (400, 413)
    assert f.called() == ["a"]
    assert f.clock.sleeps == []
    assert f.metric("gateway_failovers_total", model="m", backend="a", reason=f"status_{status}") == 0
    assert f.metric("gateway_retries_total", backend="a", reason=f"status_{status}") == 0


@pytest.mark.parametrize("status", CLIENT_ERRORS)
async def test_client_errors_never_open_the_circuit(status: int) -> None:
    f = flow("a", a={"circuit_breaker": {"consecutive_failures": 2, "failure_rate": None}})
    f["a"].default = Reply.fail(UpstreamStatusError(status, "bad prompt"))
    for _ in range(5):
        with pytest.raises(UpstreamStatusError):
            await f.complete()
    assert f.metric("gateway_circuit_state", backend="a") == CircuitState.CLOSED


@pytest.mark.parametrize("status", CLIENT_ERRORS)
async def test_a_client_error_is_not_counted_by_the_breaker_at_all(status: int) -> None:
    # A 4xx about the request is no success either: otherwise a client could keep a failing
    # backend's circuit closed by sending bad requests between its failures.
    f = flow("a", a={"circuit_breaker": {"consecutive_failures": 2, "failure_rate": None}})
    f["a"].queue(
        Reply.fail(UpstreamStatusError(500, "boom")),
        Reply.fail(UpstreamStatusError(status, "bad prompt")),
        Reply.fail(UpstreamStatusError(500, "boom")),
    )
    for _ in range(3):
        with pytest.raises(UpstreamStatusError):
            await f.complete()
    assert f.metric("gateway_circuit_state", backend="a") == CircuitState.OPEN
