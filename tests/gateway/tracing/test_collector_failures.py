"""A collector that dies, is slow or refuses changes no request: every answer is the same, none waits for
an export, and what could not be exported is counted in ``/metrics``."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import eventually
from tests.fakes import FakeUpstream
from tests.gateway.tracing.conftest import Make
from tests.gateway.tracing.receiver import GrpcReceiver, HttpReceiver

CONFIG = """
server: {host: 127.0.0.1, port: 0}
telemetry: {otlp_endpoint: '$ENDPOINT', protocol: $PROTOCOL, max_queue_size: 64, export_timeout: 0.5}
backends:
  - {name: up, type: openai, base_url: '$up0', timeout: $t}
models:
  - {name: m, routes: [{backend: up, model: up-m}]}
"""
HOLD = 3.0  # seconds: more than any batch of requests below takes, even on a loaded machine
STUCK = 30.0  # seconds a slow collector holds each export (released when the test ends)


async def _counters(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("gateway_trace_spans_"):
                out[s.name + "".join(f"/{v}" for v in s.labels.values())] = s.value
    return out


async def _requests(session: aiohttp.ClientSession, url: str, count: int) -> float:
    """``count`` requests one after another, each checked; the slowest one's seconds."""
    loop = asyncio.get_running_loop()
    slowest = 0.0
    for i in range(count):
        t0 = loop.time()
        async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": f"p{i}"}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["choices"][0]["text"] == " hello world"
        slowest = max(slowest, loop.time() - t0)
    return slowest


def _config(endpoint: str, protocol: str = "http/protobuf") -> str:
    return CONFIG.replace("$ENDPOINT", endpoint).replace("$PROTOCOL", protocol)


def _store(
    protocol: str, receiver: HttpReceiver, grpc_receiver: GrpcReceiver
) -> tuple[HttpReceiver | GrpcReceiver, str]:
    """The receiver a protocol exports to, and the config's endpoint for it."""
    return (receiver, _config("$otlp")) if protocol == "http/protobuf" else (grpc_receiver, _config("$grpc", protocol))


async def test_the_receivers_death_changes_no_request(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver
) -> None:
    gw = await make(_config("$otlp"))
    async with aiohttp.ClientSession() as session:
        await _requests(session, gw.url, 5)
        await eventually(lambda: len(receiver.spans) == 10)
        await receiver.stop()  # the collector dies; the gateway goes on
        slowest = await _requests(session, gw.url, 60)
        assert slowest < HOLD
        await eventually(lambda: _failed_exports(gw.url), within=20)  # a loaded machine may also fill the queue
        counters = await _counters(session, gw.url)
    assert counters["gateway_trace_spans_exported_total"] == 10


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_a_slow_collector_is_dropped_from_not_waited_for(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver, grpc_receiver: GrpcReceiver, protocol: str
) -> None:
    store, config = _store(protocol, receiver, grpc_receiver)
    store.delay = STUCK
    gw = await make(config.replace("export_timeout: 0.5", "export_timeout: 60"), grpc_url=grpc_receiver.url)
    async with aiohttp.ClientSession() as session:
        await _requests(session, gw.url, 2)
        await eventually(lambda: store.exports == 1)  # the exporter is stuck in its first export from now on
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await _requests(session, gw.url, 80)  # 160 spans for a queue of 64
        assert loop.time() - t0 < STUCK / 2  # no request waited for the collector
        counters = await _counters(session, gw.url)
    assert counters["gateway_trace_spans_dropped_total/queue_full"] > 0


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_a_refusing_collector_is_counted(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver, grpc_receiver: GrpcReceiver, protocol: str
) -> None:
    store, config = _store(protocol, receiver, grpc_receiver)
    store.status = 503
    gw = await make(config, grpc_url=grpc_receiver.url)
    async with aiohttp.ClientSession() as session:
        assert await _requests(session, gw.url, 10) < HOLD
        await eventually(lambda: _at_least(gw.url, 20), within=20)
        counters = await _counters(session, gw.url)
    assert store.exports > 0 and not store.spans
    assert counters["gateway_trace_spans_exported_total"] == 0


async def test_a_collector_that_never_existed(make: Make, upstreams: list[FakeUpstream]) -> None:
    gw = await make(_config("$dead").replace("/v1'", "'"))
    async with aiohttp.ClientSession() as session:
        assert await _requests(session, gw.url, 10) < HOLD
    await eventually(lambda: _at_least(gw.url, 20), within=20)


async def _dropped(url: str) -> float:
    async with aiohttp.ClientSession() as session:
        counters = await _counters(session, url)
    return sum(v for k, v in counters.items() if k.startswith("gateway_trace_spans_dropped_total"))


async def _failed_exports(url: str) -> bool:
    async with aiohttp.ClientSession() as session:
        counters = await _counters(session, url)
    return counters.get("gateway_trace_spans_dropped_total/export_failed", 0) > 0


async def _at_least(url: str, count: int) -> bool:
    return await _dropped(url) >= count
