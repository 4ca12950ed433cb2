"""Upstream response heads are bounded in every client (issue 13, class "upstream responses are unbounded").

The httptools client caps a head at 64 KiB and 100 header fields (llhttp bounds neither) and
fails with a 502 ``upstream_protocol_error`` as soon as a cap is crossed, long before
``first_byte``. aiohttp's client refuses a field over 8190 bytes or more than 128 fields;
httpx (h11 through httpcore) refuses a head still incomplete past 100 KiB (checked after each
64 KiB read, so a complete head of up to about 164 KiB can pass). Each is checked here, so an
upgrade that drops a limit fails the suite.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from backends.errors import UpstreamError, UpstreamProtocolError
from backends.transport.aiohttp_client import AiohttpTransport
from backends.transport.base import HTTPTransport
from backends.transport.httptools_client import FastHTTPTransport
from backends.transport.httpx_client import HttpxTransport
from schemas.config import TimeoutConfig

FIRST_BYTE = 20.0  # a cap that waited for this would fail the timing assertions below
TIMEOUTS = TimeoutConfig(connect=2, first_byte=FIRST_BYTE, total=FIRST_BYTE, stream_idle=FIRST_BYTE)
Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def fields(count: int, size: int = 8) -> bytes:
    return b"".join(b"X-F%d: %s\r\n" % (i, b"v" * size) for i in range(count))


def head(extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + extra + b"\r\nok"


@pytest.fixture
async def upstream() -> AsyncIterator[Callable[[Writer], Awaitable[str]]]:
    """A raw server: reads a request head, then lets the test write whatever it likes, then holds."""
    servers: list[asyncio.Server] = []

    async def start(write: Writer) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.readuntil(b"\r\n\r\n")
                await write(writer)
                # Never ends by itself: only a cap (the client hanging up) can end the call.
                async with asyncio.timeout(FIRST_BYTE):
                    while await reader.read(65536):
                        pass
            except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x"

    yield start
    for server in servers:
        server.close()


def send_all(data: bytes, step: int = 0) -> Writer:
    async def write(writer: asyncio.StreamWriter) -> None:
        for at in range(0, len(data), step or len(data)):
            writer.write(data[at : at + (step or len(data))])
            await writer.drain()

    return write


def endless_field() -> Writer:
    async def write(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        for _ in range(10_000):  # 40 MB if nobody stops reading
            writer.write(b"a" * 4096)
            await writer.drain()

    return write


async def get(t: HTTPTransport, url: str) -> bytes:
    resp = await t.send("GET", url, body=None, headers={}, stream=False)
    try:
        return await resp.read()
    finally:
        resp.release()


@pytest.fixture
async def fast() -> AsyncIterator[FastHTTPTransport]:
    t = FastHTTPTransport("up", TIMEOUTS, 4)
    yield t
    await t.close()


async def test_a_head_within_the_caps_is_served(
    fast: FastHTTPTransport, upstream: Callable[[Writer], Awaitable[str]]
) -> None:
    url = await upstream(send_all(head(fields(98, size=600)), step=1000))  # 100 fields, ~62 KiB, in pieces
    assert await get(fast, url) == b"ok"


@pytest.mark.parametrize(
    ("write", "what"),
    [
        (send_all(head(fields(101))), "more than 100 header fields"),
        (send_all(head(fields(99, size=700))), "larger than 65536 bytes"),  # one write, complete head
        (send_all(head(fields(99, size=700)), step=1000), "larger than 65536 bytes"),  # in pieces
        (send_all(head(b"X-Big: " + b"b" * 70_000 + b"\r\n"), step=4096), "larger than 65536 bytes"),
        (endless_field(), "larger than 65536 bytes"),
        (send_all(b"HTTP/1.1 103 Early Hints\r\n" + fields(60) + b"\r\n" + head(fields(60))), "more than 100"),
    ],
    ids=["fields", "bytes-at-once", "bytes-in-pieces", "one-huge-field", "endless-field", "interim-heads-count"],
)
async def test_a_head_over_a_cap_is_a_protocol_error_at_once(
    fast: FastHTTPTransport, upstream: Callable[[Writer], Awaitable[str]], write: Writer, what: str
) -> None:
    url = await upstream(write)
    started = time.monotonic()
    with pytest.raises(UpstreamProtocolError) as caught:
        await get(fast, url)
    assert time.monotonic() - started < 5  # the cap ended it, not first_byte
    err = caught.value
    assert (err.status, err.code) == (502, "upstream_protocol_error")
    assert what in err.message
    assert "X-F" not in err.message and "bbbb" not in err.message  # the head is not echoed


async def test_after_a_refused_head_the_pool_serves_again(
    fast: FastHTTPTransport, upstream: Callable[[Writer], Awaitable[str]]
) -> None:
    bad = await upstream(send_all(head(fields(200))))
    good = await upstream(send_all(head(b"")))
    with pytest.raises(UpstreamProtocolError):
        await get(fast, bad)
    assert await get(fast, good) == b"ok"


@pytest.mark.parametrize(
    ("client", "write"),
    [
        ("aiohttp", send_all(head(fields(129)))),  # max_headers=128
        ("aiohttp", send_all(head(b"X-Big: " + b"b" * 8200 + b"\r\n"))),  # max_field_size=8190
        # h11 checks an incomplete head against 100 KiB after each of httpcore's 64 KiB reads
        ("httpx", send_all(head(b"X-Big: " + b"b" * 200_000 + b"\r\n"), step=8192)),
        ("httpx", endless_field()),
    ],
    ids=["aiohttp-fields", "aiohttp-field-size", "httpx-head-size", "httpx-endless-field"],
)
async def test_the_other_clients_bound_a_head_too(
    upstream: Callable[[Writer], Awaitable[str]], client: str, write: Writer
) -> None:
    t: AiohttpTransport | HttpxTransport = (
        AiohttpTransport("up", TIMEOUTS, 4) if client == "aiohttp" else HttpxTransport("up", TIMEOUTS, 4)
    )
    url = await upstream(write)
    started = time.monotonic()
    try:
        with pytest.raises(UpstreamError):
            await get(t, url)
    finally:
        await t.close()
    assert time.monotonic() - started < 5
