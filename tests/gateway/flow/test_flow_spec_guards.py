"""The request flow's policy, as a specification: circuit breakers and bulkheads.

Same harness as ``test_flow_spec.py``: the service as the app factory builds it, scripted
in-memory backends, a fake clock (cooldowns pass with ``clock.advance``). Requests that
must be in flight at once run as tasks; ``eventually`` waits for a backend to have them.
"""

from __future__ import annotations

import asyncio

import pytest

from backends.errors import UpstreamConnectError, UpstreamStatusError
from gateway.flow.admission import QueueRejected
from gateway.flow.health import CircuitState
from schemas.errors import ServiceUnavailableError
from tests.fakes import Reply
from tests.gateway.flow.conftest import eventually
from tests.gateway.flow.scripted import Flow, backend_yaml, build_flow, flow

COOLDOWN = 30.0
FRAGILE = {"circuit_breaker": {"consecutive_failures": 1, "failure_rate": None, "cooldown": COOLDOWN}}
ONE_SLOT = {"max_concurrency": 1}


async def open_circuit(f: Flow, name: str) -> None:
    """One failure of ``name`` (a FRAGILE backend) opens its circuit."""
    f[name].queue(Reply.fail(UpstreamConnectError("refused")))
    try:
        await f.complete()
    except UpstreamConnectError:
        pass
    assert f.metric("gateway_circuit_state", backend=name) == CircuitState.OPEN


# --- circuit breakers -------------------------------------------------------------------------


async def test_an_open_circuit_is_skipped_for_the_next_route() -> None:
    f = flow("a", "b", a=FRAGILE)
    await open_circuit(f, "a")
    _, answered = await f.complete()
    assert answered == "b"
    assert f.called() == ["a", "b", "b"]  # the second request never reached a


async def test_when_every_circuit_is_open_the_answer_is_503_at_once_with_the_cooldown_left() -> None:
    f = flow("a", a=FRAGILE)
    await open_circuit(f, "a")
    f.clock.advance(10)
    with pytest.raises(ServiceUnavailableError) as raised:
        await f.complete()
    assert (raised.value.status, raised.value.code) == (503, "no_healthy_upstream")
    assert raised.value.retry_after == pytest.approx(COOLDOWN - 10)
    assert f.called() == ["a"]
    assert f.clock.sleeps == []  # no waiting for the cooldown
    assert f.metric("gateway_no_healthy_route_total", model="m") == 1


async def test_the_503_asks_for_at_least_a_second() -> None:
    f = flow("a", a=FRAGILE)
    await open_circuit(f, "a")
    f.clock.advance(COOLDOWN - 0.1)
    with pytest.raises(ServiceUnavailableError) as raised:
        await f.complete()
    assert raised.value.retry_after == 1.0


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_after_the_cooldown_a_successful_trial_closes_the_circuit(stream: bool) -> None:
    f = flow("a", "b", a=FRAGILE)
    await open_circuit(f, "a")
    f.clock.advance(COOLDOWN)
    if stream:
        opened = await f.open_stream()
        answered = opened.route.backend.name
        await opened.aclose()
    else:
        _, answered = await f.complete()
    assert answered == "a"
    assert f.metric("gateway_circuit_state", backend="a") == CircuitState.CLOSED


async def test_a_failed_trial_reopens_the_circuit_for_a_new_cooldown() -> None:
    f = flow("a", "b", a=FRAGILE)
    await open_circuit(f, "a")
    f.clock.advance(COOLDOWN)
    f["a"].queue(Reply.fail(UpstreamStatusError(500, "still down")))
    _, answered = await f.complete()  # the trial fails, the request fails over
    assert answered == "b"
    assert f.metric("gateway_circuit_state", backend="a") == CircuitState.OPEN
    f.clock.advance(COOLDOWN - 1)
    await f.complete()
    assert f.called() == ["a", "b", "a", "b", "b"]  # opened, trial, then still cooling down: a skipped


