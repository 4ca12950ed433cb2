"""``FastHTTPTransport`` against real loopback servers (aiohttp apps and raw asyncio servers).

Framing (content-length, chunked, EOF-delimited, gzip), keep-alive pooling and its
bounds, the retry of a reused connection that died unanswered, timeouts, and how
every failure maps to a ``backends.errors`` type.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import orjson
import pytest
from aiohttp import web

from backends.errors import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
    UpstreamTooLargeError,
)
from backends.transport.httptools_client import FastHTTPTransport
from schemas.config import TimeoutConfig
from tests.conftest import eventually, free_port
from tests.fakes import Behaviour, FakeUpstream

JSON = {"Content-Type": "application/json", "Authorization": "Bearer sk-test"}
BIG = bytes(range(256)) * 4096  # 1 MiB


# Where the fake upstream never ends by itself, only the timeout under test can end the
# call; should it not, the test fails after this many seconds instead of hanging (the
# asyncio.timeout raises TimeoutError, not our UpstreamTimeoutError).
HANG = 30.0


def transport(max_connections: int = 8, **timeouts: float) -> FastHTTPTransport:
    return FastHTTPTransport("up", TimeoutConfig(**timeouts), max_connections)


@pytest.fixture
async def client() -> AsyncIterator[FastHTTPTransport]:
    t = transport()
    yield t
    await t.close()


def payload(stream: bool = False, **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 4, "stream": stream, **extra})


async def post(t: FastHTTPTransport, up: FakeUpstream, stream: bool = False, **extra: Any) -> Any:
    return await t.send("POST", up.url + "/completions", body=payload(stream, **extra), headers=JSON, stream=stream)


async def complete(t: FastHTTPTransport, up: FakeUpstream) -> Any:
    resp = await post(t, up)
    try:
        assert resp.status == 200
        return orjson.loads(await resp.read())
    finally:
        resp.release()


# --- servers ----------------------------------------------------------------------------


@pytest.fixture
async def app_server() -> AsyncIterator[str]:
    """An aiohttp app with the odd responses FakeUpstream does not give."""

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=BIG)

    async def close(request: web.Request) -> web.Response:
        return web.Response(text="bye", headers={"Connection": "close"})

    async def gzipped(request: web.Request) -> web.Response:
        return web.Response(body=gzip.compress(b"squeezed " * 1000), headers={"Content-Encoding": "gzip"})

    async def headers(request: web.Request) -> web.Response:
        return web.Response(text="", headers={"X-Thing": "a", "x-multi": "1", "X-Multi": "2", "Retry-After": "7"})

    app = web.Application()
    for path, handler in (("/big", big), ("/close", close), ("/gzip", gzipped), ("/headers", headers)):
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        match = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
        return head + await reader.readexactly(int(match.group(1)) if match else 0)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> str:
        async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await handler(reader, writer)
            finally:
                writer.close()

        server = await asyncio.start_server(guarded, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


# --- round trips --------------------------------------------------------------------------


async def test_non_stream_json_round_trip(client: FastHTTPTransport, fake_upstream: FakeUpstream) -> None:
    resp = await post(client, fake_upstream)
    try:
        assert resp.status == 200
        assert resp.header("content-type") == resp.header("CONTENT-TYPE") == "application/json"
        assert resp.header("X-Absent") is None
        data = orjson.loads(await resp.read())
    finally:
        resp.release()
    assert data["choices"][0]["text"] == " hello world"
    seen = fake_upstream.requests[0]
    assert seen.path == "/v1/completions" and seen.body["prompt"] == "hi"
    assert seen.headers["Authorization"] == "Bearer sk-test"
    assert seen.headers["Host"] == f"127.0.0.1:{fake_upstream.port}"
    assert seen.headers["Accept-Encoding"] == "identity"  # nothing we would have to inflate


async def test_stream_iterates_pieces_and_ends(client: FastHTTPTransport, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script.append(Behaviour(delay=0.01))
    resp = await post(client, fake_upstream, stream=True, max_tokens=5)
    pieces = [piece async for piece in resp.iter_chunks()]
    resp.release()
    assert len(pieces) >= 5  # one per event, as they were written
    events = b"".join(pieces).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert [orjson.loads(e[6:])["choices"][0]["text"] for e in events[:-2]] == [f" t{i}" for i in range(5)]
    assert fake_upstream.connections == 1
    await complete(client, fake_upstream)  # the stream's connection went back to the pool
    assert fake_upstream.connections == 1


async def test_content_length_body_read_and_iterated(client: FastHTTPTransport, app_server: str) -> None:
    resp = await client.send("GET", app_server + "/big", body=None, headers={}, stream=False)
    assert resp.header("Content-Length") == str(len(BIG))
    assert await resp.read() == BIG
    resp.release()
    resp = await client.send("GET", app_server + "/big", body=None, headers={}, stream=True)
    received = bytearray()
    async for piece in resp.iter_chunks():
        received += piece
        await asyncio.sleep(0.001)  # a slow consumer: reading pauses and resumes
    resp.release()
    assert received == BIG


async def test_gzip_body_we_did_not_ask_for_is_refused(client: FastHTTPTransport, app_server: str) -> None:
    """Issue 13 item 3: a gzip bomb is never inflated; an encoded answer is a 502."""
    with pytest.raises(UpstreamTooLargeError) as caught:
        await client.send("GET", app_server + "/gzip", body=None, headers={}, stream=False)
    assert caught.value.status == 502 and caught.value.reason == "encoded"
    assert client._count == 0  # the connection was closed, not pooled


async def test_header_lookup_is_case_insensitive(client: FastHTTPTransport, app_server: str) -> None:
    resp = await client.send("GET", app_server + "/headers", body=None, headers={}, stream=False)
    await resp.read()
    resp.release()
    assert resp.header("x-thing") == resp.header("X-THING") == "a"
    assert resp.header("Retry-After") == "7"
    assert resp.header("x-multi") == "1, 2"


async def test_eof_delimited_body(client: FastHTTPTransport, raw_server: Callable[[Handler], Awaitable[str]]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()

    url = await raw_server(handler)
    resp = await client.send("GET", url, body=None, headers={}, stream=False)
    assert await resp.read() == b"until the end"
    resp.release()


# --- pooling ------------------------------------------------------------------------------


async def test_keep_alive_reuses_one_connection(client: FastHTTPTransport, fake_upstream: FakeUpstream) -> None:
    for _ in range(50):
        await complete(client, fake_upstream)
    assert len(fake_upstream.requests) == 50
    assert fake_upstream.connections == 1


async def test_concurrency_is_bounded_by_max_connections(fake_upstream: FakeUpstream) -> None:
    t = transport(max_connections=4)

    async def one() -> bytes:
        resp = await post(t, fake_upstream, stream=True, max_tokens=3)
        try:
            return b"".join([piece async for piece in resp.iter_chunks()])
        finally:
            resp.release()

    for _ in range(32):
        fake_upstream.script.append(Behaviour(delay=0.005))
    try:
        bodies = await asyncio.gather(*(one() for _ in range(32)))
    finally:
        await t.close()
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    assert 1 <= fake_upstream.connections <= 4


async def test_waiting_for_a_connection_is_bounded_by_connect(fake_upstream: FakeUpstream) -> None:
    t = transport(max_connections=1, connect=0.2)
    fake_upstream.script.append(Behaviour(kind="stall_mid", events=1, delay=3600))  # holds the slot
    held = await post(t, fake_upstream, stream=True)
    started = time.monotonic()
    with pytest.raises(UpstreamTimeoutError):
        async with asyncio.timeout(HANG):
            await post(t, fake_upstream)
    # Timing-only sanity (the transport's timeouts are the event loop's timers, no clock to
    # inject): it waited for the 0.2 s connect bound, not for the held stream to end.
    assert time.monotonic() - started >= 0.15
    held.release()  # frees the only slot
    assert (await complete(t, fake_upstream))["object"] == "text_completion"
    await t.close()


async def test_connection_close_response_is_not_pooled(client: FastHTTPTransport, app_server: str) -> None:
    peers = []
    for _ in range(3):
        resp = await client.send("GET", app_server + "/close", body=None, headers={}, stream=False)
        assert await resp.read() == b"bye"
        peers.append(cast(Any, resp)._conn.transport.get_extra_info("sockname"))
        resp.release()
    assert len(set(peers)) == 3
    assert client._count <= 1 and not any(client._idle.values())


async def test_idle_connection_closed_by_server_is_not_reused(client: FastHTTPTransport, app_server: str) -> None:
    for _ in range(2):
        resp = await client.send("GET", app_server + "/headers", body=None, headers={}, stream=False)
        assert resp.status == 200
        await resp.read()
        resp.release()
        await eventually(lambda: client._count == 0)  # the server closed it after its keepalive_timeout


async def test_request_read_then_dropped_unanswered_is_never_resent(
    client: FastHTTPTransport, raw_server: Callable[[Handler], Awaitable[str]]
) -> None:
    """Issue 13 item 22: the upstream read the POST, worked, and closed without a byte.

    It may have run it: sending it again would duplicate a generation. The failure says
    what happened (closed unanswered), not "unreachable".
    """
    requests: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            requests.append(request)
            if len(requests) == 1:
                writer.write(OK)  # keep-alive...
                await writer.drain()
            else:
                return  # ...the next request is read, then the connection closes unanswered

    url = await raw_server(handler)
    resp = await client.send("POST", url, body=b"{}", headers=JSON, stream=False)
    assert await resp.read() == b"ok"
    resp.release()
    with pytest.raises(UpstreamClosedError) as caught:
        await client.send("POST", url, body=b"{}", headers=JSON, stream=False)
    assert caught.value.code == "upstream_closed" and caught.value.reason == "closed"
    assert len(requests) == 2  # never a third


async def test_reused_connection_dead_at_the_write_is_resent_fresh(client: FastHTTPTransport) -> None:
    """The keep-alive race proper: the upstream reset an idle connection before our write
    reached it (the write fails at once), so the request provably never arrived: sent once
    more, on a fresh connection."""
    requests: list[bytes] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    first_answered = threading.Event()
    first_reset = threading.Event()

    def serve() -> None:
        for n in range(2):
            conn, _ = listener.accept()
            data = b""
            while b"\r\n\r\n{}" not in data:
                data += conn.recv(65536)
            requests.append(data)
            conn.sendall(OK)
            if n == 0:
                first_answered.wait(5)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # the first one with a reset, while idle in our pool
            if n == 0:
                first_reset.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/"
    resp = await client.send("POST", url, body=b"{}", headers=JSON, stream=False)
    assert await resp.read() == b"ok"
    resp.release()
    first_answered.set()
    # Blocking on purpose: the reset arrives while the loop cannot see it. Waited for, not slept
    # into: a loaded machine could leave the server's thread asleep past any fixed sleep.
    assert first_reset.wait(10)
    resp = await client.send("POST", url, body=b"{}", headers=JSON, stream=False)
    assert await resp.read() == b"ok"
    resp.release()
    thread.join(5)
    listener.close()
    assert len(requests) == 2


async def test_fresh_connection_dropped_unanswered_is_not_retried(
    client: FastHTTPTransport, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script.append(Behaviour(kind="reset"))
    with pytest.raises(UpstreamConnectError):
        await post(client, fake_upstream)
    assert len(fake_upstream.requests) == 1
    await complete(client, fake_upstream)


# --- failures -----------------------------------------------------------------------------


async def test_connection_refused(client: FastHTTPTransport) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/completions"
    with pytest.raises(UpstreamConnectError):
        await client.send("POST", url, body=b"{}", headers=JSON, stream=False)
    assert client._count == 0


async def test_unresolvable_host(client: FastHTTPTransport) -> None:
    with pytest.raises(UpstreamConnectError):
        await client.send("GET", "http://no-such-host.invalid/", body=None, headers={}, stream=False)


async def test_stall_before_headers_times_out(fake_upstream: FakeUpstream) -> None:
    t = transport(first_byte=0.2)
    fake_upstream.script.append(Behaviour(kind="hold"))  # never answers by itself
    started = time.monotonic()
    with pytest.raises(UpstreamTimeoutError) as info:
        async with asyncio.timeout(HANG):
            await post(t, fake_upstream)
    assert time.monotonic() - started >= 0.15  # timing-only sanity: it waited for first_byte
    assert info.value.reason == "timeout"
    await t.close()


async def test_non_stream_total_bounds_the_body(raw_server: Callable[[Handler], Awaitable[str]]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        await asyncio.Event().wait()  # the rest of the body never comes

    t = transport(first_byte=5, total=0.3)
    resp = await t.send("GET", await raw_server(handler), body=None, headers={}, stream=False)
    with pytest.raises(UpstreamTimeoutError):
        async with asyncio.timeout(HANG):
            await resp.read()  # only ``total`` can end this read
    resp.release()
    await t.close()


async def test_stall_mid_stream_times_out(fake_upstream: FakeUpstream) -> None:
    t = transport(first_byte=1, stream_idle=0.2)
    fake_upstream.script.append(Behaviour(kind="stall_mid", events=2, delay=3600))  # silent until cancelled
    resp = await post(t, fake_upstream, stream=True, max_tokens=8)
    received = b""
    with pytest.raises(UpstreamTimeoutError) as info:
        async with asyncio.timeout(HANG):
            async for piece in resp.iter_chunks():
                received += piece
    resp.release()
    assert info.value.reason == "stream_idle"  # not first_byte (1 s): the silence came after two events
    assert received.count(b"data: ") == 2
    await t.close()


async def test_reset_mid_body_is_stream_cut(client: FastHTTPTransport, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script.append(Behaviour(kind="cut", events=2))
    resp = await post(client, fake_upstream, stream=True, max_tokens=8)
    with pytest.raises(UpstreamProtocolError) as info:
        async for _ in resp.iter_chunks():
            pass
    resp.release()
    assert info.value.reason == "stream_cut"
    await complete(client, fake_upstream)  # a fresh connection


async def test_garbage_response_is_protocol_error(
    client: FastHTTPTransport, raw_server: Callable[[Handler], Awaitable[str]]
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.5)

    with pytest.raises(UpstreamProtocolError):
        await client.send("GET", await raw_server(handler), body=None, headers={}, stream=False)


async def test_release_of_half_read_stream_closes_the_connection(
    client: FastHTTPTransport, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script.append(Behaviour(delay=0.05))
    resp = await post(client, fake_upstream, stream=True, max_tokens=50)
    first = await resp.iter_chunks().__anext__()
    assert first.startswith(b"data: ")
    resp.release()
    resp.release()  # idempotent
    await eventually(lambda: fake_upstream.cancelled_streams > 0)
    assert fake_upstream.cancelled_streams == 1
    await complete(client, fake_upstream)
    assert fake_upstream.connections == 2


async def test_close_ends_in_use_streams(fake_upstream: FakeUpstream) -> None:
    t = transport()
    fake_upstream.script.append(Behaviour(delay=0.05))
    resp = await post(t, fake_upstream, stream=True, max_tokens=50)
    await t.close()
    with pytest.raises(UpstreamProtocolError):
        async for _ in resp.iter_chunks():
            pass
    resp.release()


async def test_crlf_in_a_header_value_is_refused(client: FastHTTPTransport, fake_upstream: FakeUpstream) -> None:
    with pytest.raises(ValueError):
        await client.send("POST", fake_upstream.url, body=b"{}", headers={"X-Bad": "a\r\nHost: evil"}, stream=False)


def test_under_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        up = FakeUpstream()
        await up.start()
        t = transport()
        try:
            for _ in range(5):
                await complete(t, up)
            resp = await post(t, up, stream=True, max_tokens=3)
            assert b"".join([piece async for piece in resp.iter_chunks()]).endswith(b"data: [DONE]\n\n")
            resp.release()
            assert up.connections == 1
        finally:
            await t.close()
            await up.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


async def test_interim_1xx_response_is_skipped(
    client: FastHTTPTransport, raw_server: Callable[[Handler], Awaitable[str]]
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + OK)
            await writer.drain()

    url = await raw_server(handler)
    for _ in range(2):
        resp = await client.send("GET", url, body=None, headers={}, stream=False)
        assert (resp.status, await resp.read(), resp.header("link")) == (200, b"ok", None)
        resp.release()
    assert client._count == 1  # and the connection was reused


async def test_ipv6_literal(client: FastHTTPTransport) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=request.host)

    app = web.Application()
    app.router.add_get("/hello", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "::1", 0).start()
    except OSError:
        await runner.cleanup()
        pytest.skip("no IPv6 loopback")
    port = runner.addresses[0][1]
    try:
        resp = await client.send("GET", f"http://[::1]:{port}/hello?x=1", body=None, headers={}, stream=False)
        assert await resp.read() == f"[::1]:{port}".encode()
        resp.release()
    finally:
        await runner.cleanup()
