"""A request's trace leaves nothing for the cycle collector: once answered, its trace objects (and the
validated request they hold) are freed by reference counting, sampled or not, streamed or not.

The gateway spaces out the collector's runs (gateway.http.heap) because requests make almost no
cyclic garbage; a request <-> attempt cycle kept every traced request's objects until the next
collection and made collections happen (bench/request_cost.py: ~8 µs per request at 1% sampled)."""

from __future__ import annotations

import gc

import aiohttp
import pytest

from gateway.tracing.spans import AttemptTrace, RequestTrace
from schemas.completions import CompletionRequest
from tests.fakes import FakeUpstream
from tests.gateway.tracing.conftest import Make

CONFIG = """
server: {host: 127.0.0.1, port: 0}
telemetry: {otlp_endpoint: '$otlp', sample_ratio: RATIO}
backends:
  - {name: first, type: openai, base_url: '$up0', timeout: $t}
models:
  - {name: m, routes: [{backend: first, model: up-first}]}
"""
REQUESTS = 20


def _alive() -> int:
    return sum(isinstance(o, RequestTrace | AttemptTrace | CompletionRequest) for o in gc.get_objects())


@pytest.mark.parametrize("ratio", [0.0, 1.0])
@pytest.mark.parametrize("stream", [False, True])
async def test_answered_requests_leave_no_trace_objects_behind(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession, ratio: float, stream: bool
) -> None:
    gw = await make(CONFIG.replace("RATIO", str(ratio)))
    payload = {"model": "m", "prompt": "hi", "max_tokens": 5, "stream": stream}
    async with session.post(f"{gw.url}/v1/completions", json=payload) as resp:  # warm-up: lazy state is built
        assert resp.status == 200, await resp.text()
        await resp.read()
    gc.collect()
    before = _alive()
    gc.disable()  # what stays alive now is kept by references or by a cycle nothing has collected
    try:
        for _ in range(REQUESTS):
            async with session.post(f"{gw.url}/v1/completions", json=payload) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
        left = _alive() - before
    finally:
        gc.enable()
    assert left < REQUESTS // 2, f"{left} trace objects and validated requests outlived their {REQUESTS} requests"
