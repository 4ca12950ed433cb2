"""Routes, failover and retries through the real gateway, against fake upstreams on loopback."""

from __future__ import annotations

import logging

import aiohttp
import orjson
import pytest

from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.flow.conftest import Make, body, error_of, eventually, metric, post, sse_events

TWO_ROUTES = """
server: {host: 127.0.0.1, port: 0}
backends:
  - {name: a, type: openai, base_url: '$A', timeout: $t, retry: $RA}
  - {name: b, type: vllm, base_url: '$up1', timeout: $t, retry: $RB}
models:
  - name: m
    strategy: $S
    routes: [{backend: a, model: up-a}, {backend: b, model: up-b}]
"""

ONE_ROUTE = """
server: {host: 127.0.0.1, port: 0}
backends:
  - {name: a, type: openai, base_url: '$up0', timeout: $t, retry: $RA}
models:
  - {name: m, routes: [{backend: a, model: up-a}]}
"""

NO_JITTER = "{attempts: 1, backoff_base: 0.5, backoff_max: 10, jitter: 0}"


def two_routes(a: str = "$up0", ra: str = NO_JITTER, rb: str = NO_JITTER, strategy: str = "failover") -> str:
    return TWO_ROUTES.replace("$A", a).replace("$RA", ra).replace("$RB", rb).replace("$S", strategy)


def one_route(ra: str = NO_JITTER) -> str:
    return ONE_ROUTE.replace("$RA", ra)


def retry(**fields: float) -> str:
    settings = {"attempts": 1, "backoff_base": 0.5, "backoff_max": 10, "jitter": 0, **fields}
    return "{" + ", ".join(f"{k}: {v}" for k, v in settings.items()) + "}"


def texts(raw: bytes) -> list[str]:
    events = sse_events(raw)
    assert events[-1] == b"data: [DONE]"
    return [c["choices"][0]["text"] for c in (orjson.loads(e[6:]) for e in events[:-1]) if c.get("choices")]


# --- failover -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_failover_on_connect_error(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession, stream: bool
) -> None:
    gw = await make(two_routes(a="$dead"))
    status, _, raw = await post(session, gw, body(stream=stream))
    assert status == 200, raw
    assert len(upstreams[1].requests) == 1
    assert upstreams[1].requests[0].body["model"] == "up-b"
    assert gw.clock.sleeps == []  # failover does not wait
    assert await metric(session, gw, "gateway_failovers_total", model="m", backend="a", reason="connect") == 1
    assert await metric(session, gw, "gateway_requests_total", model="m", backend="b", status="200") == 1


