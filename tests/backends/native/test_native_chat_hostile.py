"""Hostile native upstreams on ``POST /v1/chat/completions``: TGI (Messages API SSE), Ollama
(``/api/chat`` NDJSON) and llama.cpp (``/v1/chat/completions`` SSE), through the gateway.

One fake native server (aiohttp, a real socket, so the real transport's caps and encodings
apply) answers whatever the test scripts; the gateway in front of it has small caps
(``limits``: 1 MiB bodies, 64 KiB events) and no breaker, except where the breaker is the
subject. Expected of every attack: a 5xx envelope or an error event naming the upstream's
problem, never a 500 traceback, never an invented ``finish_reason``, bounded reads.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from backends.tool_call_order import _Choice
from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.native.helpers import KINDS, UPSTREAM_MODEL
from tests.conftest import serve_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

SSE_KINDS = ("tgi", "llamacpp")
MAX_EVENT = 64 * 1024
MAX_BODY = 1024 * 1024
USER = {"role": "user", "content": "The capital of France?"}
SECRET = "sk-native-hostile-0123456789abcdef"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


class NativeServer:
    """One socket for the three servers; ``answer`` is what the next POST gets (a golden one by default)."""

    def __init__(self) -> None:
        self.answer: Answer | None = None
        self.sent_bytes = 0  # what the last scripted answer managed to write
        self.posts = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._post)
        self._runner, self.url = await serve_app(app)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _post(self, request: web.Request) -> web.StreamResponse:
        self.posts += 1
        await request.read()
        assert self.answer is not None, "every test scripts its answer"
        return await self.answer(request)


def sse(*objs: Any) -> bytes:
    return b"".join(b"data: " + (o if isinstance(o, bytes) else orjson.dumps(o)) + b"\n\n" for o in objs)


def ndjson(*objs: Any) -> bytes:
    return b"".join((o if isinstance(o, bytes) else orjson.dumps(o)) + b"\n" for o in objs)


def chunk(content: Any = "Paris", *, finish: str | None = None, usage: Any = None, calls: Any = None) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant", "content": content}
    if calls is not None:
        delta["tool_calls"] = calls
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "object": "chat.completion.chunk",
        "id": "",
        "created": 1,
        "model": "m",
        "choices": [choice],
        "usage": usage,
    }


def line(content: Any = "Paris", *, done: bool = False, calls: Any = None, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls is not None:
        message["tool_calls"] = calls
    return {"model": "llama3.2", "created_at": "2025-06-01T10:00:00Z", "message": message, "done": done, **extra}


def final(kind: str, **extra: Any) -> bytes:
    """The stream's correct end, with ``extra`` on the finishing frame."""
    if kind == "ollama":
        return ndjson(line("", done=True, **{"done_reason": "stop", "prompt_eval_count": 3, "eval_count": 1, **extra}))
    usage = extra.pop("usage", {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4})
    return sse({**chunk("", finish="stop", usage=usage), **extra}) + b"data: [DONE]\n\n"


def body_of(kind: str, frames: bytes) -> Answer:
    """A 200 stream answer whose body is ``frames``, as one write."""
    content_type = "application/x-ndjson" if kind == "ollama" else "text/event-stream"

    async def answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        await resp.write(frames)
        await resp.write_eof()
        return resp

    return answer


def json_of(body: bytes, headers: dict[str, str] | None = None) -> Answer:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, headers={"Content-Type": "application/json", **(headers or {})})

    return answer


def endless(server: NativeServer, head: bytes, filler: bytes, content_type: str) -> Answer:
    """``head`` then ``filler`` for ever (up to 64 MiB): an event, a line or a body that never ends."""

    async def answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        server.sent_bytes = 0
        try:
            await resp.write(head)
            while server.sent_bytes < 64 * 1024 * 1024:
                await resp.write(filler)
                server.sent_bytes += len(filler)
        except (ConnectionError, asyncio.CancelledError):
            pass
        return resp

    return answer


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[NativeServer]:
    native = NativeServer()
    await native.start()
    try:
        yield native
    finally:
        await native.stop()


