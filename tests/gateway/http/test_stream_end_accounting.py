"""A stream read to its end is a success, whatever the client does with the connection next.

The race: the gateway writes ``[DONE]`` and then still has work to do for the request (it
reads the upstream's body to its end so the connection can be reused); a client that
closes its socket the moment it has read ``[DONE]`` (a raw socket, the openai SDK with a
new client per call) cancels the handler meanwhile. That cancel used to turn a finished
stream into a 499: counted as a client disconnect, its tokens dropped, its key's budget
settled without them. The scripted upstream here lingers after its ``[DONE]`` (as a
real server may before its final chunk), so every stream hits the window: the test fails
on that code every run. Every backend type that streams over HTTP (openai, vllm, tgi,
llamacpp) and the mock are driven.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import serve_app

UP = "up-model"
CHAT_KINDS = ("openai", "vllm", "tgi", "llamacpp", "mock")
COMPLETION_KINDS = ("openai", "vllm", "mock")
PROMPT, COMPLETION = 5, 3  # what the upstream's usage says
KEY = "sk-stream-end-0123456789abcdef"
AUTH = f"Authorization: Bearer {KEY}\r\n".encode()


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _stream(chat: bool) -> bytes:
    head = {"id": "c", "object": "chat.completion.chunk" if chat else "text_completion", "created": 1, "model": UP}
    out = []
    for i, text in enumerate(("a", "b", "c")):
        finish = "length" if i == 2 else None
        choice = {"index": 0, "logprobs": None, "finish_reason": finish}
        choice.update({"delta": {"content": text}} if chat else {"text": text})
        out.append(_sse({**head, "choices": [choice]}))
    usage = {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION, "total_tokens": PROMPT + COMPLETION}
    out.append(_sse({**head, "choices": [], "usage": usage}))
    return b"".join(out) + b"data: [DONE]\n\n"


@dataclass
class Upstream:
    linger: tuple[float, float]  # seconds it keeps the body open after [DONE] (random in this range)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_stream("messages" in body))
        await asyncio.sleep(random.uniform(*self.linger))
        await response.write_eof()
        return response

    async def get(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"} if request.path == "/version" else {"status": "ok"})


async def _gateway(linger: tuple[float, float]) -> AsyncIterator[str]:
    """A gateway with one model per backend type on one lingering upstream; the key ``KEY`` has a
    token budget (tokens per minute), settled at each request's end."""
    upstream = Upstream(linger)
    app = web.Application()
    for path in ("/v1/chat/completions", "/v1/completions"):
        app.router.add_post(path, upstream.answer)
    app.router.add_get("/{tail:.*}", upstream.get)
    up_runner, up = await serve_app(app)
    backends = [
        f"  - {{name: b-openai, type: openai, base_url: {up}/v1, api_key: sk-x}}",
        f"  - {{name: b-vllm, type: vllm, base_url: {up}/v1}}",
        f"  - {{name: b-tgi, type: tgi, base_url: {up}}}",
        f"  - {{name: b-llamacpp, type: llamacpp, base_url: {up}}}",
        "  - {name: b-mock, type: mock}",
    ]
    models = [f"  - {{name: m-{k}, routes: [{{backend: b-{k}, model: {UP}}}]}}" for k in CHAT_KINDS]
    auth = f"auth:\n  keys:\n    - {{name: k, key: {KEY}, tpm: 100000000}}\n"
    text = "server: {host: 127.0.0.1, port: 0}\nbackends:\n" + "\n".join([*backends, "models:", *models]) + "\n" + auth
    runner, url = await serve_app(create_app(parse_config(text, "<stream end>", env={})))
    try:
        yield url
    finally:
        await runner.cleanup()
        await up_runner.cleanup()


