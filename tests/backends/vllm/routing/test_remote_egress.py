"""A ``vllm`` backend over ``base_urls`` behind a forward proxy, its servers demanding mutual TLS:
requests, the ``/version`` read, the ``/health`` probes and the ``/metrics`` scrapes all leave
the way the backend's egress says (proxy.py process, trustme PKI; ``tests.backends.transport.egress_parts``).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from backends.vllm.routing import VLLMEndpointsBackend
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from tests.backends.transport.egress_parts import PKI, PROXY_PASSWORD, ForwardProxy
from tests.backends.vllm.pool.conftest import MODEL, wait_for
from tests.backends.vllm.pool.standin_worker import build_app, parse_args
from tests.conftest import eventually, free_port, serve_app


@pytest.fixture
async def servers(pki: PKI) -> AsyncIterator[list[int]]:
    runners, ports = [], [free_port() for _ in range(2)]
    for port in ports:
        runner = web.AppRunner(build_app(parse_args([MODEL, "--port", str(port)])), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=pki.server_context(require_client=True)).start()
        runners.append(runner)
    yield ports
    for runner in runners:
        await runner.cleanup()


def config_text(pki: PKI, ports: list[int], proxy_url: str) -> str:
    urls = ", ".join(f"https://127.0.0.1:{p}/v1" for p in ports)
    return f"""
backends:
  - name: fleet
    type: vllm
    base_urls: [{urls}]
    proxy: {proxy_url}
    tls: {{ca_file: {pki.ca_file}, cert_file: {pki.client_cert_file}, key_file: {pki.client_key_file}}}
    routing: {{metrics_interval: 0.05, wait_for_ready: 2}}
    probe: {{interval: 0.05, timeout: 1, failures: 2}}
    timeout: {{connect: 2, first_byte: 5, total: 10, stream_idle: 5}}
models:
  - name: m
    routes: [{{backend: fleet, model: {MODEL}}}]
"""


async def test_requests_probes_and_scrapes_go_through_the_proxy(
    pki: PKI, forward_proxy: ForwardProxy, servers: list[int]
) -> None:
    app = create_app(parse_config(config_text(pki, servers, forward_proxy.url()), env={}))
    runner, url = await serve_app(app)
    try:
        backend = app[STATE].backends["fleet"]
        assert isinstance(backend, VLLMEndpointsBackend)
        assert backend.dispatcher.endpoints[0].adapter is not None
        async with aiohttp.ClientSession() as session:
            for prompt in ("alpha " * 60, "beta " * 60, "gamma " * 60):
                body = {"model": "m", "prompt": prompt, "max_tokens": 2}
                async with session.post(f"{url}/v1/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
            # a scrape through the tunnel: the server's queue as the backend sees it
            direct = ssl.create_default_context(cafile=pki.ca_file)
            direct.load_cert_chain(pki.client_cert_file, pki.client_key_file)
            control = f"https://127.0.0.1:{servers[0]}/standin/control"
            async with session.post(control, json={"waiting": 7}, ssl=direct) as resp:
                assert resp.status == 200
        await wait_for(lambda: backend.pool_status().workers[0].waiting == 7, what="the scrape through the proxy")
        assert [w.state for w in backend.pool_status().workers] == ["ready", "ready"]
    finally:
        await runner.cleanup()
    for port in servers:
        await eventually(lambda port=port: forward_proxy.saw(f"CONNECT 127.0.0.1:{port}"))


async def test_probes_fail_when_the_proxy_refuses_the_credentials(
    pki: PKI, forward_proxy: ForwardProxy, servers: list[int]
) -> None:
    app = create_app(
        parse_config(config_text(pki, servers, forward_proxy.url(password="not-" + PROXY_PASSWORD)), env={})
    )
    runner, url = await serve_app(app)
    try:
        backend = app[STATE].backends["fleet"]
        assert isinstance(backend, VLLMEndpointsBackend)
        await wait_for(
            lambda: [w.state for w in backend.pool_status().workers] == ["unhealthy", "unhealthy"],
            what="probes refused by the proxy",
        )
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "prompt": "hi", "max_tokens": 2}
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status in (502, 503), await resp.text()
                error = (await resp.json())["error"]
        assert "not-" + PROXY_PASSWORD not in str(error)
    finally:
        await runner.cleanup()
