"""``GET /ready`` with a ``vllm-pool``: not ready until its first worker is, ready after."""

from __future__ import annotations

import aiohttp

from tests.backends.vllm.pool.conftest import MakePoolGateway, states, wait_for


async def ready(url: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as session, session.get(url + "/ready") as resp:
        return resp.status, await resp.json()


async def test_not_ready_until_the_first_worker_is(make_pool_gateway: MakePoolGateway) -> None:
    gw = await make_pool_gateway(extra_args=("--standin-startup-delay", "0.5"))
    assert states(gw.pool) == ["starting"]
    assert await ready(gw.url) == (503, {"status": "not_ready", "reason": "no_routable_backend"})
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/health") as resp:
        assert resp.status == 200  # alive while it starts: liveness must not kill it
    await wait_for(lambda: states(gw.pool) == ["ready"], what="worker ready")
    assert await ready(gw.url) == (200, {"status": "ready"})
