"""Fixtures for tracing: real OTLP receivers, fake upstreams, gateways built from YAML with a ``telemetry`` section.

``make(yaml, env=...)`` substitutes ``$up0``.. (the fake upstreams), ``$dead`` (a port nobody
listens on), ``$otlp`` (the HTTP receiver's URL) and ``$grpc`` (the gRPC receiver's), and
serves the gateway with ``env`` as its environment (the standard ``OTEL_*`` variables);
exports are scheduled every 20 ms so tests do not wait for the default second.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from string import Template

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE, GatewayState
from tests.conftest import free_port, serve_app
from tests.fakes import FakeUpstream
from tests.gateway.flow.conftest import session, upstreams
from tests.gateway.tracing.receiver import GrpcReceiver, HttpReceiver

__all__ = ["FAST", "Gateway", "Make", "grpc_receiver", "make", "receiver", "session", "upstreams"]

TIMEOUT = "{connect: 1, first_byte: 5, total: 10, stream_idle: 5}"
FAST = {"OTEL_BSP_SCHEDULE_DELAY": "20"}


@dataclass
class Gateway:
    url: str
    app: web.Application

    @property
    def state(self) -> GatewayState:
        return self.app[STATE]


Make = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def receiver() -> AsyncIterator[HttpReceiver]:
    r = HttpReceiver()
    await r.start()
    try:
        yield r
    finally:
        await r.stop()


@pytest.fixture
def grpc_receiver() -> Iterator[GrpcReceiver]:
    r = GrpcReceiver()
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
async def make(upstreams: list[FakeUpstream], receiver: HttpReceiver) -> AsyncIterator[Make]:
    runners: list[web.AppRunner] = []

    async def build(yaml: str, *, env: Mapping[str, str] | None = None, grpc_url: str = "") -> Gateway:
        names = {f"up{i}": up.url for i, up in enumerate(upstreams)}
        text = Template(yaml).substitute(
            names, dead=f"http://127.0.0.1:{free_port()}/v1", t=TIMEOUT, otlp=receiver.url, grpc=grpc_url
        )
        app = create_app(parse_config(text, "<test config>", env={}), env={**FAST, **(env or {})})
        runner, url = await serve_app(app)
        runners.append(runner)
        return Gateway(url, app)

    try:
        yield build
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
