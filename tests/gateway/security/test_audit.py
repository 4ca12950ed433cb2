"""The optional audit log: one JSON line per completion request, only when ``server.audit_log`` is on."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from gateway.security.audit import USER_MAX, audit_user
from tests.conftest import MOCK_MODEL, OPENAI_MODEL
from tests.fakes import Behaviour
from tests.gateway.security.conftest import AUTH_A, AUTH_B, KEY_A, Lines, MakeSecureGateway, auth_section


async def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
            await resp.read()
            return resp.status


async def test_off_by_default(secure_gateway: MakeSecureGateway, audit_lines: Lines) -> None:
    gw = await secure_gateway(auth_section())
    assert await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi"}, AUTH_A) == 200
    assert audit_lines.records == []


async def test_one_json_line_per_request(secure_gateway: MakeSecureGateway, audit_lines: Lines) -> None:
    gw = await secure_gateway(auth_section(), server="audit_log: true")
    assert await post(gw.url, {"model": OPENAI_MODEL, "prompt": "hi", "max_tokens": 3}, AUTH_A) == 200
    assert await post(gw.url, {"model": OPENAI_MODEL, "prompt": "hi"}, AUTH_B) == 403
    assert await post(gw.url, {"model": OPENAI_MODEL, "prompt": "hi"}, {}) == 401
    stream = {"model": OPENAI_MODEL, "prompt": "hi", "stream": True, "max_tokens": 5}
    gw.upstream.script.append(Behaviour(kind="cut", events=2))
    assert await post(gw.url, stream, AUTH_A) == 200  # cut after 2 events: HTTP 200, counted as 502
    ok, forbidden, unauthenticated, cut = audit_lines.records
    assert ok["event"] == "completion"
    assert ok["key"] == "team-a" and ok["model"] == OPENAI_MODEL and ok["backend"] == "up-openai"
    assert ok["status"] == 200 and ok["prompt_tokens"] == 3 and ok["completion_tokens"] == 2
    assert isinstance(ok["latency_ms"], float) and ok["request_id"].startswith("req-")
    assert forbidden["key"] == "team-b" and forbidden["status"] == 403 and forbidden["backend"] is None
    assert unauthenticated["key"] is None and unauthenticated["status"] == 401
    assert cut["status"] == 502 and cut["backend"] == "up-openai"
    assert all(KEY_A not in orjson.dumps(r).decode() for r in audit_lines.records)


async def test_audit_without_auth(secure_gateway: MakeSecureGateway, audit_lines: Lines) -> None:
    gw = await secure_gateway(server="audit_log: true")
    assert await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi"}, {}) == 200
    [line] = audit_lines.records
    assert line["key"] is None and line["model"] == MOCK_MODEL and line["backend"] == "sim"


async def test_user_is_recorded_bounded_and_escaped_never_a_label(
    secure_gateway: MakeSecureGateway, audit_lines: Lines
) -> None:
    gw = await secure_gateway(server="audit_log: true")
    forged = 'u-1\n{"event":"completion","key":"admin"}\x1b[2J\x85\u2028'
    assert await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi", "user": forged}, {}) == 200
    assert await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi", "user": "x" * 5000}, {}) == 200
    assert await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi"}, {}) == 200
    escaped, long, unset = audit_lines.records
    assert escaped["user"] == 'u-1\\u000a{"event":"completion","key":"admin"}\\u001b[2J\\u0085\\u2028'
    assert long["user"] == "x" * USER_MAX
    assert unset["user"] is None
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/metrics") as resp:
            metrics = await resp.text()
    assert "u-1" not in metrics and "x" * 64 not in metrics


def test_audit_user_escapes_every_control_character() -> None:
    controls = "".join(map(chr, [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]))
    written = audit_user("a" + controls + "é€😀")
    assert written is not None and written.isprintable() and written.endswith("é€😀")
    assert written.count("\\u") == len(controls)
    assert audit_user(None) is None
