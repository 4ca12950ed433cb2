"""Privacy: no API key ever reaches a span (scanned in the bytes the receiver got); prompts, completions and
tool arguments only with ``capture_content``. The audit line names the request's trace."""

from __future__ import annotations

import logging

import aiohttp
import orjson
import pytest

from tests.conftest import eventually
from tests.fakes import FakeUpstream
from tests.gateway.tracing.conftest import Make
from tests.gateway.tracing.receiver import HttpReceiver

CLIENT_KEY = "sk-client-" + "c0ffee" * 6
UPSTREAM_KEY = "sk-upstream-" + "beef" * 8
PROMPT = "the secret plan is PINEAPPLE-4417"
TOOL_ARGS = '{"city": "ZANZIBAR-9931"}'
CONFIG = """
server: {host: 127.0.0.1, port: 0, audit_log: true}
telemetry: {otlp_endpoint: '$otlp', capture_content: $CAPTURE, headers: {x-collector-key: collector-secret-55}}
auth:
  keys:
    - {name: team-a, key: '$KEY'}
backends:
  - {name: up, type: openai, base_url: '$up0', api_key: '$UPKEY', timeout: $t}
models:
  - {name: m, routes: [{backend: up, model: up-m}]}
"""


def _config(capture: bool) -> str:
    return (
        CONFIG.replace("$CAPTURE", "true" if capture else "false")
        .replace("$KEY", CLIENT_KEY)
        .replace("$UPKEY", UPSTREAM_KEY)
    )


async def _traffic(session: aiohttp.ClientSession, url: str) -> None:
    auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
    chat = {
        "model": "m",
        "messages": [
            {"role": "user", "content": PROMPT},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "where", "arguments": TOOL_ARGS}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "max_tokens": 3,
    }
    async with session.post(f"{url}/v1/chat/completions", json=chat, headers=auth) as resp:
        assert resp.status == 200, await resp.text()
    async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT}, headers=auth) as resp:
        assert resp.status == 200
    wrong = {"Authorization": f"Bearer {CLIENT_KEY}x"}  # a refused key is not recorded either
    async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": PROMPT}, headers=wrong) as resp:
        assert resp.status == 401


@pytest.mark.parametrize("capture", [False, True])
async def test_no_key_ever_and_content_only_when_opted_in(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver, capture: bool
) -> None:
    gw = await make(_config(capture))
    async with aiohttp.ClientSession() as session:
        await _traffic(session, gw.url)
    await eventually(lambda: len(receiver.by_kind("server")) == 3 and len(receiver.by_kind("client")) == 2)
    wire = b"".join(receiver.raw)
    for secret in (CLIENT_KEY, CLIENT_KEY + "x", UPSTREAM_KEY):
        assert secret.encode() not in wire
    assert b"collector-secret-55" in wire  # the exporter's own header reached the collector (and only there)
    assert (PROMPT.encode() in wire) is capture
    assert (b"ZANZIBAR-9931" in wire) is capture
    assert (b"hello world" in wire) is capture  # the fake upstream's completion
    chat = next(s for s in receiver.by_kind("server") if s.attributes["gen_ai.operation.name"] == "chat")
    if capture:
        messages = orjson.loads(chat.attributes["gen_ai.input.messages"])
        assert messages[0] == {"role": "user", "parts": [{"type": "text", "content": PROMPT}]}
        assert messages[1]["parts"] == [{"type": "tool_call", "id": "c1", "name": "where", "arguments": TOOL_ARGS}]
        assert messages[2]["parts"][0]["type"] == "tool_call_response"
        output = orjson.loads(chat.attributes["gen_ai.output.messages"])
        assert output[0]["parts"] == [{"type": "text", "content": " hello world"}]
    else:
        assert not any(k.startswith(("gen_ai.input", "gen_ai.output")) for k in chat.attributes)
    refused = next(s for s in receiver.by_kind("server") if s.attributes["http.response.status_code"] == 401)
    assert refused.attributes["error.type"] == "invalid_api_key" and refused.status == 0  # a 4xx is no server error


async def test_audit_line_names_the_trace(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make(_config(False))
    incoming = "0af7651916cd43dd8448eb211c80319c"
    caplog.set_level(logging.INFO, logger="gateway.audit")
    audit = logging.getLogger("gateway.audit")
    audit.addHandler(caplog.handler)
    try:
        async with aiohttp.ClientSession() as session:
            headers = {"Authorization": f"Bearer {CLIENT_KEY}", "traceparent": f"00-{incoming}-b7ad6b7169203331-01"}
            async with session.post(
                f"{gw.url}/v1/completions", json={"model": "m", "prompt": "x"}, headers=headers
            ) as r:
                assert r.status == 200
    finally:
        audit.removeHandler(caplog.handler)
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.audit"]
    assert len(lines) == 1 and lines[0]["trace_id"] == incoming
    await eventually(lambda: len(receiver.by_kind("server")) == 1)
    assert lines[0]["span_id"] == receiver.by_kind("server")[0].span_id


async def test_a_streamed_answer_is_captured_whole(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver
) -> None:
    gw = await make(_config(True))
    async with aiohttp.ClientSession() as session:
        payload = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3, "stream": True}
        async with session.post(
            f"{gw.url}/v1/chat/completions", json=payload, headers={"Authorization": f"Bearer {CLIENT_KEY}"}
        ) as resp:
            assert resp.status == 200
            await resp.read()
    await eventually(lambda: len(receiver.by_kind("server")) == 1)
    (server,) = receiver.by_kind("server")
    output = orjson.loads(server.attributes["gen_ai.output.messages"])
    assert output == [
        {"role": "assistant", "parts": [{"type": "text", "content": " t0 t1 t2"}], "finish_reason": "length"}
    ]
