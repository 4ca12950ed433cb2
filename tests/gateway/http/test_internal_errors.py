"""Unexpected failures inside the gateway (an adapter bug): a clean 500 envelope before the
response starts, a clean error event + [DONE] after it, and counted in the metrics either way."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.base import Backend, CompletionResult, CompletionStream, UpstreamCall
from backends.capabilities import Capabilities, Level
from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import serve_app

CONFIG = "backends: [{name: buggy, type: mock}]\nmodels: [{name: m, routes: [{backend: buggy, model: x}]}]\n"
GOOD_EVENT = (
    b'data: {"id":"c","object":"text_completion","created":1,"model":"m",'
    b'"choices":[{"index":0,"text":" a","logprobs":null,"finish_reason":null}]}\n\n'
)


class BuggyStream(CompletionStream):
    def __init__(self, good_events: int) -> None:
        self.left = good_events
        self.closed = False

    async def __anext__(self) -> bytes:
        if self.left:
            self.left -= 1
            return GOOD_EVENT
        raise KeyError("adapter bug")

    async def aclose(self) -> None:
        self.closed = True


class BuggyBackend(Backend):
    """Raises a plain exception (not a GatewayError), where the contract says it never should."""

    kind: ClassVar[str] = "mock"

    def __init__(self, good_events: int) -> None:
        super().__init__("buggy", Capabilities.of(Level.NATIVE))
        self.good_events = good_events
        self.streams: list[BuggyStream] = []

    async def complete(self, call: UpstreamCall) -> CompletionResult:
        raise KeyError("adapter bug")

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        if self.good_events < 0:
            raise KeyError("adapter bug")
        stream = BuggyStream(self.good_events)
        self.streams.append(stream)
        return stream


@pytest.fixture
async def buggy() -> AsyncIterator[tuple[str, BuggyBackend]]:
    backend = BuggyBackend(good_events=2)
    app = create_app(parse_config(CONFIG, env={}), backends={"buggy": backend})
    runner, url = await serve_app(app)
    try:
        yield url, backend
    finally:
        await runner.cleanup()


async def requests_by_status(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_requests_total":
                out[sample.labels["status"]] = out.get(sample.labels["status"], 0) + sample.value
            if sample.name == "gateway_requests_in_flight":
                assert sample.value == 0
            if sample.name == "gateway_stream_failures_total":
                assert sample.labels == {
                    "model": "m",
                    "backend": "buggy",
                    "reason": "internal",
                    "endpoint": "completions",
                }
                out["stream_failures"] = sample.value
    return out


@pytest.mark.parametrize("stream", [False, True])
async def test_unexpected_error_before_the_response_is_a_500_envelope(
    buggy: tuple[str, BuggyBackend], stream: bool
) -> None:
    url, backend = buggy
    backend.good_events = -1  # fail in stream() itself
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": "x", "stream": stream}) as resp:
            assert resp.status == 500
            assert resp.content_type == "application/json"
            body = orjson.loads(await resp.read())
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == "internal_error"
        assert "adapter bug" not in body["error"]["message"]  # details stay in the log
        assert await requests_by_status(session, url) == {"500": 1}


async def test_unexpected_error_mid_stream_ends_the_stream_cleanly(buggy: tuple[str, BuggyBackend]) -> None:
    url, backend = buggy
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": "x", "stream": True}) as resp:
            assert resp.status == 200
            raw = await resp.read()  # a framing error here would raise ClientPayloadError
        events = [e for e in raw.split(b"\n\n") if e]
        assert events[:2] == [GOOD_EVENT.rstrip(b"\n")] * 2
        assert events[-1] == b"data: [DONE]"
        tail = orjson.loads(events[-2][len(b"data: ") :])
        assert set(tail["error"]) == {"message", "type", "param", "code"}
        assert tail["error"]["code"] == "internal_error"
        assert "adapter bug" not in tail["error"]["message"]
        assert backend.streams[0].closed
        assert await requests_by_status(session, url) == {"500": 1, "stream_failures": 1}
        # The connection is still usable afterwards.
        async with session.get(f"{url}/health") as resp:
            assert resp.status == 200
