"""Hardening against hostile clients: header size and count, slow headers and bodies (slowloris),
body size, and upstream URLs that only the config can set."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest

from tests.conftest import MOCK_MODEL
from tests.gateway.security.conftest import MakeSecureGateway

BODY = {"model": MOCK_MODEL, "prompt": "hello", "max_tokens": 2}


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


async def _post(url: str, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=BODY, headers=headers) as resp:
            await resp.read()
            return resp.status


async def test_header_size_limit_is_configurable(secure_gateway: MakeSecureGateway) -> None:
    small = await secure_gateway(server="max_header_bytes: 2048")
    default = await secure_gateway()
    headers = {"x-padding": "p" * 3000}
    assert await _post(small.url, headers) == 400
    assert await _post(default.url, headers) == 200
    assert await _post(small.url, {"x-padding": "p" * 1000}) == 200


async def test_header_count_limit(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(server="max_headers: 20")
    assert await _post(gw.url, {f"x-h{i}": "v" for i in range(30)}) == 400
    assert await _post(gw.url, {f"x-h{i}": "v" for i in range(5)}) == 200


# The server's header and body timeouts are aiohttp's own timers: no clock can be injected,
# so these tests keep timing-only sanity bounds, generous ones: a closed connection must come
# well before what the client alone would take (a trickle of 20 s, the 60 s default).
CLOSED_WELL_BEFORE = 10.0


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> float:
    """Seconds until the server closed the connection (EOF), failing after ``seconds``."""
    started = time.monotonic()
    async with asyncio.timeout(seconds):
        while await reader.read(65536):
            pass
    return time.monotonic() - started


async def test_slow_headers_are_cut(secure_gateway: MakeSecureGateway) -> None:
    """Slowloris: a head trickled a byte at a time never completes; the connection is closed
    client_header_timeout after it opened, although bytes keep arriving."""
    gw = await secure_gateway(server="client_header_timeout: 0.6")
    reader, writer = await asyncio.open_connection(*_host_port(gw.url))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")

    async def trickle() -> None:
        for _ in range(400):  # 20 s of bytes keep arriving unless the server cuts first
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)

    task = asyncio.create_task(trickle())
    try:
        took = await _closed_within(reader, 20)
    finally:
        task.cancel()
        writer.close()
    assert took < CLOSED_WELL_BEFORE


async def test_idle_connection_is_closed(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(server="client_header_timeout: 0.4")
    reader, writer = await asyncio.open_connection(*_host_port(gw.url))
    try:
        assert await _closed_within(reader, 20) < CLOSED_WELL_BEFORE
    finally:
        writer.close()


async def test_without_the_timeout_a_slow_head_is_kept(secure_gateway: MakeSecureGateway) -> None:
    """The control for the two tests above: with the default (60 s) the same client stays connected."""
    gw = await secure_gateway()
    reader, writer = await asyncio.open_connection(*_host_port(gw.url))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    try:
        with pytest.raises(TimeoutError):
            await _closed_within(reader, 1.0)
    finally:
        writer.close()


async def test_slow_body_gets_408_and_the_connection_closes(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(server="client_body_timeout: 0.5")
    reader, writer = await asyncio.open_connection(*_host_port(gw.url))
    body = orjson.dumps(BODY)
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body[:5])  # then nothing more
    await writer.drain()
    started = time.monotonic()
    try:
        async with asyncio.timeout(20):
            answer = await reader.read()  # until EOF: the server closes after answering
    finally:
        writer.close()
    assert time.monotonic() - started < CLOSED_WELL_BEFORE
    status_line, _, rest = answer.partition(b"\r\n")
    assert b" 408 " in status_line
    envelope = orjson.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert envelope["error"]["code"] == "request_timeout"


async def test_oversized_body_is_413(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(server="max_body_bytes: 1024")
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + "/v1/completions", json={**BODY, "prompt": "x" * 2000}) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("field", ["base_url", "api_base", "url", "api_key"])
async def test_upstream_url_and_credentials_come_from_config_only(
    secure_gateway: MakeSecureGateway, field: str
) -> None:
    """A client cannot point the gateway elsewhere or swap its credentials: such fields are refused."""
    gw = await secure_gateway()
    async with aiohttp.ClientSession() as session:
        body = {**BODY, field: "http://169.254.169.254/latest"}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert error["code"] == "unknown_parameter" and error["param"] == field
    assert gw.upstream.requests == []
