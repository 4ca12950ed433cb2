"""Black-box probes: a hostile raw upstream behind a real gateway, every backend family, both endpoints.

Each probe rewrites the bytes of the family's correct answer (SSE framing, HTTP framing, status
lines, dying sockets) and checks what the client gets against one rule (:func:`verdict`): a
complete answer, or a clear failure -- a 5xx OpenAI envelope before the first event, or one
error event then ``[DONE]`` -- never a silent truncation that looks complete, never HTML, never
invalid UTF-8, never a hang. After every probe a correct request on the same gateway must work:
a bad exchange never leaves a dead or dirty connection in the keep-alive pool.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.transport.raw_upstream import (
    KINDS,
    UPSTREAM_MODEL,
    RawUpstream,
    Request,
    chunked,
    golden_answer,
    head,
    sized,
)
from tests.conftest import serve_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

SSE_KINDS = ("openai", "vllm", "tgi", "llamacpp")
ENDPOINTS = ("completions", "chat")
MAX_EVENT = 1024 * 1024
CASES = [(k, e, s) for k in KINDS for e in ENDPOINTS for s in (False, True)]
STREAM_CASES = [(k, e) for k in KINDS for e in ENDPOINTS]
SSE_CASES = [(k, e) for k in SSE_KINDS for e in ENDPOINTS]


def _ids(value: Any) -> str:
    return "stream" if value is True else "whole" if value is False else str(value)


async def _running() -> AsyncIterator[RawUpstream]:
    up = RawUpstream()
    await up.start()
    try:
        yield up
    finally:
        await up.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def upstream() -> AsyncIterator[RawUpstream]:
    async for up in _running():
        yield up


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def elsewhere() -> AsyncIterator[RawUpstream]:
    """Another host a redirect points at: it must never be asked."""
    async for up in _running():
        yield up


def _config(url: str) -> str:
    timeout = "{connect: 1, first_byte: 1, total: 2, stream_idle: 1}"
    limits = f"{{max_response_bytes: {4 * MAX_EVENT}, max_event_bytes: {MAX_EVENT}}}"
    backends, models = [], []
    for kind in KINDS:
        extra = ", version: '0.11.0'" if kind == "vllm" else ""
        for name in (f"{kind}-a", f"{kind}-b"):
            backends.append(
                f"  - {{name: {name}, type: {kind}, base_url: '{url}', timeout: {timeout}, limits: {limits},"
                f" circuit_breaker: {{enabled: false}}{extra}}}\n"
            )
        up = UPSTREAM_MODEL[kind]
        models.append(f"  - {{name: {kind}-model, routes: [{{backend: {kind}-a, model: {up}}}]}}\n")
        routes = f"[{{backend: {kind}-a, model: {up}}}, {{backend: {kind}-b, model: {up}}}]"
        models.append(f"  - {{name: {kind}-fo, routes: {routes}}}\n")
    return f"server: {{host: 127.0.0.1, port: 0}}\nbackends:\n{''.join(backends)}models:\n{''.join(models)}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(upstream: RawUpstream) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(parse_config(_config(upstream.url), "<test config>", env={}))
    runner, url = await serve_app(app)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=15) as client:
            yield client
    finally:
        await runner.cleanup()


async def ask(client: httpx.AsyncClient, kind: str, endpoint: str, stream: bool, model: str = "") -> httpx.Response:
    body: dict[str, Any] = {"model": model or f"{kind}-model", "max_tokens": 8, "stream": stream}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "The capital of France?"}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "The capital of France is"
        path = "/v1/completions"
    return await asyncio.wait_for(client.post(path, json=body), 20)


def verdict(resp: httpx.Response, stream: bool) -> str:
    """``ok`` (a complete answer) or ``error`` (a clear failure); asserts everything else never happens."""
    text = resp.content.decode("utf-8")  # never invalid UTF-8 to the client
    assert "<html" not in text.lower() and "Traceback" not in text, text[:300]
    if resp.status_code != 200:
        assert resp.status_code in (502, 503, 504), (resp.status_code, text[:300])
        assert resp.headers["content-type"].startswith("application/json"), resp.headers
        error = resp.json()["error"]
        assert set(error) >= {"message", "type", "param", "code"}, error
        return "error"
    if not stream:
        body = resp.json()
        assert isinstance(body["choices"], list) and body["choices"], body
        assert all(c["finish_reason"] for c in body["choices"]), body
        return "ok"
    blocks = [b for b in text.split("\n\n") if b]
    assert blocks and blocks[-1] == "data: [DONE]", blocks[-3:]
    events = []
    for block in blocks[:-1]:
        assert block.startswith("data: ") and "\n" not in block, block[:200]
        assert block != "data: [DONE]", "two [DONE]s"
        events.append(orjson.loads(block[6:]))
    errors = [i for i, e in enumerate(events) if "error" in e]
    if errors:
        assert errors == [len(events) - 1], "one error event, the last before [DONE]"
        assert events[-1]["error"]["message"], events[-1]
        return "error"
    for event in events:
        assert isinstance(event["choices"], list), event
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
    assert finishes, f"a stream that ends with [DONE] but no finish_reason: a silent truncation {events[-2:]}"
    return "ok"


async def probe(
    client: httpx.AsyncClient, upstream: RawUpstream, script: Any, kind: str, endpoint: str, stream: bool
) -> str:
    """``script`` answers one request; then a correct request must still succeed on the same gateway."""
    upstream.reset(script)
    result = verdict(await ask(client, kind, endpoint, stream), stream)
    upstream.reset()
    assert verdict(await ask(client, kind, endpoint, stream), stream) == "ok", "the next request failed"
    return result


def rewrite(change: Callable[[bytes], bytes], *, te: bool = True) -> Any:
    """A script answering the golden body rewritten by ``change`` (chunked, or closed by EOF)."""

    async def script(req: Request, writer: asyncio.StreamWriter) -> bool:
        body, ctype = req.golden()
        body = change(body)
        if te:
            writer.write(head(200, ctype, "Transfer-Encoding: chunked") + chunked(body))
        else:
            writer.write(head(200, ctype) + body)
        await writer.drain()
        return te

    return script


# --- SSE framing ---------------------------------------------------------------------------------


def _multiline(body: bytes) -> bytes:
    # JSON with a line break after its first brace, as two data lines (the SSE join restores it)
    return body.replace(b"data: {", b"data: {\ndata: ").replace(b"data:{", b"data:{\ndata:")


def _noise(body: bytes) -> bytes:
    noise = b": keep-alive\n\nevent: message\nid: 7\nretry: 1000\n: comment\n"
    return noise + body.replace(b"\n\ndata:", b"\n\n: ping\n\nid: 8\nevent: message\ndata:")


def _extra_after_done(body: bytes) -> bytes:
    return body + b'data: {"choices":[{"index":0,"text":"EXTRA","delta":{"content":"EXTRA"},"finish_reason":null}]}\n\n'


SSE_FRAMING: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "crlf": (lambda b: b.replace(b"\n", b"\r\n"), "ok"),
    "bare_cr": (lambda b: b.replace(b"\n", b"\r"), "ok"),
    "no_space": (lambda b: b.replace(b"data: ", b"data:"), "ok"),
    "spaced": (lambda b: b.replace(b"data:", b"data: ").replace(b"data:  ", b"data: "), "ok"),
    "multiline_data": (_multiline, "ok"),
    "fields_and_comments": (_noise, "ok"),
    "bom": (lambda b: b"\xef\xbb\xbf" + b, "ok"),
    "done_twice": (lambda b: b + b"data: [DONE]\n\n", "ok"),
    "data_after_done": (_extra_after_done, "ok"),
    "invalid_utf8": (lambda b: b.replace(b"Paris", b"Pa\xff\xferis", 1), "either"),
}


@pytest.mark.parametrize("name", list(SSE_FRAMING))
@pytest.mark.parametrize(("kind", "endpoint"), SSE_CASES, ids=_ids)
async def test_sse_framing(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str, name: str
) -> None:
    change, expected = SSE_FRAMING[name]
    got = await probe(gateway, upstream, rewrite(change), kind, endpoint, True)
    assert expected in (got, "either")


@pytest.mark.parametrize(("kind", "endpoint"), SSE_CASES, ids=_ids)
@pytest.mark.parametrize("name", ["no_final_blank_line", "no_done"])
async def test_a_stream_ending_without_its_last_frame_is_never_a_silent_truncation(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str, name: str
) -> None:
    change: Callable[[bytes], bytes] = (
        (lambda b: b.rstrip(b"\n"))
        if name == "no_final_blank_line"
        else (lambda b: b.replace(b"data: [DONE]\n\n", b""))
    )
    await probe(gateway, upstream, rewrite(change, te=False), kind, endpoint, True)  # verdict's rules


@pytest.mark.parametrize(("kind", "endpoint"), STREAM_CASES, ids=_ids)
async def test_a_huge_event_ends_in_an_error(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str
) -> None:
    async def script(req: Request, writer: asyncio.StreamWriter) -> bool:
        _, ctype = req.golden()
        writer.write(head(200, ctype))
        writer.write(b'data: {"x": "' if kind != "ollama" else b'{"x": "')
        for _ in range(20):  # 20 MB, one event
            writer.write(b"a" * 1024 * 1024)
            await writer.drain()
        return False

    assert await probe(gateway, upstream, script, kind, endpoint, True) == "error"


NDJSON: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "crlf": (lambda b: b.replace(b"\n", b"\r\n"), "ok"),
    "blank_lines": (lambda b: b.replace(b"\n", b"\n\n\r\n"), "ok"),
    "partial_last_line": (lambda b: b.rstrip(b"\n"), "either"),
    "invalid_utf8": (lambda b: b.replace(b"Paris", b"Pa\xff\xferis", 1), "either"),
}


@pytest.mark.parametrize("name", list(NDJSON))
@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_ollama_ndjson_framing(
    gateway: httpx.AsyncClient, upstream: RawUpstream, endpoint: str, name: str
) -> None:
    change, expected = NDJSON[name]
    got = await probe(gateway, upstream, rewrite(change, te=name != "partial_last_line"), "ollama", endpoint, True)
    assert expected in (got, "either")


# --- HTTP framing ----------------------------------------------------------------------------------


def raw(build: Callable[[Request, bytes, str], bytes], keep: bool = False) -> Any:
    async def script(req: Request, writer: asyncio.StreamWriter) -> bool:
        body, ctype = req.golden()
        writer.write(build(req, body, ctype))
        await writer.drain()
        return keep

    return script


HTTP: dict[str, tuple[Callable[[Request, bytes, str], bytes], str]] = {
    "deflate": (lambda r, b, c: sized(zlib.compress(b), c, "Content-Encoding: deflate"), "error"),
    "chunk_trailers": (
        lambda r, b, c: head(200, c, "Transfer-Encoding: chunked", "Trailer: X-T") + chunked(b, trailer=b"X-T: 1\r\n"),
        "ok",
    ),
    "chunk_extensions": (
        lambda r, b, c: head(200, c, "Transfer-Encoding: chunked") + b"%x;name=val\r\n%s\r\n0\r\n\r\n" % (len(b), b),
        "ok",
    ),
    "bad_chunk_size": (lambda r, b, c: head(200, c, "Transfer-Encoding: chunked") + b"zz\r\n" + b, "error"),
    "length_short": (lambda r, b, c: head(200, c, f"Content-Length: {len(b) // 2}") + b, "error"),
    "length_long": (lambda r, b, c: head(200, c, f"Content-Length: {len(b) + 100}") + b, "error"),
    "interim_1xx": (
        lambda r, b, c: b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nLink: </x>\r\n\r\n" + sized(b, c),
        "ok",
    ),
    "204": (lambda r, b, c: b"HTTP/1.1 204 No Content\r\n\r\n", "error"),
    "304": (lambda r, b, c: b"HTTP/1.1 304 Not Modified\r\n\r\n", "error"),
    "connection_close": (lambda r, b, c: sized(b, c, "Connection: close"), "ok"),
    "http10_eof": (lambda r, b, c: head(200, c, version="1.0") + b, "ok"),
    "html_200": (lambda r, b, c: sized(b"<html><body>oops</body></html>", "text/html"), "error"),
    "html_500": (
        lambda r, b, c: sized(b"<html><body><h1>500</h1>nginx</body></html>", "text/html", status=500),
        "error",
    ),
    "json_array": (lambda r, b, c: sized(b"[1, 2]", "application/json"), "error"),
    "json_null": (lambda r, b, c: sized(b"null", "application/json"), "error"),
    "json_choices_object": (lambda r, b, c: sized(b'{"choices": {"index": 0}}', "application/json"), "error"),
    "gzip": (lambda r, b, c: sized(gzip.compress(b), c, "Content-Encoding: gzip"), "error"),
    "two_lengths": (lambda r, b, c: head(200, c, f"Content-Length: {len(b)}", "Content-Length: 3") + b, "error"),
}


@pytest.mark.parametrize("name", list(HTTP))
@pytest.mark.parametrize(("kind", "endpoint", "stream"), CASES, ids=_ids)
async def test_http_framing(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str, stream: bool, name: str
) -> None:
    build, expected = HTTP[name]
    if stream and name == "length_long":
        expected = "either"  # every event, the last one included, arrived before the cut
    got = await probe(gateway, upstream, raw(build), kind, endpoint, stream)
    assert expected in (got, "either")


@pytest.mark.parametrize("status", [301, 302, 307])
@pytest.mark.parametrize(("kind", "endpoint", "stream"), CASES, ids=_ids)
async def test_a_redirect_is_a_502_not_followed(
    gateway: httpx.AsyncClient,
    upstream: RawUpstream,
    elsewhere: RawUpstream,
    kind: str,
    endpoint: str,
    stream: bool,
    status: int,
) -> None:
    elsewhere.reset()
    script = raw(lambda r, b, c: sized(b"", c, f"Location: {elsewhere.url}{r.path}", status=status), keep=True)
    assert await probe(gateway, upstream, script, kind, endpoint, stream) == "error"
    assert elsewhere.requests == []


@pytest.mark.parametrize(("kind", "endpoint", "stream"), CASES, ids=_ids)
async def test_connection_close_answers_never_leave_a_dead_socket_in_the_pool(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str, stream: bool
) -> None:
    upstream.reset(raw(lambda r, b, c: sized(b, c, "Connection: close")))
    for _ in range(3):
        assert verdict(await ask(gateway, kind, endpoint, stream), stream) == "ok"
    assert len(upstream.requests) == 3


# --- timeouts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "endpoint", "stream"), [(k, "chat", s) for k in KINDS for s in (False, True)], ids=_ids
)
async def test_slow_headers_and_endless_bodies_time_out(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str, stream: bool
) -> None:
    async def trickle(req: Request, writer: asyncio.StreamWriter) -> bool:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)
        return False

    async def endless(req: Request, writer: asyncio.StreamWriter) -> bool:
        body, ctype = req.golden()
        writer.write(head(200, ctype, f"Content-Length: {len(body) + 10}") + body[:20])
        await writer.drain()
        await asyncio.sleep(30)
        return False

    assert await probe(gateway, upstream, trickle, kind, endpoint, stream) == "error"
    assert await probe(gateway, upstream, endless, kind, endpoint, stream) == "error"


# --- a dying upstream -------------------------------------------------------------------------------


def _first_event(body: bytes, kind: str) -> int:
    return body.index(b"\n") + 1 if kind == "ollama" else body.index(b"\n\n") + 2


@pytest.mark.parametrize("where", ["after_headers", "after_one_event", "mid_event"])
@pytest.mark.parametrize(("kind", "endpoint"), STREAM_CASES, ids=_ids)
async def test_a_stream_cut_ends_with_one_error_event_and_is_not_resent(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str, where: str
) -> None:
    async def script(req: Request, writer: asyncio.StreamWriter) -> bool:
        body, ctype = req.golden()
        cut = {
            "after_headers": 0,
            "after_one_event": _first_event(body, kind),
            "mid_event": _first_event(body, kind) + 9,
        }
        writer.write(head(200, ctype, "Transfer-Encoding: chunked") + chunked(body[: cut[where]])[:-5])
        await writer.drain()
        return False

    upstream.reset(script)
    resp = await ask(gateway, kind, endpoint, True, model=f"{kind}-fo")
    assert verdict(resp, True) == "error"
    if resp.status_code == 200:  # a byte reached the client: no failover, no resend
        assert len(upstream.requests) == 1, [r.path for r in upstream.requests]
    upstream.reset()
    assert verdict(await ask(gateway, kind, endpoint, True), True) == "ok"


@pytest.mark.parametrize(("kind", "endpoint", "stream"), CASES, ids=_ids)
async def test_a_backend_dead_before_answering_fails_over(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str, stream: bool
) -> None:
    async def script(req: Request, writer: asyncio.StreamWriter) -> bool:
        if len(upstream.requests) == 1:
            return False  # hang up without a byte
        return await golden_answer(req, writer)

    upstream.reset(script)
    assert verdict(await ask(gateway, kind, endpoint, stream, model=f"{kind}-fo"), stream) == "ok"
    assert len(upstream.requests) == 2


# --- lying JSON shapes in streams ------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "endpoint"), SSE_CASES, ids=_ids)
async def test_a_stream_chunk_with_choices_as_an_object_is_an_error(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str
) -> None:
    def change(body: bytes) -> bytes:
        first = body.index(b"\n\n") + 2
        bad = b'data: {"id":"x","object":"x","created":1,"model":"m","choices":{"index":0}}\n\n'
        return body[:first] + bad + body[first:]

    assert await probe(gateway, upstream, rewrite(change), kind, endpoint, True) == "error"


@pytest.mark.parametrize(("kind", "endpoint"), STREAM_CASES, ids=_ids)
async def test_a_stream_trickled_one_byte_per_read(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str
) -> None:
    async def script(req: Request, writer: asyncio.StreamWriter) -> bool:
        body, ctype = req.golden()
        writer.write(head(200, ctype, "Transfer-Encoding: chunked"))
        for i in range(len(body)):
            writer.write(chunked(body[i : i + 1])[:-5])  # one chunk per byte, each its own TCP write
            await writer.drain()
            await asyncio.sleep(0)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    assert await probe(gateway, upstream, script, kind, endpoint, True) == "ok"


@pytest.mark.parametrize(("kind", "endpoint", "stream"), CASES, ids=_ids)
async def test_huge_integers_in_usage_never_give_a_500(
    gateway: httpx.AsyncClient, upstream: RawUpstream, kind: str, endpoint: str, stream: bool
) -> None:
    big = str(2**64 + 1).encode()

    def change(body: bytes) -> bytes:
        for key in (b'"completion_tokens":', b'"generated_tokens":', b'"eval_count":', b'"tokens_predicted":'):
            for spaced in (key, key + b" "):
                at = body.rfind(spaced)
                if at >= 0:
                    end = at + len(spaced)
                    stop = min(i for i in (body.find(b",", end), body.find(b"}", end)) if i >= 0)
                    return body[:end] + big + body[stop:]
        return body

    await probe(
        gateway,
        upstream,
        rewrite(change, te=stream) if stream else raw(lambda r, b, c: sized(change(b), c)),
        kind,
        endpoint,
        stream,
    )  # verdict's rules: ok or a clear 5xx
