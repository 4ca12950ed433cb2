"""What aiohttp's HTTP parser refuses is answered in our envelope, never echoed, never a traceback
(issue 13 items 1 and 5): raw bytes on a socket, against the runner ``gateway serve`` uses, with
both of aiohttp's parsers (the C one in this process, the pure-Python one in a subprocess)."""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import MOCK_MODEL, free_port
from tests.gateway.security.conftest import KEY_A, MakeSecureGateway, auth_section
from tests.gateway.security.conftest import secure_gateway as secure_gateway  # the fixture, shared

ROOT = Path(__file__).resolve().parents[3]
BODY = orjson.dumps({"model": MOCK_MODEL, "prompt": "hi", "max_tokens": 2})
ENVELOPE_KEYS = {"message", "type", "param", "code"}

# A valid key followed by a byte the HTTP grammar forbids in a field value.
BAD_AUTH = [b"\x00", b"\r", b"\x0b"]


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


async def raw_exchange(url: str, request: bytes, within: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as is; read the answer until the server closes the connection."""
    reader, writer = await asyncio.open_connection(*_host_port(url))
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(within):
            raw = await reader.read()
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":  # not expected for error answers
        raise AssertionError(raw)
    return status, headers, body


def assert_envelope(status: int, headers: dict[str, str], body: bytes, expected: int) -> dict[str, Any]:
    assert status == expected, body
    assert headers["content-type"].startswith("application/json"), headers
    envelope = orjson.loads(body)
    assert set(envelope) == {"error"} and set(envelope["error"]) == ENVELOPE_KEYS
    error: dict[str, Any] = envelope["error"]
    return error


def post(headers: bytes = b"", body: bytes = BODY) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Type: application/json\r\n"
        + headers
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


@pytest.mark.parametrize("bad", BAD_AUTH, ids=["nul", "bare-cr", "vt"])
async def test_a_malformed_authorization_header_is_never_echoed_or_logged(
    secure_gateway: MakeSecureGateway, caplog: pytest.LogCaptureFixture, bad: bytes
) -> None:
    gw = await secure_gateway(auth_section())
    caplog.set_level(logging.DEBUG)
    request = post(b"Authorization: Bearer " + KEY_A.encode() + bad + b"\r\n")
    status, headers, body = await raw_exchange(gw.url, request)
    error = assert_envelope(status, headers, body, 400)
    assert error["type"] == "invalid_request_error"
    assert KEY_A.encode() not in body
    assert KEY_A not in caplog.text
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    refusals = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.INFO


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        (b"X-Pad: " + b"p" * 3000 + b"\r\n", "header_too_large"),
        (b"".join(b"X-H%d: v\r\n" % i for i in range(30)), "too_many_headers"),
        (b"Bad Header: x\r\n", None),
    ],
    ids=["header-too-large", "too-many-headers", "space-in-name"],
)
async def test_other_parser_refusals_are_envelopes(
    secure_gateway: MakeSecureGateway, caplog: pytest.LogCaptureFixture, headers: bytes, code: str | None
) -> None:
    gw = await secure_gateway(server="max_header_bytes: 2048\nmax_headers: 20")
    status, answer_headers, body = await raw_exchange(gw.url, post(headers))
    error = assert_envelope(status, answer_headers, body, 400)
    if code is not None:
        assert error["code"] == code
    assert b"ppp" not in body and b"X-H" not in body
    assert not [r for r in caplog.records if r.exc_info]


async def test_an_oversized_request_line_is_an_envelope(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(server="max_header_bytes: 2048")
    request = b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: gw\r\n\r\n"
    status, headers, body = await raw_exchange(gw.url, request)
    assert_envelope(status, headers, body, 400)
    assert b"aaaa" not in body


# --- Content-Encoding (item 5) ---------------------------------------------------------------


async def test_gzip_header_on_a_plain_body_is_a_400(
    secure_gateway: MakeSecureGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await secure_gateway()
    status, headers, body = await raw_exchange(gw.url, post(b"Content-Encoding: gzip\r\n"))
    error = assert_envelope(status, headers, body, 400)
    assert error["code"] == "invalid_content_encoding"
    assert "Content-Encoding" in error["message"]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.parametrize("coding", [b"compress", b"x-foo", b"gzip, identity"])
async def test_an_unknown_content_encoding_is_a_415(secure_gateway: MakeSecureGateway, coding: bytes) -> None:
    gw = await secure_gateway()
    status, headers, body = await raw_exchange(gw.url, post(b"Content-Encoding: " + coding + b"\r\n"))
    error = assert_envelope(status, headers, body, 415)
    assert error["code"] == "unsupported_content_encoding"


@pytest.mark.parametrize(
    ("coding", "encode"), [("gzip", gzip.compress), ("deflate", zlib.compress)], ids=["gzip", "deflate"]
)
async def test_compressed_bodies_are_served(secure_gateway: MakeSecureGateway, coding: str, encode: Any) -> None:
    gw = await secure_gateway()
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/v1/completions",
            data=encode(BODY),
            headers={"Content-Encoding": coding, "Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 200, await resp.text()


async def test_a_decompression_bomb_stops_at_max_body_bytes(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(server="max_body_bytes: 65536")
    bomb = gzip.compress(b'{"model": "' + b"a" * 50_000_000 + b'"}')  # 50 MB inflated, ~50 KB sent
    assert len(bomb) < 65536
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + "/v1/completions", data=bomb, headers={"Content-Encoding": "gzip"}) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["type"] == "invalid_request_error"


# --- the pure-Python parser, in a real `gateway serve` -----------------------------------------

CONFIG = """
server: {{host: 127.0.0.1, port: {port}}}
backends:
  - {{name: sim, type: mock}}
models:
  - {{name: m, routes: [{{backend: sim, model: m}}]}}
auth:
  keys:
    - {{name: team-a, key: {key}}}
"""


@pytest.mark.parametrize("parser", ["c", "python"])
async def test_both_parsers_in_gateway_serve(tmp_path: Path, parser: str) -> None:
    port = free_port()
    path = tmp_path / "gw.yaml"
    path.write_text(CONFIG.format(port=port, key=KEY_A))
    env = {**os.environ, "AIOHTTP_NO_EXTENSIONS": "1"} if parser == "python" else dict(os.environ)
    if parser == "c":
        env.pop("AIOHTTP_NO_EXTENSIONS", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(path), "--log-level", "DEBUG", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        async with aiohttp.ClientSession() as session:
            while True:
                assert proc.returncode is None, "gateway exited early"
                try:
                    async with session.get(url + "/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "gateway did not become healthy"
                await asyncio.sleep(0.05)
        for bad in BAD_AUTH:
            request = post(b"Authorization: Bearer " + KEY_A.encode() + bad + b"\r\n")
            status, headers, body = await raw_exchange(url, request)
            assert_envelope(status, headers, body, 400)
            assert KEY_A.encode() not in body
        gzip_header = b"Authorization: Bearer " + KEY_A.encode() + b"\r\nContent-Encoding: gzip\r\n"
        status, headers, body = await raw_exchange(url, post(gzip_header))
        assert assert_envelope(status, headers, body, 400)["code"] == "invalid_content_encoding"
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=10)
    assert proc.stderr is not None
    log = (await proc.stderr.read()).decode()
    assert KEY_A not in log
    assert "Traceback" not in log
    assert log.count("refused a malformed request") == len(BAD_AUTH)