def _config(url: str, breaker: str) -> str:
    timeout = "{connect: 2, first_byte: 10, total: 20, stream_idle: 10}"
    limits = f"{{max_response_bytes: {MAX_BODY}, max_event_bytes: {MAX_EVENT}}}"
    backends = "".join(
        f"  - name: {kind}-a\n    type: {kind}\n    base_url: {url}\n    timeout: {timeout}\n    api_key: {SECRET}\n"
        f"    limits: {limits}\n    circuit_breaker: {breaker}\n"
        for kind in KINDS
    )
    models = "".join(
        f"  - name: {kind}-model\n    routes: [{{backend: {kind}-a, model: {UPSTREAM_MODEL[kind]}}}]\n"
        for kind in KINDS
    )
    return f"server: {{host: 127.0.0.1, port: 0}}\nbackends:\n{backends}models:\n{models}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(server: NativeServer) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(parse_config(_config(server.url, "{enabled: false}"), "<test config>", env={}))
    runner, url = await serve_app(app)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield client
    finally:
        await runner.cleanup()


async def chat(client: httpx.AsyncClient, kind: str, **fields: Any) -> httpx.Response:
    return await client.post("/v1/chat/completions", json={"model": f"{kind}-model", "messages": [USER], **fields})


def events_of(resp: httpx.Response) -> list[dict[str, Any]]:
    """A stream answer's events (``[DONE]`` as ``{"done": True}``)."""
    events = []
    for block in resp.content.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[len(b"data: ") :]
            events.append({"done": True} if data == b"[DONE]" else orjson.loads(data))
    return events


async def stream(client: httpx.AsyncClient, kind: str, **fields: Any) -> list[dict[str, Any]]:
    """The stream's events; asserts a 200 SSE answer."""
    resp = await chat(client, kind, stream=True, **fields)
    assert resp.status_code == 200, resp.text
    return events_of(resp)


async def stream_error(client: httpx.AsyncClient, kind: str, **fields: Any) -> dict[str, Any]:
    """A failed stream's error: a 5xx envelope before the first event, or the error event that ends
    the stream (only ``[DONE]`` after it, no finish reason before it)."""
    resp = await chat(client, kind, stream=True, **fields)
    if resp.status_code != 200:
        return upstream_failure(resp)
    events = events_of(resp)
    if events and events[-1] == {"done": True}:  # the gateway's error event is followed by [DONE]
        events.pop()
    assert events and "error" in events[-1], events[-3:]
    finishes = [c["finish_reason"] for e in events if "choices" in e for c in e["choices"] if c["finish_reason"]]
    assert finishes == [], f"an invented finish_reason before the error: {finishes}"
    error: dict[str, Any] = events[-1]["error"]
    assert error["type"] and error["message"]
    return error


def upstream_failure(resp: httpx.Response) -> dict[str, Any]:
    """A non-stream failure: 5xx with the OpenAI envelope (never a bare 500 traceback)."""
    assert resp.status_code in (502, 503, 504), (resp.status_code, resp.text[:300])
    error: dict[str, Any] = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and "Traceback" not in error["message"]
    return error


# --- the harness answers correctly when the upstream does ------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_correct_stream_passes(kind: str, server: NativeServer, gateway: httpx.AsyncClient) -> None:
    frames = ndjson(line("Paris")) if kind == "ollama" else sse(chunk("Paris"))
    server.answer = body_of(kind, frames + final(kind))
    events = await stream(gateway, kind)
    assert events[-1] == {"done": True}
    assert "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"]) == "Paris"


# --- size: an endless event or line, a gzip bomb, a huge non-stream body -----------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_an_endless_event_is_cut_at_max_event_bytes(
    kind: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    if kind == "ollama":
        head, content_type = ndjson(line("Paris")) + b'{"message":{"content":"', "application/x-ndjson"
    else:
        head, content_type = sse(chunk("Paris")) + b'data: {"choices":[{"delta":{"content":"', "text/event-stream"
    server.answer = endless(server, head, b"y" * 8192, content_type)
    error = await stream_error(gateway, kind)
    assert "max_event_bytes" in error["message"]
    assert server.sent_bytes < 64 * 1024 * 1024  # the gateway hung up; it did not read to the end


@functools.cache
def _bomb() -> bytes:
    """~200 KB that inflate to 200 MB of spaces: compressed once (about half a second), shared by every case."""
    return gzip.compress(b" " * (200 * 1024 * 1024), compresslevel=9)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("streaming", [False, True])
