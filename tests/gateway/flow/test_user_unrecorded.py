"""``user`` on a server without an end-user field: honoured by the audit line, refused by name without it."""

from __future__ import annotations

import aiohttp
import pytest

from tests.fakes import FakeUpstream
from tests.gateway.flow.conftest import Make, body, error_of, post

CONFIG = """
server: {host: 127.0.0.1, port: 0, audit_log: $AUDIT}
backends:
  - {name: o, type: ollama, base_url: '$up0', timeout: $t}
  - {name: a, type: openai, base_url: '$up1', timeout: $t}
models:
  - {name: native, routes: [{backend: o, model: llama}]}
  - {name: both, routes: [{backend: o, model: llama}, {backend: a, model: up-a}]}
"""


def config(audit: bool) -> str:
    return CONFIG.replace("$AUDIT", "true" if audit else "false")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_audit_log_off_refuses_user_on_a_native_backend_by_name(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession, path: str
) -> None:
    gw = await make(config(audit=False))
    payload = body("native", user="u-1")
    if path.endswith("chat/completions"):
        payload = {"model": "native", "messages": [{"role": "user", "content": "hi"}], "user": "u-1"}
    async with session.post(f"{gw.url}{path}", json=payload) as resp:
        status, raw = resp.status, await resp.read()
    assert status == 400
    error = error_of(raw)
    assert error["param"] == "user" and error["code"] == "unsupported_parameter"
    assert "audit_log" in error["message"] and "'o'" in error["message"]
    assert not upstreams[0].requests  # refused before anything was sent


async def test_audit_log_off_user_goes_to_the_route_that_forwards_it(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(config(audit=False))
    status, _, raw = await post(session, gw, body("both", user="u-2"))
    assert status == 200, raw
    assert not upstreams[0].requests and upstreams[1].requests[-1].body["user"] == "u-2"


async def test_audit_log_on_user_is_served_by_the_native_backend(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(config(audit=True))
    status, _, raw = await post(session, gw, body("native", user="u-3"))
    assert not _refused_user(status, raw)  # sent on (the fake has no Ollama API; tests/e2e checks the audit line)


async def test_no_user_is_not_refused(
    make: Make, upstreams: list[FakeUpstream], session: aiohttp.ClientSession
) -> None:
    gw = await make(config(audit=False))
    status, _, raw = await post(session, gw, body("native"))
    assert not _refused_user(status, raw)


def _refused_user(status: int, raw: bytes) -> bool:
    return status == 400 and error_of(raw)["param"] == "user"