def _request(port: int, kind: str, chat: bool) -> bytes:
    if chat:
        body = {"model": f"m-{kind}", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        path = "/v1/chat/completions"
    else:
        body = {"model": f"m-{kind}", "prompt": "hi", "stream": True}
        path = "/v1/completions"
    raw = orjson.dumps(body)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    return head.encode() + AUTH + b"Content-Length: %d\r\n\r\n" % len(raw) + raw


async def _read_to_done_and_close(port: int, kind: str, chat: bool) -> None:
    """A raw client: send, read until ``[DONE]``, close at once (no wait for the chunked end)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request(port, kind, chat))
    seen = b""
    while b"data: [DONE]\n\n" not in seen:
        data = await reader.read(65536)
        assert data, seen
        seen += data
    assert b" 200 OK" in seen.split(b"\r\n", 1)[0]
    writer.transport.abort()  # gone the moment [DONE] is read


async def _sdk(url: str, kind: str) -> None:
    """The openai SDK with a new client per call, the stream read to its end, the client closed at once."""
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) as client:
        stream = await client.chat.completions.create(
            model=f"m-{kind}", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert [c async for c in stream]


async def _totals(url: str) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(headers=headers) as session, session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_requests_total":
                key = f"status_{sample.labels['status']}"
            elif sample.name in ("gateway_client_disconnects_total", "gateway_prompt_tokens_total"):
                key = sample.name
            elif sample.name == "gateway_key_tokens_total":
                key = f"key_{sample.labels['kind']}"
            elif sample.name == "gateway_key_requests_total":
                key = f"key_status_{sample.labels['status']}"
            else:
                continue
            out[key] = out.get(key, 0.0) + sample.value
    return out


async def _settled(url: str, count: int) -> dict[str, float]:
    """The metrics once ``count`` requests are closed (plus the scrapes themselves)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        totals = await _totals(url)
        closed = sum(v for k, v in totals.items() if k.startswith("status_"))
        if closed >= count or loop.time() > deadline:
            return totals
        await asyncio.sleep(0.05)


async def _drive(url: str, jobs: list[Any], concurrency: int) -> None:
    port = int(url.rsplit(":", 1)[1])
    queue = list(jobs)
    random.Random(7).shuffle(queue)

    async def worker() -> None:
        while queue:
            kind, chat, sdk = queue.pop()
            await (_sdk(url, kind) if sdk else _read_to_done_and_close(port, kind, chat))

    await asyncio.gather(*(worker() for _ in range(concurrency)))


@pytest.fixture
async def lingering() -> AsyncIterator[str]:
    async for url in _gateway((0.3, 0.3)):
        yield url


@pytest.fixture
async def quick() -> AsyncIterator[str]:
    async for url in _gateway((0.0, 0.01)):
        yield url


def _jobs(per_kind: int, *, sdk_every: int = 0) -> list[tuple[str, bool, bool]]:
    jobs = [(k, True, bool(sdk_every) and i % sdk_every == 0) for k in CHAT_KINDS for i in range(per_kind)]
    jobs += [(k, False, False) for k in COMPLETION_KINDS for _ in range(per_kind)]
    return jobs


async def test_a_client_that_closes_right_after_done_is_no_disconnect(lingering: str) -> None:
    """Every stream hits the window (the upstream is still open when [DONE] is read): none is a 499."""
    jobs = _jobs(4)
    await _drive(lingering, jobs, concurrency=len(jobs))
    totals = await _settled(lingering, len(jobs))
    assert totals.get("status_499", 0) == 0, totals
    assert totals.get("gateway_client_disconnects_total", 0) == 0, totals
    assert totals.get("status_200") == len(jobs), totals
    assert totals.get("key_status_200") == len(jobs), totals  # the key's own count
    # The mock reports its own counts; every HTTP stream's usage is the upstream's, on the key too.
    http_streams = sum(1 for kind, _, _ in jobs if kind != "mock")
    assert totals["gateway_prompt_tokens_total"] >= http_streams * PROMPT
    assert totals["key_completion"] >= http_streams * COMPLETION, totals


async def test_a_thousand_streams_read_to_the_end_are_all_successes(quick: str) -> None:
    jobs = _jobs(125, sdk_every=10)  # 1,000 streams, every backend type, raw sockets and the SDK
    assert len(jobs) == 1000
    await _drive(quick, jobs, concurrency=32)
    totals = await _settled(quick, len(jobs))
    assert totals.get("gateway_client_disconnects_total", 0) == 0, totals
    assert totals.get("status_200") == len(jobs), totals
