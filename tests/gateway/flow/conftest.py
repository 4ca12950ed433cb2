"""Fixtures for routing and resilience: several fake upstreams, a fake clock, gateways built from YAML.

``make`` builds and serves a gateway from a YAML text in which ``$up0``, ``$up1`` ...
stand for the fake upstreams' base URLs, ``$dead`` for the URL of a loopback port
nobody listens on and ``$t`` for short upstream timeouts. The gateway's :class:`FakeClock`
records every backoff it asked for and never sleeps for real; ``clock.advance(s)`` moves
time on (circuit cooldowns).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from string import Template
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.clock import Clock
from gateway.configfile import parse_config
from gateway.state import STATE, GatewayState
from tests.conftest import eventually, free_port, serve_app
from tests.fakes import FakeUpstream
from tests.gateway.endpoint_labels import with_endpoint

__all__ = ["FakeClock", "Gateway", "Make", "body", "error_of", "eventually", "metric", "post", "sse_events"]

TIMEOUT = "{connect: 1, first_byte: 5, total: 10, stream_idle: 5}"


class FakeClock(Clock):
    """Time that moves only when someone sleeps on it or a test advances it."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Gateway:
    url: str
    app: web.Application
    clock: FakeClock

    @property
    def state(self) -> GatewayState:
        return self.app[STATE]


Make = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def upstreams() -> AsyncIterator[list[FakeUpstream]]:
    ups = [FakeUpstream() for _ in range(3)]
    for up in ups:
        await up.start()
    try:
        yield ups
    finally:
        for up in ups:
            await up.stop()


@pytest.fixture
async def make(upstreams: list[FakeUpstream]) -> AsyncIterator[Make]:
    runners: list[web.AppRunner] = []

    async def build(yaml: str, *, clock: FakeClock | None = None) -> Gateway:
        names = {f"up{i}": up.url for i, up in enumerate(upstreams)}
        text = Template(yaml).substitute(names, dead=f"http://127.0.0.1:{free_port()}/v1", t=TIMEOUT)
        clock = clock if clock is not None else FakeClock()
        app = create_app(parse_config(text, "<test config>", env={}), clock=clock)
        runner, url = await serve_app(app)
        runners.append(runner)
        return Gateway(url, app, clock)

    try:
        yield build
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def body(model: str = "m", **fields: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "hi", "max_tokens": 3, **fields}


async def post(
    session: aiohttp.ClientSession, gw: Gateway, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, CIMultiDict[str], bytes]:
    """Status, headers (case-insensitive) and body of one completion request."""
    async with session.post(f"{gw.url}/v1/completions", json=payload, headers=headers or {}) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


def error_of(raw: bytes) -> dict[str, Any]:
    error: dict[str, Any] = orjson.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def sse_events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"\n\n"), raw[-200:]
    return [block for block in raw.split(b"\n\n") if block]


async def metric(session: aiohttp.ClientSession, gw: Gateway, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (0 when absent)."""
    labels = with_endpoint(name, labels)
    async with session.get(f"{gw.url}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0
