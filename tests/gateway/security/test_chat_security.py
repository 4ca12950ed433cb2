"""Auth, request caps, rate limits and the audit line cover ``/v1/chat/completions`` through the shared path."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import MOCK_MODEL, OPENAI_MODEL
from tests.gateway.security.conftest import AUTH_A, AUTH_B, MakeSecureGateway, auth_section

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x" * 400}]


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + CHAT, json=body, headers=headers or {}) as resp:
        return resp.status, orjson.loads(await resp.read())


async def test_key_model_globs_apply_to_chat(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES})
    assert status == 401, body
    status, body = await post(gw.url, {"model": OPENAI_MODEL, "messages": MESSAGES}, AUTH_B)  # team-b: mock-* only
    assert status == 403 and body["error"]["param"] == "model", body
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES}, AUTH_B)
    assert status == 200 and body["object"] == "chat.completion", body


async def test_max_tokens_cap_names_the_chat_field(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway("caps: {max_tokens: 50, n: 2}\n")
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES, "max_completion_tokens": 51})
    assert status == 400 and body["error"]["param"] == "max_completion_tokens", body
    assert body["error"]["code"] == "cap_exceeded"
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES, "max_tokens": 51})
    assert status == 400 and body["error"]["param"] == "max_tokens", body
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES, "max_tokens": 5, "n": 3})
    assert status == 400 and body["error"]["param"] == "n", body
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES, "max_completion_tokens": 50})
    assert status == 200, body


async def test_a_chat_request_without_max_tokens_is_sent_with_the_cap(secure_gateway: MakeSecureGateway) -> None:
    """The SDKs and LangChain send no max tokens: the cap becomes the request's limit (on_missing: apply,
    the default), under the name the backend takes; the client's own value is never raised to it."""
    gw = await secure_gateway("caps: {max_tokens: 50}\n")
    status, body = await post(gw.url, {"model": OPENAI_MODEL, "messages": MESSAGES})
    assert status == 200, body
    status, body = await post(gw.url, {"model": OPENAI_MODEL, "messages": MESSAGES, "max_tokens": 7})
    assert status == 200, body
    sent = [seen.body for seen in gw.upstream.requests]
    assert [(b.get("max_completion_tokens"), b.get("max_tokens")) for b in sent] == [(50, None), (7, None)]


async def test_on_missing_refuse_asks_for_a_bound(secure_gateway: MakeSecureGateway) -> None:
    """unset is unbounded on chat (the reply may run to the context length): refuse asks for a bound."""
    gw = await secure_gateway("caps: {max_tokens: 50, on_missing: refuse}\n")
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES})
    assert status == 400 and body["error"]["param"] == "max_completion_tokens", body
    assert "unset" in body["error"]["message"]
    assert body["error"]["message"].endswith("; set it to at most 50."), body  # one sentence, with the bound
    # A key may choose otherwise than the deployment: its on_missing wins.
    gw = await secure_gateway(
        auth_section(a="caps: {on_missing: apply}") + "caps: {max_tokens: 50, on_missing: refuse}\n"
    )
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES}, AUTH_A)
    assert status == 200, body
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES}, AUTH_B)
    assert status == 400 and body["error"]["code"] == "cap_exceeded", body


async def test_tpm_reserves_the_messages_estimate_and_settles_from_usage(secure_gateway: MakeSecureGateway) -> None:
    # 400 characters of user text ~ 100 tokens: with max_tokens 100, one request needs ~200 of a 150 TPM budget.
    gw = await secure_gateway(auth_section(a="tpm: 150"))
    status, body = await post(gw.url, {"model": MOCK_MODEL, "messages": MESSAGES, "max_tokens": 100}, AUTH_A)
    assert status == 429 and body["error"]["param"] == "max_tokens", body
    assert "Request too large" in body["error"]["message"]
    # a small request goes through; its usage (not its reservation) is what the key spent
    status, body = await post(
        gw.url, {"model": MOCK_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}, AUTH_A
    )
    assert status == 200, body
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    used = body["usage"]["total_tokens"]
    assert f'gateway_key_tokens_total{{key="team-a",kind="prompt"}} {float(body["usage"]["prompt_tokens"])}' in text
    assert used < 150


@pytest.mark.parametrize("stream", [False, True])
async def test_audit_line_says_chat(
    secure_gateway: MakeSecureGateway, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    gw = await secure_gateway(server="audit_log: true")
    logger = logging.getLogger("gateway.audit")
    logger.addHandler(caplog.handler)
    try:
        async with aiohttp.ClientSession() as s:
            body = {"model": MOCK_MODEL, "messages": MESSAGES, "max_tokens": 4, "stream": stream}
            async with s.post(gw.url + CHAT, json=body) as resp:
                assert resp.status == 200
                await resp.read()
    finally:
        logger.removeHandler(caplog.handler)
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.audit"]
    assert lines and lines[-1]["endpoint"] == "chat" and lines[-1]["model"] == MOCK_MODEL
    assert lines[-1]["completion_tokens"] == 4
