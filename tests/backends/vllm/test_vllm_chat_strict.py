"""A function tool's ``strict: true`` reaches only vLLM servers that enforce it (0.24.0 on).

Earlier servers ignore it with HTTP 200 (0.6.5-0.23: arguments come back unconstrained) or
answer 400 extra_forbidden (0.6.0-0.6.4), so the table refuses it by name (``param: tools``),
and while the version is unknown, as for the other forms a server would drop silently.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from backends.vllm.capabilities import vllm_chat_capabilities
from backends.vllm.versions import CHAT_BOUNDARIES, VLLMChatFeatures, parse_version
from gateway.app import create_app
from gateway.configfile import parse_config
from schemas.chat import ChatCompletionRequest
from tests.conftest import serve_app
from tests.e2e.chat_upstreams import GoldenChatUpstream

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}


def tool(strict: bool | None, name: str = "get_weather") -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": PARAMS}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def request(*tools: dict[str, Any], **fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": list(tools), **fields}
    return ChatCompletionRequest.model_validate(body)


def table(version: str | None, parser: str | None = "hermes") -> Any:
    return vllm_chat_capabilities(VLLMChatFeatures.of(parse_version(version) if version else None, parser))


def test_boundary_is_0_24_0() -> None:
    assert str(CHAT_BOUNDARIES["tools_strict"]) == "0.24.0"


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ("0.6.3", True),  # extra=forbid: the server itself would answer 400
        ("0.6.5", True),  # unknown keys ignored from here: a silent drop
        ("0.14.0", True),
        ("0.23.0", True),  # the structural-tag path exists, but nothing reads strict: true
        ("0.24.0", False),  # PR #45003 / #45600: strict tools constrain the arguments
        ("0.25.1", False),
        ("0.32.0", False),
        (None, True),  # unknown version: never fail open
    ],
)
def test_strict_tool_per_version(version: str | None, refused: bool) -> None:
    t = table(version)
    refusal = t.first_refusal(request(tool(True)))
    if not refused:
        assert refusal is None
        return
    assert refusal is not None and refusal.param == "tools" and refusal.key == "tools=strict"
    assert refusal.why is not None
    assert (version in refusal.why) if version else ("unknown" in refusal.why)


@pytest.mark.parametrize("version", ["0.6.5", "0.23.0", "0.32.0", None])
@pytest.mark.parametrize("strict", [None, False])
def test_non_strict_tool_is_never_refused_for_strictness(version: str | None, strict: bool | None) -> None:
    refusal = table(version).first_refusal(request(tool(strict)))
    assert refusal is None or refusal.key != "tools=strict"


def test_one_strict_tool_among_several_is_enough() -> None:
    refusal = table("0.23.0").first_refusal(request(tool(False), tool(True, "get_time")))
    assert refusal is not None and refusal.key == "tools=strict"


def test_a_tool_choice_refusal_still_comes_first() -> None:
    """On 0.6.3 without a parser ``auto`` is the first thing refused, as before strict had a form."""
    refusal = table("0.6.3", None).first_refusal(request(tool(True), tool_choice="auto"))
    assert refusal is not None and refusal.param == "tool_choice"


OLD = "0.23.0"


@pytest.fixture
async def old_gateway() -> AsyncIterator[tuple[str, GoldenChatUpstream]]:
    """A gateway in front of one vLLM pinned at 0.23.0 (its ``/version`` agrees)."""
    upstream = GoldenChatUpstream("vllm", OLD)
    await upstream.start()
    config = (
        "server: {host: 127.0.0.1, port: 0}\nbackends:\n"
        f"  - {{name: b-old, type: vllm, base_url: {upstream.base_url}, version: '{OLD}', tool_parser: hermes}}\n"
        "models:\n  - {name: chat-old, routes: [{backend: b-old, model: up-vllm}]}\n"
    )
    runner = None
    try:
        runner, url = await serve_app(create_app(parse_config(config, "<strict test>", env={})))
        yield url, upstream
    finally:
        if runner is not None:
            await runner.cleanup()
        await upstream.stop()


async def test_gateway_refuses_a_strict_tool_to_an_old_vllm(old_gateway: tuple[str, GoldenChatUpstream]) -> None:
    url, upstream = old_gateway
    body: dict[str, Any] = {"model": "chat-old", "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json={**body, "tools": [tool(True)]}) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
        assert error["param"] == "tools"
        assert error["code"] == "unsupported_parameter"
        assert "strict" in error["message"] and OLD in error["message"] and "0.24.0" in error["message"]
        assert upstream.requests == []  # nothing went upstream
        async with session.post(f"{url}/v1/chat/completions", json={**body, "tools": [tool(None)]}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["object"] == "chat.completion"
    (sent,) = upstream.requests
    assert sent["tools"] == [tool(None)]