async def test_failover_on_5xx_and_timeout_before_first_byte(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(two_routes())
    upstreams[0].script.append(Behaviour(kind="status", status=503, body={"error": {"message": "overloaded"}}))
    status, _, _ = await post(session, gw, body())
    assert status == 200
    upstreams[0].script.append(Behaviour(kind="cut", events=0))  # stream cut before its first event
    status, _, raw = await post(session, gw, body(stream=True))
    assert status == 200 and texts(raw) == [" t0", " t1", " t2"]
    assert len(upstreams[0].requests) == 2 and len(upstreams[1].requests) == 2


async def test_no_retry_and_no_failover_on_a_4xx_about_the_request(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(two_routes(ra=retry(attempts=3)))
    upstreams[0].script.append(
        Behaviour(kind="status", status=400, body={"error": {"message": "prompt is too long", "type": "x"}})
    )
    status, _, raw = await post(session, gw, body())
    assert status == 400
    assert "prompt is too long" in error_of(raw)["message"]
    assert len(upstreams[0].requests) == 1
    assert upstreams[1].requests == []
    assert gw.clock.sleeps == []


async def test_all_routes_failing_returns_the_last_failure(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(two_routes())
    for up in upstreams[:2]:
        up.script.append(Behaviour(kind="status", status=500, body={"error": {"message": "internal secret"}}))
    status, headers, raw = await post(session, gw, body())
    assert status == 502
    error = error_of(raw)
    assert error["type"] == "upstream_error" and "internal secret" not in error["message"]
    assert headers.get("x-request-id")
    assert [len(up.requests) for up in upstreams[:2]] == [1, 1]


# --- retries --------------------------------------------------------------------------------


async def test_retry_same_backend_with_exponential_backoff(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(one_route(retry(attempts=3, backoff_base=0.5)))
    upstreams[0].script.extend(
        [
            Behaviour(kind="status", status=503, body={"error": {"message": "busy"}}),
            Behaviour(kind="status", status=502, body={"error": {"message": "bad gateway"}}),
        ]
    )
    status, _, _ = await post(session, gw, body())
    assert status == 200
    assert len(upstreams[0].requests) == 3
    assert gw.clock.sleeps == [0.5, 1.0]
    assert await metric(session, gw, "gateway_retries_total", backend="a", reason="status_503") == 1
    assert await metric(session, gw, "gateway_retries_total", backend="a", reason="status_502") == 1
    # the same request id went upstream on every try
    ids = {v for seen in upstreams[0].requests for k, v in seen.headers.items() if k.lower() == "x-request-id"}
    assert len(ids) == 1


async def test_failed_attempts_are_logged_with_the_request_id(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    gw = await make(two_routes(ra=retry(attempts=2)))
    upstreams[0].script.append(Behaviour(kind="status", status=503, body={}))
    status, headers, _ = await post(session, gw, body(), headers={"x-request-id": "trace-me-42"})
    assert status == 200 and headers["x-request-id"] == "trace-me-42"
    lines = [r.getMessage() for r in caplog.records if "trace-me-42" in r.getMessage()]
    assert lines == ["request trace-me-42: backend a failed (status_503); retry in 0.50s; next route"]
    assert "sk-" not in caplog.text


async def test_retries_stop_after_the_attempts(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(one_route(retry(attempts=2)))
    upstreams[0].script.extend([Behaviour(kind="status", status=502, body={})] * 3)
    status, _, _ = await post(session, gw, body())
    assert status == 502
    assert len(upstreams[0].requests) == 2


async def test_retry_after_is_honoured(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(one_route(retry(attempts=2, backoff_base=0.1, max_retry_after=5)))
    upstreams[0].script.append(
        Behaviour(kind="status", status=429, body={"error": {"message": "slow"}}, headers={"Retry-After": "3"})
    )
    status, _, _ = await post(session, gw, body())
    assert status == 200
    assert gw.clock.sleeps == [3.0]


async def test_retry_after_beyond_the_cap_is_passed_to_the_client(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(one_route(retry(attempts=3, max_retry_after=2)))
    upstreams[0].script.append(
        Behaviour(kind="status", status=429, body={"error": {"message": "slow"}}, headers={"Retry-After": "30"})
    )
    status, headers, raw = await post(session, gw, body())
    assert status == 429
    assert headers["Retry-After"] == "30"
    assert error_of(raw)["type"] == "rate_limit_error"
    assert len(upstreams[0].requests) == 1 and gw.clock.sleeps == []


async def test_retries_are_bounded_by_the_deadline(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(one_route(retry(attempts=10, backoff_base=1, backoff_max=1, deadline=2.5)))
    upstreams[0].script.extend([Behaviour(kind="status", status=503, body={})] * 10)
    status, _, _ = await post(session, gw, body())
    assert status == 503
    assert gw.clock.sleeps == [1.0, 1.0]
    assert len(upstreams[0].requests) == 3


async def test_failover_first_then_retry_after_backoff(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(two_routes(ra=retry(attempts=2, backoff_base=0.25)))
    upstreams[0].script.append(Behaviour(kind="status", status=503, body={}))
    upstreams[1].script.append(Behaviour(kind="status", status=503, body={}))
    status, _, _ = await post(session, gw, body())
    assert status == 200
    assert [len(up.requests) for up in upstreams[:2]] == [2, 1]
    assert gw.clock.sleeps == [0.25]


async def test_stream_is_retried_before_its_first_byte(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(one_route(retry(attempts=2)))
    upstreams[0].script.append(Behaviour(kind="cut", events=0))
    status, _, raw = await post(session, gw, body(stream=True))
    assert status == 200
    assert texts(raw) == [" t0", " t1", " t2"]
    assert len(upstreams[0].requests) == 2


async def test_stream_is_never_retried_after_its_first_byte(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(two_routes(ra=retry(attempts=3)))
    upstreams[0].script.append(Behaviour(kind="cut", events=2))
    status, _, raw = await post(session, gw, body(stream=True, max_tokens=6))
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == b"data: [DONE]"
    tail = orjson.loads(events[-2][6:])
    assert set(tail) == {"error"} and tail["error"]["type"] == "upstream_error"
    chunks = [orjson.loads(e[6:]) for e in events[:-2]]
    assert [c["choices"][0]["text"] for c in chunks] == [" t0", " t1"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)  # nothing invented
    assert len(upstreams[0].requests) == 1 and upstreams[1].requests == []
    assert gw.clock.sleeps == []
    assert await metric(session, gw, "gateway_stream_failures_total", model="m", backend="a", reason="stream_cut") == 1


# --- strategies -----------------------------------------------------------------------------


async def test_round_robin_spreads_requests(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(two_routes(strategy="round_robin"))
    for _ in range(10):
        assert (await post(session, gw, body()))[0] == 200
    assert [len(up.requests) for up in upstreams[:2]] == [5, 5]


async def test_weighted_follows_route_weights(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    config = two_routes(strategy="weighted").replace("model: up-a}", "model: up-a, weight: 3}")
    gw = await make(config)
    for _ in range(8):
        assert (await post(session, gw, body()))[0] == 200
    assert [len(up.requests) for up in upstreams[:2]] == [6, 2]


async def test_failover_applies_under_round_robin(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(two_routes(a="$dead", strategy="round_robin"))
    for _ in range(4):
        assert (await post(session, gw, body()))[0] == 200
    assert len(upstreams[1].requests) == 4


async def test_least_outstanding_avoids_the_busy_route(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(two_routes(strategy="least_outstanding"))
    upstreams[0].script.append(Behaviour(kind="ok", delay=0.05))  # a slow stream holds route a
    upstreams[1].script.append(Behaviour(kind="ok", delay=0.05))
    slow = await session.post(f"{gw.url}/v1/completions", json=body(stream=True, max_tokens=40))
    await slow.content.readuntil(b"\n\n")
    busy = 0 if upstreams[0].open_streams else 1
    for _ in range(3):
        assert (await post(session, gw, body()))[0] == 200
    assert len(upstreams[1 - busy].requests) == 3  # every later request went to the idle route
    assert len(upstreams[busy].requests) == 1
    slow.close()
    await eventually(lambda: upstreams[busy].open_streams == 0)
