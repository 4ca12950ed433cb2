"""A client that goes away cancels the upstream at once, and nothing leaks.

Every test checks from the fake upstream's side that its request was abandoned (the
gateway closed the connection, which is what stops vLLM generating), and from the
gateway's side that no slot, queue entry or handler task was left behind.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.flow.conftest import FakeClock, Gateway, Make, body, eventually, metric, post

CONFIG = """
server:
  host: 127.0.0.1
  port: 0
  admission: {max_in_flight: 1, queue_size: 10, queue_timeout: 10}
backends:
  - name: a
    type: openai
    base_url: '$up0'
    timeout: $t
    max_concurrency: 5
    retry: {attempts: 3, backoff_base: 5, jitter: 0}
models:
  - {name: m, routes: [{backend: a, model: up-a}]}
"""


class EndlessBackoffClock(FakeClock):
    """Backoffs are recorded and never end, so a client can leave during one (no timing window)."""

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.Event().wait()


def assert_nothing_held(gw: Gateway) -> None:
    state = gw.state
    backend = state.router.models["m"].routes[0].guard.limiter
    assert state.admission.limiter.active == 0 and state.admission.limiter.waiting == 0
    assert backend.active == 0 and backend.waiting == 0
    assert len(state.in_flight) == 0


async def leave_after(session: aiohttp.ClientSession, gw: Gateway, seconds: float, **fields: object) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await session.post(
            f"{gw.url}/v1/completions", json=body(**fields), timeout=aiohttp.ClientTimeout(total=seconds)
        )


@pytest.mark.parametrize("stream", [False, True])
async def test_leaving_while_the_upstream_thinks_cancels_it(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession, stream: bool
) -> None:
    gw = await make(CONFIG)
    up = upstreams[0]
    tasks_before = len(asyncio.all_tasks())
    up.script.append(Behaviour(kind="hold"))  # never released: only the client leaving ends it
    await leave_after(session, gw, 0.2, stream=stream)
    await eventually(lambda: up.cancelled == 1)
    assert up.active == 0
    await eventually(lambda: up.open_connections == 0)
    await eventually(lambda: len(gw.state.in_flight) == 0)
    assert_nothing_held(gw)
    assert await metric(session, gw, "gateway_client_disconnects_total", model="m", backend="_none") == 1
    await eventually(lambda: len(asyncio.all_tasks()) <= tasks_before + 1)  # + the metrics scrape's connection


async def test_leaving_mid_stream_cancels_the_upstream_stream(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(CONFIG)
    up = upstreams[0]
    up.script.append(Behaviour(kind="stall_mid", events=1, delay=3600))  # ends only if cancelled
    resp = await session.post(f"{gw.url}/v1/completions", json=body(stream=True, max_tokens=500))
    await resp.content.readuntil(b"\n\n")
    resp.close()
    await eventually(lambda: up.cancelled_streams == 1 and up.open_streams == 0)
    await eventually(lambda: up.open_connections == 0)
    await eventually(lambda: len(gw.state.in_flight) == 0)
    assert_nothing_held(gw)
    assert await metric(session, gw, "gateway_client_disconnects_total", model="m", backend="a") == 1
    assert await metric(session, gw, "gateway_requests_total", model="m", backend="a", status="499") == 1


async def test_leaving_while_queued_leaves_the_queue(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(CONFIG)
    up = upstreams[0]
    held = Behaviour(kind="hold")
    up.script.append(held)
    holder = asyncio.create_task(post(session, gw, body()))
    await eventually(lambda: up.active == 1)
    await leave_after(session, gw, 0.1)  # waits behind the holder (max_in_flight 1), then leaves
    await eventually(lambda: gw.state.admission.limiter.waiting == 0)
    assert up.active == 1  # it left the queue at once: the holder's slot has not come free yet
    held.release()
    assert (await holder)[0] == 200
    assert len(up.requests) == 1  # the one that left never reached the upstream
    assert_nothing_held(gw)
    assert (await post(session, gw, body()))[0] == 200  # the slot was not lost


async def test_leaving_during_a_retry_backoff_stops_the_retries(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(CONFIG, clock=EndlessBackoffClock())
    up = upstreams[0]
    up.script.append(Behaviour(kind="status", status=503, body={}))
    await leave_after(session, gw, 0.3)
    # The handler task has ended (in_flight is left in its ``finally``): nothing can retry later.
    await eventually(lambda: len(gw.state.in_flight) == 0)
    assert gw.clock.sleeps == [5.0]
    assert len(up.requests) == 1  # no retry after the client left
    assert_nothing_held(gw)
