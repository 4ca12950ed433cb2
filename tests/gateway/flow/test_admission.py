"""Admission control through the real gateway: caps, bounded queues, 429s, priority, bulkheads."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.flow.conftest import Gateway, Make, body, error_of, eventually, metric, post

CONFIG = """
server:
  host: 127.0.0.1
  port: 0
  admission: {max_in_flight: 1, queue_size: $Q, queue_timeout: $QT}
backends:
  - {name: a, type: openai, base_url: '$up0', timeout: $t}
models:
  - {name: m, routes: [{backend: a, model: up-a}]}
"""

BULKHEAD = """
server:
  host: 127.0.0.1
  port: 0
  admission: {max_in_flight: 100, queue_size: 10, queue_timeout: 0.2}
backends:
  - {name: a, type: openai, base_url: '$up0', timeout: $t, max_concurrency: 1}
  - {name: b, type: openai, base_url: '$up1', timeout: $t}
models:
  - {name: m, routes: [{backend: a, model: up-a}, {backend: b, model: up-b}]}
  - {name: only-a, routes: [{backend: a, model: up-a}]}
"""


def config(queue_size: int = 10, queue_timeout: float = 5.0) -> str:
    return CONFIG.replace("$QT", str(queue_timeout)).replace("$Q", str(queue_size))


class Held:
    """A request in flight whose upstream answers only when the test calls :meth:`release`: the slot
    stays taken for exactly as long as the test needs, however slow the machine (no timing window)."""

    def __init__(self, task: asyncio.Task[tuple[int, object, bytes]], behaviour: Behaviour) -> None:
        self.task = task
        self.behaviour = behaviour

    async def release(self) -> tuple[int, object, bytes]:
        self.behaviour.release()
        return await self.task


async def hold(session: aiohttp.ClientSession, gw: Gateway, up: FakeUpstream, **fields: object) -> Held:
    """A request that keeps its slot until released, started and in flight at the upstream."""
    before = up.active
    behaviour = Behaviour(kind="hold")
    up.script.append(behaviour)
    task = asyncio.create_task(post(session, gw, body(**fields)))
    await eventually(lambda: up.active == before + 1)
    return Held(task, behaviour)


async def test_full_queue_answers_429_at_once(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(config(queue_size=0))
    holder = await hold(session, gw, upstreams[0])
    status, headers, raw = await post(session, gw, body())
    assert status == 429
    error = error_of(raw)
    assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
    assert headers["Retry-After"] == "1"
    assert (await holder.release())[0] == 200
    assert len(upstreams[0].requests) == 1
    assert await metric(session, gw, "gateway_admission_rejections_total", scope="_gateway", reason="queue_full") == 1
    assert await metric(session, gw, "gateway_requests_total", model="m", backend="_none", status="429") == 1


async def test_queue_timeout_answers_429(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(config(queue_timeout=0.1))
    holder = await hold(session, gw, upstreams[0])
    status, headers, raw = await post(session, gw, body())
    assert status == 429 and error_of(raw)["code"] == "queue_timeout" and headers["Retry-After"] == "1"
    assert (await holder.release())[0] == 200
    assert gw.state.admission.limiter.waiting == 0
    rejected = await metric(session, gw, "gateway_admission_rejections_total", scope="_gateway", reason="queue_timeout")
    assert rejected == 1


async def test_a_queued_request_is_served_when_a_slot_frees(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(config())
    holder = await hold(session, gw, upstreams[0])
    started = time.monotonic()
    waiter = asyncio.create_task(post(session, gw, body()))
    await eventually(lambda: gw.state.admission.limiter.waiting == 1)
    queued = time.monotonic()  # the waiter is in the queue from before this moment ...
    assert await metric(session, gw, "gateway_queue_depth", scope="_gateway") == 1
    assert len(upstreams[0].requests) == 1  # the cap holds: the second waits at the gateway
    freed = time.monotonic()  # ... to after this one
    assert (await holder.release())[0] == 200
    assert (await waiter)[0] == 200
    done = time.monotonic()
    assert await metric(session, gw, "gateway_queue_depth", scope="_gateway") == 0
    assert await metric(session, gw, "gateway_queue_wait_seconds_count", scope="_gateway") == 1
    waited = await metric(session, gw, "gateway_queue_wait_seconds_sum", scope="_gateway")
    assert freed - queued <= waited <= done - started


async def test_interactive_requests_are_admitted_before_batch(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(config())
    up = upstreams[0]
    holder = await hold(session, gw, up)
    limiter = gw.state.admission.limiter
    waiting = []
    for i, priority in enumerate(["batch", "batch", "interactive"]):
        payload = body(prompt=f"{priority}-{i}")
        waiting.append(asyncio.create_task(post(session, gw, payload, headers={"x-priority": priority})))
        await eventually(lambda n=i + 1: limiter.waiting == n)  # type: ignore[misc]
    await holder.release()
    assert [r[0] for r in await asyncio.gather(*waiting)] == [200, 200, 200]
    assert [seen.body["prompt"] for seen in up.requests[1:]] == ["interactive-2", "batch-0", "batch-1"]


async def test_unknown_priority_is_refused(make: Make, session: aiohttp.ClientSession) -> None:
    gw = await make(config())
    status, _, raw = await post(session, gw, body(), headers={"x-priority": "urgent"})
    assert status == 400 and error_of(raw)["code"] == "invalid_priority"


async def test_a_full_backend_fails_over_to_a_route_with_room(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(BULKHEAD)
    holder = await hold(session, gw, upstreams[0])
    for _ in range(3):
        assert (await post(session, gw, body()))[0] == 200
    assert len(upstreams[0].requests) == 1  # the bulkhead kept a at one request
    assert len(upstreams[1].requests) == 3
    assert (await holder.release())[0] == 200


async def test_a_full_backend_with_no_alternative_queues_then_429s(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(BULKHEAD)
    holder = await hold(session, gw, upstreams[0], model="only-a")
    status, _, raw = await post(session, gw, body("only-a"))
    assert status == 429 and error_of(raw)["code"] == "queue_timeout"
    assert await metric(session, gw, "gateway_admission_rejections_total", scope="a", reason="queue_timeout") == 1
    assert (await holder.release())[0] == 200
    limiter = gw.state.router.models["only-a"].routes[0].guard.limiter
    assert limiter.active == 0 and limiter.waiting == 0


async def test_streams_hold_their_backend_slot_until_they_end(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(BULKHEAD)
    limiter = gw.state.router.models["only-a"].routes[0].guard.limiter
    upstreams[0].script.append(Behaviour(kind="ok", delay=0.02))
    async with session.post(f"{gw.url}/v1/completions", json=body("only-a", stream=True, max_tokens=10)) as resp:
        first = await resp.content.readuntil(b"\n\n")
        assert orjson.loads(first[6:])["choices"][0]["text"] == " t0"
        assert limiter.active == 1
        await resp.read()
    await eventually(lambda: limiter.active == 0)
