"""Circuit breaking and active probes through the real gateway."""

from __future__ import annotations

import asyncio

import aiohttp

from gateway.flow.health import CircuitState
from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.flow.conftest import Make, body, error_of, eventually, metric, post

BREAKER = "{consecutive_failures: 2, failure_rate: null, cooldown: 30}"

ONE_ROUTE = f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - {{name: a, type: openai, base_url: '$up0', timeout: $t, circuit_breaker: {BREAKER}}}
models:
  - {{name: m, routes: [{{backend: a, model: up-a}}]}}
"""

TWO_ROUTES = f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - {{name: a, type: openai, base_url: '$up0', timeout: $t, circuit_breaker: {BREAKER}}}
  - {{name: b, type: openai, base_url: '$up1', timeout: $t}}
models:
  - {{name: m, routes: [{{backend: a, model: up-a}}, {{backend: b, model: up-b}}]}}
"""

PROBED = f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - name: a
    type: vllm
    base_url: '$up0'
    timeout: $t
    circuit_breaker: {BREAKER}
    health_check: {{interval: 0.02, timeout: 1}}
models:
  - {{name: m, routes: [{{backend: a, model: up-a}}]}}
"""

FAIL = Behaviour(kind="status", status=500, body={"error": {"message": "boom"}})


async def test_circuit_opens_after_consecutive_failures_and_answers_503_quickly(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(ONE_ROUTE)
    up = upstreams[0]
    up.script.extend([FAIL, FAIL])
    assert (await post(session, gw, body()))[0] == 502
    assert (await post(session, gw, body()))[0] == 502
    assert await metric(session, gw, "gateway_circuit_state", backend="a") == CircuitState.OPEN

    status, headers, raw = await post(session, gw, body(stream=True))
    assert gw.clock.sleeps == []  # at once: no backoff, no waiting for the cooldown
    assert status == 503
    assert error_of(raw)["code"] == "no_healthy_upstream"
    assert headers["Retry-After"] == "30"
    assert len(up.requests) == 2  # the open circuit kept the request away from the upstream
    assert await metric(session, gw, "gateway_no_healthy_route_total", model="m") == 1
    assert await metric(session, gw, "gateway_circuit_opened_total", backend="a") == 1


async def test_half_open_trial_closes_the_circuit_on_success(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(ONE_ROUTE)
    up = upstreams[0]
    up.script.extend([FAIL, FAIL])
    for _ in range(2):
        await post(session, gw, body())
    gw.clock.advance(29)
    assert (await post(session, gw, body()))[0] == 503
    gw.clock.advance(1)
    assert (await post(session, gw, body()))[0] == 200  # the trial
    assert await metric(session, gw, "gateway_circuit_state", backend="a") == CircuitState.CLOSED
    assert (await post(session, gw, body()))[0] == 200
    assert len(up.requests) == 4


async def test_failed_trial_reopens(make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession) -> None:
    gw = await make(ONE_ROUTE)
    up = upstreams[0]
    up.script.extend([FAIL, FAIL, FAIL])
    for _ in range(2):
        await post(session, gw, body())
    gw.clock.advance(30)
    assert (await post(session, gw, body()))[0] == 502  # the trial failed
    assert await metric(session, gw, "gateway_circuit_state", backend="a") == CircuitState.OPEN
    assert (await post(session, gw, body()))[0] == 503
    assert len(up.requests) == 3


async def test_only_one_trial_at_a_time(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(ONE_ROUTE)
    up = upstreams[0]
    up.script.extend([FAIL, FAIL, Behaviour(kind="stall", delay=0.3)])
    for _ in range(2):
        await post(session, gw, body())
    gw.clock.advance(30)
    trial = asyncio.create_task(post(session, gw, body()))
    await eventually(lambda: up.active == 1)
    status, headers, _ = await post(session, gw, body())  # while the trial runs
    assert status == 503 and headers["Retry-After"] == "1"
    assert (await trial)[0] == 200
    assert len(up.requests) == 3


async def test_open_backend_is_skipped_for_the_next_route(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(TWO_ROUTES)
    upstreams[0].script.extend([FAIL, FAIL])
    for _ in range(2):
        assert (await post(session, gw, body()))[0] == 200  # failed over to b
    for _ in range(5):
        assert (await post(session, gw, body()))[0] == 200
    assert len(upstreams[0].requests) == 2  # ejected: no more time lost on a
    assert len(upstreams[1].requests) == 7


async def test_refused_connections_open_the_circuit(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(ONE_ROUTE)
    await upstreams[0].go_down()
    for _ in range(2):
        status, _, raw = await post(session, gw, body())
        assert status == 502 and error_of(raw)["code"] == "upstream_unreachable"
    assert (await post(session, gw, body()))[0] == 503
    await upstreams[0].come_up()
    gw.clock.advance(30)
    assert (await post(session, gw, body()))[0] == 200


async def test_a_400_does_not_count_against_the_backend(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(ONE_ROUTE)
    bad = Behaviour(kind="status", status=400, body={"error": {"message": "bad prompt"}})
    upstreams[0].script.extend([bad] * 5)
    for _ in range(5):
        assert (await post(session, gw, body()))[0] == 400
    assert await metric(session, gw, "gateway_circuit_state", backend="a") == CircuitState.CLOSED


async def test_mid_stream_failures_count_against_the_backend(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(ONE_ROUTE)
    upstreams[0].script.extend([Behaviour(kind="cut", events=1)] * 2)
    for _ in range(2):
        status, _, raw = await post(session, gw, body(stream=True))
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert await metric(session, gw, "gateway_circuit_state", backend="a") == CircuitState.OPEN


async def test_active_probes_open_and_recover_the_circuit(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(PROBED)
    up = upstreams[0]
    breaker = gw.state.router.models["m"].routes[0].guard.breaker
    await eventually(lambda: up.health_checks >= 2)
    assert breaker.state is CircuitState.CLOSED
    up.healthy = False
    await eventually(lambda: breaker.state is CircuitState.OPEN)
    status, _, _ = await post(session, gw, body())
    assert status == 503
    assert up.requests == []  # ejected by probes alone, before any request failed
    up.healthy = True
    await eventually(lambda: breaker.state is CircuitState.HALF_OPEN)  # no need to wait out the cooldown
    assert (await post(session, gw, body()))[0] == 200
    assert breaker.state is CircuitState.CLOSED