async def test_a_gzip_bomb_is_not_inflated(
    kind: str, streaming: bool, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    server.answer = json_of(_bomb(), {"Content-Encoding": "gzip"})
    if streaming:
        await stream_error(gateway, kind)
    else:
        upstream_failure(await chat(gateway, kind))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_huge_non_stream_body_is_cut_at_max_response_bytes(
    kind: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    server.answer = endless(server, b'{"message":{"content":"', b"y" * 65536, "application/json")
    error = upstream_failure(await chat(gateway, kind))
    assert "max_response_bytes" in error["message"]
    assert server.sent_bytes < 64 * 1024 * 1024


# --- a stream that ends without its final frame ------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stream_without_its_final_frame_is_an_error(
    kind: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    frames = ndjson(line("Paris"), line(".")) if kind == "ollama" else sse(chunk("Paris"), chunk("."))
    server.answer = body_of(kind, frames)
    error = await stream_error(gateway, kind)
    assert "closed the stream" in error["message"] or "without" in error["message"]


@pytest.mark.parametrize("kind", SSE_KINDS)
async def test_a_finish_without_done_is_an_error_not_a_success(
    kind: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    """The finishing chunk came, usage and [DONE] did not: the answer is whole, usage is estimated,
    or the cut is reported; either way no client sees a 500."""
    server.answer = body_of(kind, sse(chunk("Paris"), chunk("", finish="stop")))
    events = await stream(gateway, kind)
    assert events[-1] == {"done": True} or "error" in events[-1]


@pytest.mark.parametrize("reason", ["load", "unload", ""])
async def test_ollama_done_reason_load_mid_stream_is_an_error(
    reason: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    server.answer = body_of("ollama", ndjson(line("Paris"), line("", done=True, done_reason=reason)))
    error = await stream_error(gateway, "ollama")
    assert "Ollama" in error["message"]


@pytest.mark.parametrize("kind", KINDS)
async def test_an_error_object_mid_stream_is_an_error_event(
    kind: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    oops = {"error": "CUDA out of memory", "error_type": "generation"}
    frames = ndjson(line("Paris"), oops) if kind == "ollama" else sse(chunk("Paris"), oops)
    server.answer = body_of(kind, frames + final(kind))
    error = await stream_error(gateway, kind)
    assert "CUDA out of memory" in error["message"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("garbage", [b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe", b'{"a": 1e999999}'])
async def test_malformed_json_mid_stream_is_an_error_event(
    kind: str, garbage: bytes, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    frames = ndjson(line("Paris"), garbage) if kind == "ollama" else sse(chunk("Paris"), garbage)
    server.answer = body_of(kind, frames + final(kind))
    error = await stream_error(gateway, kind)
    assert "JSON" in error["message"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("garbage", [b"{not json", b"[]", b"", b"null"])
async def test_malformed_json_non_stream_is_a_502(
    kind: str, garbage: bytes, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    server.answer = json_of(garbage)
    upstream_failure(await chat(gateway, kind))


# --- counters: past 2^64, negative, not integers ---------------------------------------------------------

BAD_COUNTS: list[Any] = [-5, 18446744073709551616, 10**30, 1.5, "7", True]


def usage_ok(usage: dict[str, Any]) -> None:
    """Counts the gateway reports (and bills by): non-negative integers that add up, and plausible."""
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(usage[name], int) and not isinstance(usage[name], bool), usage
        assert 0 <= usage[name] < 2**32, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] >= 1  # "Paris" was generated


def _count_text(value: Any) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else orjson.dumps(value).decode()


def non_stream_body(kind: str, prompt: Any, completion: Any) -> bytes:
    p, c = _count_text(prompt), _count_text(completion)
    if kind == "ollama":
        return (
            b'{"model":"llama3.2","message":{"role":"assistant","content":"Paris"},"done":true,"done_reason":"stop",'
            + f'"prompt_eval_count":{p},"eval_count":{c}}}'.encode()
        )
    return (
        b'{"id":"","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":'
        b'{"role":"assistant","content":"Paris"},"finish_reason":"stop"}],'
        + f'"usage":{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":1}}}}'.encode()
    )


def stream_body(kind: str, prompt: Any, completion: Any) -> bytes:
    p, c = _count_text(prompt), _count_text(completion)
    if kind == "ollama":
        return ndjson(line("Paris")) + (
            b'{"model":"llama3.2","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",'
            + f'"prompt_eval_count":{p},"eval_count":{c}}}\n'.encode()
        )
    return (
        sse(chunk("Paris"), chunk("", finish="stop"))
        + b'data: {"id":"","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
        + f'"usage":{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":1}}}}\n\n'.encode()
        + b"data: [DONE]\n\n"
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", BAD_COUNTS, ids=repr)
@pytest.mark.parametrize("which", ["prompt", "completion"])
async def test_bad_counters_never_reach_usage(
    kind: str, bad: Any, which: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    counts = (bad, 1) if which == "prompt" else (3, bad)
    server.answer = json_of(non_stream_body(kind, *counts))
    resp = await chat(gateway, kind)
    assert resp.status_code == 200, resp.text
    usage_ok(resp.json()["usage"])
    server.answer = body_of(kind, stream_body(kind, *counts))
    events = await stream(gateway, kind, stream_options={"include_usage": True})
    assert events[-1] == {"done": True}
    usage_ok(events[-2]["usage"])


@pytest.mark.parametrize("kind", KINDS)
async def test_a_non_stream_answer_without_usage_counts_its_completion(
    kind: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    """No counts from the upstream: estimated from the text (as a stream does), never 0 tokens for free."""
    server.answer = json_of(non_stream_body(kind, "x", "x").replace(b'"x"', b"null"))
    resp = await chat(gateway, kind)
    assert resp.status_code == 200, resp.text
    usage_ok(resp.json()["usage"])


# --- content of the wrong type --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("content", [123, ["Paris"], {"text": "Paris"}, True])
async def test_content_of_the_wrong_type_is_an_error_not_dropped(
    kind: str, content: Any, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    frames = ndjson(line(content)) if kind == "ollama" else sse(chunk(content))
    server.answer = body_of(kind, frames + final(kind))
    error = await stream_error(gateway, kind)
    assert "content" in error["message"]
    body = orjson.loads(non_stream_body(kind, 3, 1))
    if kind == "ollama":
        body["message"]["content"] = content
    else:
        body["choices"][0]["message"]["content"] = content
    server.answer = json_of(orjson.dumps(body))
    assert "content" in upstream_failure(await chat(gateway, kind))["message"]


# --- tool calls -----------------------------------------------------------------------------------------


def call_frames(kind: str, calls: list[dict[str, Any]]) -> bytes:
    """One frame with ``calls`` (OpenAI-shaped for the SSE servers), then the right end."""
    if kind == "ollama":
        return ndjson(line("", calls=calls)) + final(kind)
    return sse(chunk(None, calls=calls)) + final(kind)


def ollama_call(name: Any, arguments: Any) -> dict[str, Any]:
    return {"function": {"name": name, "arguments": arguments}}


def openai_call(index: int, name: Any, arguments: Any = "{}") -> dict[str, Any]:
    return {"index": index, "id": f"c{index}", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize("arguments", ["Paris", [1, 2], [], 7, "[1]"], ids=repr)
async def test_ollama_arguments_that_are_not_an_object_are_an_error(
    arguments: Any, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    server.answer = body_of("ollama", call_frames("ollama", [ollama_call("get_weather", arguments)]))
    error = await stream_error(gateway, "ollama", tools=TOOLS)
    assert "arguments" in error["message"]


async def test_ollama_arguments_as_object_text_pass(server: NativeServer, gateway: httpx.AsyncClient) -> None:
    server.answer = body_of("ollama", call_frames("ollama", [ollama_call("get_weather", '{"city": "Paris"}')]))
    events = await stream(gateway, "ollama", tools=TOOLS)
    calls = [c for e in events[:-1] for ch in e["choices"] for c in ch["delta"].get("tool_calls") or ()]
    assert orjson.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("depth", [300, 1000, 10_000])
async def test_deeply_nested_arguments_never_give_a_500(
    kind: str, depth: int, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    """Objects deeper than the JSON writer goes (orjson: 255 levels) or the reader (1024)."""
    call = b'{"index":0,"id":"c","type":"function","function":{"name":"get_weather","arguments":' + nested(depth)
    if kind == "ollama":
        frame = b'{"message":{"role":"assistant","content":"","tool_calls":[' + call + b'}]},"done":false}\n'
    else:
        frame = b'data: {"choices":[{"index":0,"delta":{"tool_calls":[' + call + b'}]},"finish_reason":null}]}\n\n'
    server.answer = body_of(kind, frame + final(kind))
    resp = await chat(gateway, kind, stream=True, tools=TOOLS)
    assert resp.status_code in (200, 502), resp.text[:300]
    events = events_of(resp) if resp.status_code == 200 else []
    if resp.status_code == 502 or any("error" in e for e in events):
        await stream_error(gateway, kind, tools=TOOLS)  # a clean error: no finish reason invented
    else:
        calls = [c for e in events[:-1] for ch in e["choices"] for c in ch["delta"].get("tool_calls") or ()]
        assert orjson.loads("".join(c["function"]["arguments"] for c in calls)) == orjson.loads(nested(depth))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["", "\x00", "get\x00weather", None, 7])
async def test_tool_calls_without_a_usable_name_are_an_error(
    kind: str, name: Any, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    calls = [ollama_call(name, {})] if kind == "ollama" else [openai_call(0, name)]
    server.answer = body_of(kind, call_frames(kind, calls))
    error = await stream_error(gateway, kind, tools=TOOLS)
    assert "name" in error["message"]


@pytest.mark.parametrize("kind", ["ollama", "llamacpp"])
async def test_ten_thousand_tool_calls_are_bounded(kind: str, server: NativeServer, gateway: httpx.AsyncClient) -> None:
    """10,000 calls in one non-stream answer (under max_response_bytes): answered whole or refused, fast."""
    if kind == "ollama":
        calls: list[Any] = [ollama_call("get_weather", {}) for _ in range(10_000)]
        body = orjson.dumps(line("", done=True, calls=calls, done_reason="stop", prompt_eval_count=3, eval_count=1))
    else:
        calls = [openai_call(i, "get_weather") for i in range(10_000)]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        body = orjson.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
    server.answer = json_of(body)
    resp = await chat(gateway, kind, tools=TOOLS)
    if resp.status_code == 200:
        assert len(resp.json()["choices"][0]["message"]["tool_calls"]) == 10_000
    else:
        upstream_failure(resp)
    # streamed, one call an event (far under max_event_bytes each): all 10,000 reach the client
    server.answer = body_of(kind, many_calls(kind, 10_000) + final(kind))
    events = await stream(gateway, kind, tools=TOOLS)
    assert events[-1] == {"done": True}
    assert len(
        {c["index"] for e in events[:-1] for ch in e["choices"] for c in ch["delta"].get("tool_calls") or ()}
    ) == (10_000)


def many_calls(kind: str, n: int) -> bytes:
    if kind == "ollama":
        return b"".join(ndjson(line("", calls=[ollama_call("get_weather", {})])) for _ in range(n))
    return b"".join(sse(chunk(None, calls=[openai_call(i, "get_weather")])) for i in range(n))


@pytest.mark.parametrize("kind", ["ollama", "llamacpp"])
async def test_streamed_tool_calls_are_bounded_by_max_response_bytes(
    kind: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    """Calls are held (by clients, and by the gateway's call ordering until the one before closes):
    a stream may carry no more of them than a whole answer may be, however small each event."""
    server.answer = body_of(kind, many_calls(kind, 20_000) + final(kind))
    error = await stream_error(gateway, kind, tools=TOOLS)
    assert "max_response_bytes" in error["message"]


async def test_held_call_arguments_are_bounded(server: NativeServer, gateway: httpx.AsyncClient) -> None:
    """Call 0 never closes its JSON, call 1 sends arguments in small fragments for ever: held, so bounded."""
    opening = sse(chunk(None, calls=[openai_call(0, "get_weather", "{")]))
    fragment = sse(chunk(None, calls=[{"index": 1, "function": {"arguments": "x" * 32768}}]))
    head = opening + sse(chunk(None, calls=[openai_call(1, "get_time", '{"a":"')]))
    server.answer = endless(server, head, fragment, "text/event-stream")
    error = await stream_error(gateway, "llamacpp", tools=TOOLS)
    assert "max_response_bytes" in error["message"]
    assert server.sent_bytes < 64 * 1024 * 1024


# --- SSE framing: a second [DONE], fields that are not data ----------------------------------------------


@pytest.mark.parametrize("kind", SSE_KINDS)
@pytest.mark.parametrize(
    "noise", [b"retry: 10\n\n", b"event: ping\n\n", b"id: 7\n", b"event: message\n", b": keep-alive\n\n"]
)
async def test_sse_fields_that_are_not_data_are_skipped(
    kind: str, noise: bytes, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    server.answer = body_of(kind, noise + sse(chunk("Par")) + noise + sse(chunk("is")) + noise + final(kind))
    events = await stream(gateway, kind)
    assert events[-1] == {"done": True}
    assert "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"]) == "Paris"


@pytest.mark.parametrize("kind", SSE_KINDS)
async def test_a_second_done_is_not_an_error(kind: str, server: NativeServer, gateway: httpx.AsyncClient) -> None:
    server.answer = body_of(kind, sse(chunk("Paris")) + final(kind) + b"data: [DONE]\n\n" + sse(chunk("late")))
    events = await stream(gateway, kind)
    assert events[-1] == {"done": True} and not any("error" in e for e in events)
    assert "late" not in orjson.dumps(events).decode()


# --- secrets: an upstream that echoes the gateway's key to it ------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_an_echoed_upstream_key_never_reaches_the_client(
    kind: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    echo = {"error": f"bad token Bearer {SECRET} for model"}
    frames = ndjson(line("Paris"), echo) if kind == "ollama" else sse(chunk("Paris"), echo)
    server.answer = body_of(kind, frames)
    resp = await chat(gateway, kind, stream=True)
    assert SECRET not in resp.text and SECRET[:12] not in resp.text

    async def status_400(request: web.Request) -> web.StreamResponse:
        return web.Response(status=400, body=orjson.dumps(echo), headers={"Content-Type": "application/json"})

    server.answer = status_400
    resp = await chat(gateway, kind)
    assert resp.status_code == 400 and SECRET[:12] not in resp.text


# --- the breaker counts the upstream's failures only ----------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_the_breaker_counts_upstream_failures_not_client_errors(kind: str, server: NativeServer) -> None:
    breaker = "{consecutive_failures: 2, failure_rate: null, cooldown: 3600}"
    app = create_app(parse_config(_config(server.url, breaker), "<test config>", env={}))
    runner, url = await serve_app(app)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def status_400(request: web.Request) -> web.StreamResponse:
                body = {"error": "messages: invalid", "error_type": "validation"}
                return web.Response(status=400, body=orjson.dumps(body), headers={"Content-Type": "application/json"})

            server.answer = status_400
            for streaming in (False, True, False, True):  # a client's bad requests: 4 in a row, circuit closed
                assert (await chat(client, kind, stream=streaming)).status_code == 400
            server.answer = json_of(b"{not json")  # the upstream's garbage: 2 in a row open it
            for _ in range(2):
                upstream_failure(await chat(client, kind))
            posts = server.posts
            refused = await chat(client, kind)
            assert refused.status_code == 503 and server.posts == posts, refused.text
    finally:
        await runner.cleanup()


# --- shapes: a missing finish reason, tool_calls that are not a list -------------------------------------


@pytest.mark.parametrize("kind", SSE_KINDS)
async def test_a_non_stream_answer_without_finish_reason_is_an_error_not_stop(
    kind: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    body = orjson.loads(non_stream_body(kind, 3, 1))
    del body["choices"][0]["finish_reason"]
    server.answer = json_of(orjson.dumps(body))
    assert "finish_reason" in upstream_failure(await chat(gateway, kind))["message"]


async def test_an_ollama_answer_without_done_is_an_error(server: NativeServer, gateway: httpx.AsyncClient) -> None:
    body = orjson.loads(non_stream_body("ollama", 3, 1))
    body["done"] = False
    server.answer = json_of(orjson.dumps(body))
    upstream_failure(await chat(gateway, "ollama"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("calls", [5, "get_weather", [5], ["x"], True], ids=repr)
async def test_tool_calls_that_are_not_a_list_of_objects_are_an_error(
    kind: str, calls: Any, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    server.answer = body_of(kind, call_frames(kind, calls))
    error = await stream_error(gateway, kind, tools=TOOLS)
    assert "tool call" in error["message"]
    body = orjson.loads(non_stream_body(kind, 3, 1))
    message = body["message"] if kind == "ollama" else body["choices"][0]["message"]
    message["tool_calls"] = calls
    server.answer = json_of(orjson.dumps(body))
    assert "tool call" in upstream_failure(await chat(gateway, kind, tools=TOOLS))["message"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", ["Paris", ["Paris"], 7])
async def test_a_message_or_delta_that_is_not_an_object_is_an_error(
    kind: str, value: Any, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    if kind == "ollama":
        frame = ndjson({**line("x"), "message": value})
    else:
        frame = sse({**chunk("x"), "choices": [{"index": 0, "delta": value, "finish_reason": None}]})
    server.answer = body_of(
        kind, sse(chunk("Paris")) + frame + final(kind) if kind != "ollama" else frame + final(kind)
    )
    error = await stream_error(gateway, kind)
    assert "not an object" in error["message"]


# --- the completions side reads counters the same way (one reading, common.count) ----------------------

COMPLETION_COUNTERS = {
    "tgi": ('{"generated_text":" Paris","details":{"finish_reason":"eos_token","generated_tokens":%s,"tokens":[]}}'),
    "ollama": '{"response":" Paris","done":true,"done_reason":"stop","prompt_eval_count":%s,"eval_count":1}',
    "llamacpp": '{"content":" Paris","stop":true,"stop_type":"eos","tokens_evaluated":%s,"tokens_predicted":1}',
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", ["-5", "18446744073709551616", "1e30", '"abc"', "1.5", "true"])
async def test_completions_counters_are_read_the_same_way(
    kind: str, bad: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    server.answer = json_of((COMPLETION_COUNTERS[kind] % bad).encode())
    resp = await gateway.post("/v1/completions", json={"model": f"{kind}-model", "prompt": "The capital of France is"})
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    assert all(isinstance(v, int) and 0 <= v < 2**32 for v in usage.values()), usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("reason", ['"weird"', "null", "7"])
async def test_tgi_completions_never_invent_a_finish_reason(
    streaming: bool, reason: str, server: NativeServer, gateway: httpx.AsyncClient
) -> None:
    details = f'{{"finish_reason":{reason},"generated_tokens":1,"input_length":3,"tokens":[]}}'
    if streaming:
        token = '{"id":1,"text":" Paris","logprob":-0.3,"special":false}'
        frame = f'data: {{"token":{token},"generated_text":" Paris","details":{details}}}\n\n'
        server.answer = body_of("tgi", frame.encode())
    else:
        server.answer = json_of(f'{{"generated_text":" Paris","details":{details}}}'.encode())
    resp = await gateway.post("/v1/completions", json={"model": "tgi-model", "prompt": "Hi", "stream": streaming})
    if resp.status_code != 200:
        assert "finish_reason" in upstream_failure(resp)["message"]
        return
    events = events_of(resp)
    if events[-1] == {"done": True}:
        events.pop()
    assert "error" in events[-1] and "finish_reason" in events[-1]["error"]["message"], events
    assert not any(c.get("finish_reason") for e in events if "choices" in e for c in e["choices"])


async def test_held_call_arguments_cost_linear_time() -> None:
    """The call ordering holds a later call's fragments (here 16 KiB each) until the call before closes:
    8x the bytes cost about 8x the time (concatenating per fragment was quadratic: 64 MiB held cost
    about a minute of the event loop). Each size's best of three runs, with a 5 ms floor: a loaded
    machine only adds time (page faults of the 16 MiB string count as process time), and quadratic
    concatenation of the large run copies ~8 GiB, seconds, far past the bound whatever the load."""

    fragment = {"index": 1, "function": {"arguments": "x" * 16384}}

    def run(fragments: int) -> float:
        choice = _Choice()
        choice.take([{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}])
        choice.take([{"index": 1, "id": "b", "function": {"name": "g", "arguments": '{"a":"'}}])
        started = time.process_time()
        for _ in range(fragments):
            choice.take([fragment])
        (held,) = choice.release()
        assert len(held["function"]["arguments"]) == 6 + 16384 * fragments
        return time.process_time() - started

    small, large = min(run(128) for _ in range(3)), min(run(1024) for _ in range(3))
    assert large < max(small, 0.005) * 8 * 3
