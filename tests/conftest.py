"""Shared fixtures: a fake OpenAI/vLLM upstream and a real gateway on loopback.

``gateway`` serves three models through the app built by ``create_app`` from a
YAML config text (the same path ``gateway serve`` takes):

- ``gpt-test``   -> backend ``up-openai`` (type openai) -> upstream model ``upstream-gpt``
- ``llama-test`` -> backend ``up-vllm``   (type vllm)   -> upstream model ``upstream-llama``
- ``mock-test``  -> backend ``sim``       (type mock)   -> ``mock-model``

The two HTTP backends both point at the same :class:`tests.fakes.FakeUpstream`.
``make_gateway`` builds variants (extra backends/models, server settings).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.http.protocol import FrontDoorRunner
from tests.fakes import FakeUpstream

# The egress tests' real parts (a private PKI, proxy.py processes), shared by every test folder.
pytest_plugins = ("tests.backends.transport.egress_parts",)

OPENAI_MODEL = "gpt-test"
VLLM_MODEL = "llama-test"
MOCK_MODEL = "mock-test"
UPSTREAM_IDS = {OPENAI_MODEL: "upstream-gpt", VLLM_MODEL: "upstream-llama", MOCK_MODEL: "mock-model"}
BACKEND_OF = {OPENAI_MODEL: "up-openai", VLLM_MODEL: "up-vllm", MOCK_MODEL: "sim"}


def free_port() -> int:
    """A loopback port that was free a moment ago (for subprocesses that must be told a port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ephemeral_ports() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = f.read().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32_768, 60_999


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_range(size: int = 40) -> tuple[int, int]:
    """``size`` consecutive ports that all bind now, picked at random outside the kernel's
    ephemeral range (where every test's clients and port-0 servers live). Never a fixed
    range: other pytest processes on the machine run the same tests at the same time."""
    eph_lo, eph_hi = _ephemeral_ports()
    spans = [(lo, hi - size) for lo, hi in ((10_000, eph_lo - 1), (eph_hi + 1, 65_535)) if hi - lo >= size]
    for _ in range(200):
        lo_span, hi_span = random.choice(spans)
        lo = random.randint(lo_span, hi_span)
        if all(_bindable(port) for port in range(lo, lo + size)):
            return lo, lo + size - 1
    raise RuntimeError(f"no {size} consecutive free ports found")


async def eventually(check: Callable[[], bool | Awaitable[bool]], within: float = 10.0) -> None:
    """Wait until ``check()`` (plain or async) is true; fail after ``within`` seconds.

    ``within`` only bounds a failing test: it is generous so a loaded machine never makes a
    passing test fail. What a test asserts about time goes through a fake clock instead.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(0.01)


def gateway_config_text(
    upstream_url: str,
    *,
    server: str = "",
    extra_backends: str = "",
    extra_models: str = "",
) -> str:
    """A gateway YAML with an openai and a vllm backend on ``upstream_url`` plus a mock backend.

    ``server`` is inserted under ``server:``; ``extra_backends`` / ``extra_models`` are
    appended (already indented as list items, two spaces).
    """
    timeout = "{connect: 2, first_byte: 10, total: 20, stream_idle: 10}"
    server_block = "server:\n  host: 127.0.0.1\n  port: 0\n" + "".join(
        f"  {line.strip()}\n" for line in server.splitlines() if line.strip()
    )
    return (
        server_block
        + f"""backends:
  - name: up-openai
    type: openai
    base_url: {upstream_url}
    api_key: sk-test-secret
    timeout: {timeout}
  - name: up-vllm
    type: vllm
    base_url: {upstream_url}
    timeout: {timeout}
  - name: sim
    type: mock
{extra_backends}models:
  - name: {OPENAI_MODEL}
    routes: [{{backend: up-openai, model: {UPSTREAM_IDS[OPENAI_MODEL]}}}]
  - name: {VLLM_MODEL}
    routes: [{{backend: up-vllm, model: {UPSTREAM_IDS[VLLM_MODEL]}}}]
  - name: {MOCK_MODEL}
    routes: [{{backend: sim, model: {UPSTREAM_IDS[MOCK_MODEL]}}}]
{extra_models}"""
    )


@dataclass
class RunningGateway:
    url: str  # http://127.0.0.1:PORT (no /v1)
    app: web.Application
    upstream: FakeUpstream


@pytest.fixture
async def fake_upstream() -> AsyncIterator[FakeUpstream]:
    up = FakeUpstream()
    await up.start()
    try:
        yield up
    finally:
        await up.stop()


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on a free loopback port like ``gateway serve`` does; the caller cleans up the runner."""
    runner = FrontDoorRunner(app, handler_cancellation=True, access_log=None)  # gateway serve's runner
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


MakeGateway = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def make_gateway(fake_upstream: FakeUpstream) -> AsyncIterator[MakeGateway]:
    """``await make_gateway(server=..., extra_backends=..., extra_models=...)`` -> a running gateway."""
    runners: list[web.AppRunner] = []

    async def make(**options: Any) -> RunningGateway:
        text = gateway_config_text(fake_upstream.url, **options)
        config = parse_config(text, "<test config>", env={})
        app = create_app(config)
        runner, url = await serve_app(app)
        runners.append(runner)
        return RunningGateway(url, app, fake_upstream)

    try:
        yield make
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


@pytest.fixture
async def gateway(make_gateway: MakeGateway) -> RunningGateway:
    return await make_gateway()
