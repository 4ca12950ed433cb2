"""Routing inside a pool, through the gateway's HTTP API, with stand-in workers.

Stand-ins answer text starting with `` w<port>``, so each answer says which worker served it.
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest

from tests.backends.vllm.pool.conftest import MakePoolGateway, PoolGateway, control, states, wait_for

PORT = re.compile(r" w(\d+)")
FAST_ROUTING = "{strategy: prefix-affinity, metrics_interval: 0.05, wait_for_ready: 10, block_chars: 64}"


async def complete(session: aiohttp.ClientSession, gw: PoolGateway, prompt: str, *, stream: bool = False) -> int:
    """Send one completion; return the port of the worker that served it."""
    body = {"model": "m", "prompt": prompt, "max_tokens": 3, "stream": stream}
    async with session.post(f"{gw.url}/v1/completions", json=body) as resp:
        text = await resp.text()
        assert resp.status == 200, text
    if stream:
        assert text.endswith("data: [DONE]\n\n") and '"error"' not in text, text
    match = PORT.search(text)
    assert match, text
    return int(match.group(1))


async def ready(gw: PoolGateway) -> None:
    await wait_for(lambda: all(s == "ready" for s in states(gw.pool)), what=f"all ready: {states(gw.pool)}")


def port_of(gw: PoolGateway, index: int) -> int:
    port = gw.pool.supervisor.workers[index].port
    assert port is not None
    return port


async def test_shared_prefixes_stick_to_one_worker(make_pool_gateway: MakePoolGateway) -> None:
    gw = await make_pool_gateway(workers=3, routing=FAST_ROUTING)
    await ready(gw)
    groups = [f"system prompt {g}: " + "you are a helpful assistant. " * 6 for g in range(6)]
    served: dict[int, set[int]] = {g: set() for g in range(6)}
    async with aiohttp.ClientSession() as session:
        for i in range(4):
            for g, prefix in enumerate(groups):
                served[g].add(await complete(session, gw, prefix + f"question {i}?", stream=i % 2 == 1))
    assert all(len(ports) == 1 for ports in served.values()), served
    assert len(set().union(*served.values())) == 3  # new prefixes spread by load
    decisions = gw.pool.dispatcher.balancer.decisions
    assert (decisions["affinity_miss"], decisions["affinity_hit"]) == (6, 18)


async def test_affine_worker_overloaded_falls_back_to_load(make_pool_gateway: MakePoolGateway) -> None:
    gw = await make_pool_gateway(workers=2, routing=FAST_ROUTING)
    await ready(gw)
    prompt = "shared context " * 20
    async with aiohttp.ClientSession() as session:
        first = await complete(session, gw, prompt + "a")
        affine = next(w for w in gw.pool.supervisor.workers if w.port == first)
        await control(session, first, kv=0.99)
        await wait_for(lambda: affine.endpoint.load.kv_cache_usage == 0.99, what="scraped KV usage")
        second = await complete(session, gw, prompt + "b")
        assert second != first
        # Both hold the prefix now; the less loaded holder gets it.
        other = next(w for w in gw.pool.supervisor.workers if w.port == second)
        await control(session, first, kv=0.1)
        await control(session, second, kv=0.5)
        await wait_for(
            lambda: affine.endpoint.load.kv_cache_usage == 0.1 and other.endpoint.load.kv_cache_usage == 0.5,
            what="scraped KV usage",
        )
        assert await complete(session, gw, prompt + "c") == first
    decisions = gw.pool.dispatcher.balancer.decisions
    assert (decisions["affinity_miss"], decisions["affinity_overloaded"], decisions["affinity_hit"]) == (1, 1, 1)


async def test_least_load_follows_each_workers_own_queue(make_pool_gateway: MakePoolGateway) -> None:
    gw = await make_pool_gateway(workers=2, routing="{strategy: least-load, metrics_interval: 0.05}")
    await ready(gw)
    ep0, ep1 = (w.endpoint for w in gw.pool.supervisor.workers)
    async with aiohttp.ClientSession() as session:
        await control(session, port_of(gw, 0), waiting=20)
        await wait_for(lambda: ep0.load.waiting == 20, what="scraped queue")
        assert {await complete(session, gw, f"q{i}") for i in range(6)} == {port_of(gw, 1)}
        # Equal queues: the emptier KV cache wins.
        await control(session, port_of(gw, 0), waiting=0, kv=0.1)
        await control(session, port_of(gw, 1), kv=0.8)
        await wait_for(lambda: ep0.load.waiting == 0 and ep1.load.kv_cache_usage == 0.8, what="scrape")
        assert {await complete(session, gw, f"r{i}") for i in range(6)} == {port_of(gw, 0)}


async def test_requests_in_flight_spread_evenly(make_pool_gateway: MakePoolGateway) -> None:
    gw = await make_pool_gateway(workers=2, routing="{strategy: least-load, metrics_interval: 5}")
    await ready(gw)
    async with aiohttp.ClientSession() as session:
        for i in range(2):  # long enough that all 8 are in flight together, even on a loaded machine
            await control(session, port_of(gw, i), delay=1.0)
        ports = await asyncio.gather(*(complete(session, gw, f"p{i}") for i in range(8)))
    assert sorted(ports.count(port_of(gw, i)) for i in range(2)) == [4, 4]


@pytest.mark.parametrize("stream", [False, True])
async def test_worker_crash_fails_no_request(make_pool_gateway: MakePoolGateway, stream: bool) -> None:
    gw = await make_pool_gateway(workers=2, routing="{strategy: least-load, metrics_interval: 5}")
    await ready(gw)
    victim = gw.pool.supervisor.workers[0]
    async with aiohttp.ClientSession() as session:
        for i in range(2):
            await control(session, port_of(gw, i), delay=0.5)
        requests = [asyncio.ensure_future(complete(session, gw, f"p{i}", stream=stream)) for i in range(10)]
        await wait_for(lambda: victim.endpoint.in_flight > 0, what="requests on the victim")
        await control(session, port_of(gw, 0), crash=9)
        ports = await asyncio.gather(*requests)  # every one answered 200 (complete() asserts it)
    assert set(ports) <= {port_of(gw, 1), victim.port}
    await wait_for(lambda: victim.state == "ready" and victim.restarts == 1, what="victim restarted")
    async with aiohttp.ClientSession() as session:
        await control(session, port_of(gw, 1), delay=0.3)  # make the restarted worker the less loaded
        ports = await asyncio.gather(*(complete(session, gw, f"again{i}") for i in range(4)))
    assert port_of(gw, 0) in ports  # and it serves again


async def test_lone_worker_crash_waits_for_its_restart(make_pool_gateway: MakePoolGateway) -> None:
    gw = await make_pool_gateway(workers=1)
    await ready(gw)
    worker = gw.pool.supervisor.workers[0]
    old_port = worker.port
    async with aiohttp.ClientSession() as session:
        await control(session, port_of(gw, 0), delay=0.5)
        request = asyncio.ensure_future(complete(session, gw, "hello"))
        await wait_for(lambda: worker.endpoint.in_flight > 0, what="request in flight")
        await control(session, port_of(gw, 0), crash=1)
        assert await request != old_port  # served by the restarted worker, on a fresh port


async def test_no_ready_worker_is_a_503_with_retry_after(make_pool_gateway: MakePoolGateway) -> None:
    gw = await make_pool_gateway(
        extra_args=("--standin-list-model", "other"), routing="{metrics_interval: 0.05, wait_for_ready: 0.2}"
    )
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "prompt": "hi", "max_tokens": 2}
        async with session.post(f"{gw.url}/v1/completions", json=body) as resp:
            data = await resp.json()
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "5"
    assert data["error"]["code"] == "upstream_unavailable"
    assert "no worker of backend 'pool' is ready (1 starting)" in data["error"]["message"]
