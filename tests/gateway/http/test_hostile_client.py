"""Black-box probes as a hostile client and a strict protocol reader, over raw sockets against the
runner ``gateway serve`` uses: what the other hostile suites (``test_front_door``,
``test_chat_hostile``, ``security/test_hardening``) do not cover.

- ``Expect: 100-continue`` is answered before the body is sent: a body announced too large gets
  its 413 instead of an invitation to send it, an expectation we do not know gets a 417, both in
  OpenAI's envelope (aiohttp's default answers 100 to anything and a plain-text 417).
- A 405 names the methods the path takes (``Allow``, RFC 9110 15.5.6).
- No response names the server software and its version.
- Pipelined requests on one connection are answered in order, none lost, on both endpoints.
- A refusal by the HTTP parser carries a request id, and the log line names it.
- A client that half-closes after its request is taken as gone (pinned: see the test).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from tests.conftest import MOCK_MODEL, OPENAI_MODEL, MakeGateway, RunningGateway, eventually
from tests.fakes import Behaviour

COMPLETION = orjson.dumps({"model": MOCK_MODEL, "prompt": "hi", "max_tokens": 2})
CHAT = orjson.dumps({"model": MOCK_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
PATHS = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT}
ENVELOPE_KEYS = {"message", "type", "param", "code"}
LIMIT = 4096  # max_body_bytes of the gateway under test


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


Answer = tuple[int, dict[str, str], bytes]


async def _read_answer(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 answer with a Content-Length body (interim 1xx answers are returned as such)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return status, headers, body


def _envelope(answer: Answer, status: int) -> dict[str, Any]:
    got, headers, body = answer
    assert got == status, answer
    assert headers["content-type"].startswith("application/json"), headers
    assert headers.get("x-request-id"), headers
    envelope = orjson.loads(body)
    assert set(envelope) == {"error"} and set(envelope["error"]) == ENVELOPE_KEYS, envelope
    error: dict[str, Any] = envelope["error"]
    return error


@pytest.fixture
async def small(make_gateway: MakeGateway) -> RunningGateway:
    return await make_gateway(server=f"max_body_bytes: {LIMIT}")


@pytest.mark.parametrize("path", list(PATHS))
async def test_expect_continue_with_a_body_over_the_limit_is_413_before_the_body(
    small: RunningGateway, path: str
) -> None:
    reader, writer = await asyncio.open_connection(*_host_port(small.url))
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Expect: 100-continue\r\nContent-Length: {LIMIT * 100}\r\n\r\n".encode()
        )  # and no body: the client waits for a 100 it must not get
        async with asyncio.timeout(5):
            answer = await _read_answer(reader)
            error = _envelope(answer, 413)
            assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]
            assert answer[1].get("connection") == "close"  # the uninvited body cannot be told from a next request
    finally:
        writer.close()


@pytest.mark.parametrize("path", list(PATHS))
async def test_expect_continue_within_the_limit_is_served(small: RunningGateway, path: str) -> None:
    reader, writer = await asyncio.open_connection(*_host_port(small.url))
    body = PATHS[path]
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        async with asyncio.timeout(5):
            assert (await _read_answer(reader))[0] == 100
            writer.write(body)
            status, _, answer = await _read_answer(reader)
        assert status == 200, answer
        assert orjson.loads(answer)["choices"]
    finally:
        writer.close()


@pytest.mark.parametrize(
    "target", ["POST /v1/chat/completions", "POST /v1/completions", "GET /health", "POST /nowhere", "GET /v1/models"]
)
async def test_an_unknown_expectation_is_a_417_envelope(small: RunningGateway, target: str) -> None:
    reader, writer = await asyncio.open_connection(*_host_port(small.url))
    try:
        writer.write(
            target.encode()
            + b" HTTP/1.1\r\nHost: gw\r\nExpect: 200-ok\r\nContent-Length: "
            + str(len(CHAT)).encode()
            + b"\r\n\r\n"
            + CHAT
        )
        async with asyncio.timeout(5):
            error = _envelope(await _read_answer(reader), 417)
        assert error["code"] == "expectation_failed"
        assert "200-ok" not in error["message"]  # nothing the client sent is echoed
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/completions", "POST"),
        ("PUT", "/v1/chat/completions", "POST"),
        ("OPTIONS", "/v1/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/health", "GET"),
    ],
)
async def test_405_names_the_allowed_methods(gateway: RunningGateway, method: str, path: str, allowed: str) -> None:
    reader, writer = await asyncio.open_connection(*_host_port(gateway.url))
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n".encode())
        async with asyncio.timeout(5):
            answer = await _read_answer(reader)
        error = _envelope(answer, 405)
        assert error["code"] == "method_not_allowed"
        assert allowed in {m.strip() for m in answer[1]["allow"].split(",")}, answer[1]
    finally:
        writer.close()


async def test_no_answer_names_the_server_software(gateway: RunningGateway) -> None:
    requests = [
        b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"GET /nowhere HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n" % len(COMPLETION) + COMPLETION,
        b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n",
        b"BROKEN\r\n\r\n",  # the parser's own refusal
    ]
    for request in requests:
        reader, writer = await asyncio.open_connection(*_host_port(gateway.url))
        try:
            writer.write(request)
            async with asyncio.timeout(5):
                status, headers, _ = await _read_answer(reader)
        finally:
            writer.close()
        server = headers.get("server", "")
        assert "python" not in server.lower() and "aiohttp" not in server.lower(), (status, headers)


async def test_pipelined_requests_are_answered_in_order_none_lost(gateway: RunningGateway) -> None:
    reader, writer = await asyncio.open_connection(*_host_port(gateway.url))
    order: list[tuple[str, str]] = []
    wire = b""
    for i in range(12):
        path = list(PATHS)[i % 2]
        rid = f"pipe-{i}"
        body = PATHS[path] if i % 3 else b"{broken"  # every third one is a 400: errors keep their place too
        wire += (
            f"POST {path} HTTP/1.1\r\nHost: gw\r\nx-request-id: {rid}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        order.append((rid, "text_completion" if path == "/v1/completions" else "chat.completion"))
    try:
        writer.write(wire)  # all at once: they wait in the server's buffer behind each other
        async with asyncio.timeout(10):
            answers = [await _read_answer(reader) for _ in order]
    finally:
        writer.close()
    for i, ((rid, kind), (status, headers, body)) in enumerate(zip(order, answers, strict=True)):
        assert headers["x-request-id"] == rid
        if i % 3:
            assert status == 200 and orjson.loads(body)["object"] == kind, body
        else:
            assert status == 400 and orjson.loads(body)["error"]["type"] == "invalid_request_error"


async def test_a_refusal_by_the_http_parser_carries_a_request_id_and_logs_it(
    gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    reader, writer = await asyncio.open_connection(*_host_port(gateway.url))
    try:
        two_lengths = b"Content-Length: 5\r\nContent-Length: 6\r\n"  # a smuggling attempt
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\n" + two_lengths + b"\r\nhello")
        async with asyncio.timeout(5):
            answer = await _read_answer(reader)
    finally:
        writer.close()
    _envelope(answer, 400)  # asserts the x-request-id too
    rid = answer[1]["x-request-id"]
    assert any(rid in record.getMessage() for record in caplog.records), caplog.text  # an operator can find it


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(PATHS))
async def test_a_client_that_half_closes_is_taken_as_gone(gateway: RunningGateway, path: str, stream: bool) -> None:
    """A FIN after the request cannot be told from a client that left (aiohttp closes on it), and a
    gateway that kept waiting on every FIN would let every abandoned request run its upstream to the
    end: the upstream is cancelled, as for a client that left (nginx answers 499 the same way)."""
    up = gateway.upstream
    up.script.append(Behaviour(kind="hold"))  # never released: only the client leaving ends it
    model = OPENAI_MODEL
    fields: dict[str, Any] = {"model": model, "max_tokens": 2, "stream": stream}
    fields.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})
    body = orjson.dumps(fields)
    reader, writer = await asyncio.open_connection(*_host_port(gateway.url))
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        await eventually(lambda: up.active == 1)
        writer.write_eof()
        await eventually(lambda: up.cancelled == 1)
        assert up.active == 0
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed without an answer
    finally:
        writer.close()