async def test_only_one_trial_at_a_time() -> None:
    f = flow("a", "b", a=FRAGILE)
    await open_circuit(f, "a")
    f.clock.advance(COOLDOWN)
    trial = Reply.stalled()
    f["a"].queue(trial)
    first = asyncio.create_task(f.complete())
    await eventually(lambda: f["a"].active == 1)
    _, answered = await f.complete()
    assert answered == "b"  # a's trial is under way: a is not tried again meanwhile
    trial.release()
    assert (await first)[1] == "a"
    assert f.metric("gateway_circuit_state", backend="a") == CircuitState.CLOSED


async def test_a_stream_failing_after_its_first_event_counts_against_the_backend() -> None:
    f = flow("a", a=FRAGILE)
    error = UpstreamConnectError("reset")
    f["a"].queue(Reply.stream_then_fail(1, error))
    opened = await f.open_stream()
    with pytest.raises(UpstreamConnectError):
        await opened.stream.__anext__()
    opened.failed(error)  # what the handler reports when a stream ends this way
    await opened.aclose()
    assert f.metric("gateway_circuit_state", backend="a") == CircuitState.OPEN


async def test_a_429_says_nothing_about_the_backends_health() -> None:
    f = flow("a", a=FRAGILE)
    f["a"].queue(Reply.fail(UpstreamStatusError(429, "slow down")))
    with pytest.raises(UpstreamStatusError):
        await f.complete()
    assert f.metric("gateway_circuit_state", backend="a") == CircuitState.CLOSED


# --- bulkheads --------------------------------------------------------------------------------


async def test_a_full_backend_is_passed_over_for_a_route_with_room() -> None:
    f = flow("a", "b", a=ONE_SLOT)
    held = Reply.stalled()
    f["a"].queue(held)
    first = asyncio.create_task(f.complete())
    await eventually(lambda: f["a"].active == 1)
    _, answered = await f.complete()
    assert answered == "b"
    assert f.called() == ["a", "b"]  # a was not called while full
    held.release()
    assert (await first)[1] == "a"


async def test_when_every_route_is_full_the_request_waits_for_the_first_to_free_a_slot() -> None:
    f = flow("a", "b", a=ONE_SLOT, b=ONE_SLOT)
    on_a, on_b = Reply.stalled(), Reply.stalled()
    f["a"].queue(on_a)
    f["b"].queue(on_b)
    holders = [asyncio.create_task(f.complete()) for _ in range(2)]
    await eventually(lambda: f["a"].active == 1 and f["b"].active == 1)
    waiter = asyncio.create_task(f.complete())
    await eventually(lambda: f.metric("gateway_queue_depth", scope="a") == 1)
    assert not waiter.done()
    on_a.release()
    assert (await waiter)[1] == "a"
    on_b.release()
    assert [(await h)[1] for h in holders] == ["a", "b"]
    assert f.called() == ["a", "b", "a"]


async def test_a_full_backend_with_no_room_to_wait_refuses_with_429() -> None:
    f = build_flow(backend_yaml("a", **ONE_SLOT), ["a"], server="admission: {queue_size: 0}")
    held = Reply.stalled()
    f["a"].queue(held)
    first = asyncio.create_task(f.complete())
    await eventually(lambda: f["a"].active == 1)
    with pytest.raises(QueueRejected) as raised:
        await f.complete()
    assert (raised.value.status, raised.value.code, raised.value.retry_after) == (429, "queue_full", 1.0)
    assert f.called() == ["a"]
    held.release()
    await first


async def test_a_stream_keeps_its_backend_slot_until_it_is_closed() -> None:
    f = flow("a", "b", a=ONE_SLOT)
    opened = await f.open_stream()
    assert opened.route.backend.name == "a"
    assert (await f.complete())[1] == "b"  # a's slot is still held by the open stream
    await opened.aclose()
    assert (await f.complete())[1] == "a"
