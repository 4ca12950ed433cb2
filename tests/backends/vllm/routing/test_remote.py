"""A ``vllm`` backend over several servers: ``base_urls`` and DNS ``discovery``.

The servers are stand-ins served in-process (same app as the stand-in script).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from backends.registry import build_backend
from backends.vllm.routing import VLLMEndpointsBackend
from backends.vllm.routing.prefix import request_keys
from backends.vllm.routing.remote import resolve_dns
from backends.vllm.routing.rendezvous import rendezvous_first
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from schemas.completions import CompletionRequest
from tests.backends.vllm.pool.conftest import MODEL, wait_for
from tests.backends.vllm.pool.standin_worker import build_app, parse_args
from tests.conftest import free_port, serve_app

PORT = re.compile(r" w(\d+)")
Serve = Callable[[str, int], Awaitable[web.AppRunner]]


@pytest.fixture
async def standin() -> AsyncIterator[Serve]:
    runners: list[web.AppRunner] = []

    async def start(host: str, port: int) -> web.AppRunner:
        runner = web.AppRunner(build_app(parse_args([MODEL, "--host", host, "--port", str(port)])), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
        return runner

    yield start
    for runner in runners:
        await runner.cleanup()


def config_text(source: str, routing: str = "{metrics_interval: 0.05, wait_for_ready: 2}") -> str:
    return f"""
backends:
  - name: fleet
    type: vllm
    {source}
    routing: {routing}
    probe: {{interval: 0.05, timeout: 5, failures: 2}}
    timeout: {{connect: 1, first_byte: 5, total: 10, stream_idle: 5}}
models:
  - name: m
    routes: [{{backend: fleet, model: {MODEL}}}]
"""


async def served_by(session: aiohttp.ClientSession, url: str, prompt: str) -> int:
    async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2}) as r:
        text = await r.text()
        assert r.status == 200, text
    match = PORT.search(text)
    assert match
    return int(match.group(1))


def groups_homed_on_each(backend: VLLMEndpointsBackend, per_server: int) -> list[str]:
    """Prompt groups whose first block's rendezvous choice (``score``'s prefix term on an idle
    pool) is each server in turn, ``per_server`` of them each, in server order. The choice hashes
    the server's URL, whose port is random here: fixed group names land all on one server for 1
    port pair in 8."""
    endpoints = backend.dispatcher.endpoints
    homed: dict[int, list[str]] = {ep.index: [] for ep in endpoints}
    i = 0
    while any(len(groups) < per_server for groups in homed.values()):
        group = f"group{i} " * 60
        key = request_keys(CompletionRequest(model="m", prompt=group + "q0"), backend.config.routing)[0]
        home = homed[rendezvous_first(endpoints, key).index]
        if len(home) < per_server:
            home.append(group)
        i += 1
    return [group for index in sorted(homed) for group in homed[index]]


async def test_base_urls_spread_by_prefix_and_survive_a_dead_server(standin: Serve) -> None:
    ports = [free_port() for _ in range(2)]
    runners = [await standin("127.0.0.1", p) for p in ports]
    urls = ", ".join(f"http://127.0.0.1:{p}/v1" for p in ports)
    config = parse_config(config_text(f"base_urls: [{urls}]"), env={})
    app = create_app(config)
    runner, url = await serve_app(app)
    try:
        backend = app[STATE].backends["fleet"]
        assert isinstance(backend, VLLMEndpointsBackend)
        groups = groups_homed_on_each(backend, 2)
        async with aiohttp.ClientSession() as session:
            first = [await served_by(session, url, g + "q0") for g in groups]
            assert first == [ports[0], ports[0], ports[1], ports[1]]  # new prefixes spread, each to its home
            assert [await served_by(session, url, g + "q1") for g in groups] == first  # and stick
            await runners[0].cleanup()  # one server dies
            assert {await served_by(session, url, f"x{i}") for i in range(4)} == {ports[1]}
        # The probes settle on it (a loaded box may take a few rounds): wait for that, not for a time.
        states = lambda: [w.state for w in backend.pool_status().workers]  # noqa: E731
        await wait_for(lambda: states() == ["unhealthy", "ready"], what="dead server skipped, live one ready")
    finally:
        await runner.cleanup()


async def test_dns_discovery_follows_the_records(standin: Serve) -> None:
    port = free_port()
    await standin("127.0.0.1", port)
    await standin("127.0.0.2", port)  # all of 127/8 is loopback on Linux
    records = ["127.0.0.1"]

    async def resolver(host: str, resolved_port: int) -> list[str]:
        assert (host, resolved_port) == ("vllm.default.svc.cluster.local", port)
        return list(records)

    config = parse_config(
        config_text(f"discovery: {{dns: vllm.default.svc.cluster.local, port: {port}, interval: 0.05}}"), env={}
    )
    backend_config = config.backends[0]
    backend = VLLMEndpointsBackend(backend_config, resolver=resolver)  # type: ignore[arg-type]
    await backend.start()
    try:
        urls = lambda: [ep.url for ep in backend.dispatcher.endpoints]  # noqa: E731
        assert urls() == [f"http://127.0.0.1:{port}/v1"]
        records.append("127.0.0.2")
        await wait_for(lambda: len(urls()) == 2, what="second record picked up")
        assert urls()[1] == f"http://127.0.0.2:{port}/v1"
        records.remove("127.0.0.1")
        await wait_for(lambda: len(urls()) == 1, what="first record dropped")
        assert urls() == [f"http://127.0.0.2:{port}/v1"]
        assert backend.dispatcher.endpoints[0].index == 1  # indices stay with their server
        records.append("127.0.0.1")
        await wait_for(lambda: len(urls()) == 2, what="first record back")
        assert [ep.index for ep in backend.dispatcher.endpoints] == [0, 1]  # freed index reused
    finally:
        await backend.close()


async def test_real_dns_resolution_of_localhost() -> None:
    assert "127.0.0.1" in await resolve_dns("localhost", 80)


def test_registry_builds_the_multi_server_backend() -> None:
    config = parse_config(config_text("base_urls: [http://10.0.0.1:8000/v1, http://10.0.0.2:8000/v1]"), env={})
    backend = build_backend(config.backends[0])
    assert isinstance(backend, VLLMEndpointsBackend) and backend.kind == "vllm"
