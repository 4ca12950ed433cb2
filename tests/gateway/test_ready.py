"""``GET /ready`` (readiness) apart from ``GET /health`` (liveness).

Ready when some model has a route that can serve; not ready while draining, while every
breaker is open, or while a multi-server backend has no server up; never an upstream call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from backends.vllm.routing import VLLMEndpointsBackend
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from tests.backends.vllm.pool.conftest import MODEL, wait_for
from tests.backends.vllm.pool.standin_worker import build_app, parse_args
from tests.conftest import MakeGateway, free_port, serve_app


async def get(url: str, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url + path) as resp:
        return resp.status, await resp.json()


TWO_MOCKS = """
server: {host: 127.0.0.1, port: 0}
backends:
  - name: a
    type: mock
    circuit_breaker: {consecutive_failures: 1, cooldown: 600}
  - name: b
    type: mock
    circuit_breaker: {consecutive_failures: 1, cooldown: 600}
models:
  - name: ma
    routes: [{backend: a, model: x}]
  - name: mb
    routes: [{backend: b, model: x}]
"""


@pytest.fixture
async def served() -> AsyncIterator[Callable[..., Awaitable[tuple[web.Application, str]]]]:
    runners: list[web.AppRunner] = []

    async def serve(text: str, **kwargs: Any) -> tuple[web.Application, str]:
        app = create_app(parse_config(text, "<test>", env={}), **kwargs)
        runner, url = await serve_app(app)
        runners.append(runner)
        return app, url

    yield serve
    for runner in reversed(runners):
        await runner.cleanup()


async def test_ready_and_health_while_serving_and_draining(served: Any) -> None:
    app, url = await served(TWO_MOCKS)
    assert await get(url, "/ready") == (200, {"status": "ready"})
    app[STATE].draining = True
    assert await get(url, "/ready") == (503, {"status": "draining"})
    assert await get(url, "/health") == (503, {"status": "draining"})


async def test_not_ready_only_when_every_route_is_behind_an_open_breaker(served: Any) -> None:
    app, url = await served(TWO_MOCKS)
    guards = {r.backend.name: r.guard for m in app[STATE].router.models.values() for r in m.routes}
    guards["a"].breaker.failed()
    assert await get(url, "/ready") == (200, {"status": "ready"})  # model mb can still serve
    guards["b"].breaker.failed()
    assert await get(url, "/ready") == (503, {"status": "not_ready", "reason": "no_routable_backend"})
    assert await get(url, "/health") == (200, {"status": "ok"})  # alive: do not restart it
    guards["b"].breaker.probe(True)  # a passing probe closes it again
    assert await get(url, "/ready") == (200, {"status": "ready"})


async def test_ready_makes_no_upstream_call(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    before = (len(gw.upstream.requests), gw.upstream.health_checks)
    for _ in range(5):
        assert (await get(gw.url, "/ready"))[0] == 200
    assert (len(gw.upstream.requests), gw.upstream.health_checks) == before


DISCOVERED = """
server: {{host: 127.0.0.1, port: 0}}
backends:
  - name: fleet
    type: vllm
    discovery: {{dns: vllm.example, port: {port}, interval: 0.05}}
    probe: {{interval: 0.05, timeout: 0.5, failures: 2}}
    circuit_breaker: {{enabled: false}}
models:
  - name: m
    routes: [{{backend: fleet, model: {model}}}]
"""


async def test_not_ready_before_the_first_discovered_server_and_when_all_are_down(served: Any) -> None:
    port = free_port()
    standin = web.AppRunner(build_app(parse_args([MODEL, "--port", str(port)])), access_log=None)
    await standin.setup()
    await web.TCPSite(standin, "127.0.0.1", port).start()
    records: list[str] = []

    async def resolver(host: str, resolved_port: int) -> list[str]:
        return list(records)

    text = DISCOVERED.format(port=port, model=MODEL)
    config = parse_config(text, "<test>", env={})
    backend = VLLMEndpointsBackend(config.backends[0], resolver=resolver)  # type: ignore[arg-type]
    try:
        _, url = await served(text, backends={"fleet": backend})
        assert await get(url, "/ready") == (503, {"status": "not_ready", "reason": "no_routable_backend"})
        records.append("127.0.0.1")
        await wait_for(lambda: bool(backend.dispatcher.endpoints), what="server discovered")
        assert await get(url, "/ready") == (200, {"status": "ready"})
        await standin.cleanup()  # the only server dies: probes take it out
        await wait_for(lambda: not backend.dispatcher.endpoints[0].available, what="server skipped")
        assert await get(url, "/ready") == (503, {"status": "not_ready", "reason": "no_routable_backend"})
    finally:
        await standin.cleanup()
