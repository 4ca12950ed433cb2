"""Request caps, per deployment and per key: each refusal is a 400 naming the field and the cap,
decided before any upstream is called."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import MOCK_MODEL, OPENAI_MODEL
from tests.gateway.security.conftest import AUTH_A, AUTH_B, MakeSecureGateway, auth_section

DEPLOYMENT_CAPS = "caps: {n: 4, best_of: 4, max_tokens: 64, prompts: 3, total_tokens: 200}\n"


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=body, headers=headers or {}) as resp:
            return resp.status, orjson.loads(await resp.read())


@pytest.mark.parametrize(
    ("extra", "param", "cap", "value"),
    [
        ({"n": 5}, "n", "n", "'n' is 5"),
        ({"n": 2, "best_of": 5}, "best_of", "best_of", "'best_of' is 5"),
        ({"max_tokens": 65}, "max_tokens", "max_tokens", "'max_tokens' is 65"),
        ({"prompt": ["a", "b", "c", "d"]}, "prompt", "prompts", "'prompt' holds 4 prompts"),
        ({"max_tokens": 50, "n": 4}, "max_tokens", "total_tokens", "may use up to 201 tokens"),
    ],
    ids=["n", "best_of", "max_tokens", "prompts", "total_tokens"],
)
async def test_deployment_caps(
    secure_gateway: MakeSecureGateway, extra: dict[str, Any], param: str, cap: str, value: str
) -> None:
    gw = await secure_gateway(DEPLOYMENT_CAPS)
    body = {"model": OPENAI_MODEL, "prompt": "hi", **extra}
    status, answer = await post(gw.url, body)
    assert status == 400, answer
    error = answer["error"]
    assert error["code"] == "cap_exceeded"
    assert error["param"] == param
    assert value in error["message"]
    assert f"the {cap} cap of" in error["message"]
    assert "this deployment" in error["message"]
    assert gw.upstream.requests == []


async def test_within_caps_passes(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(DEPLOYMENT_CAPS)
    status, _ = await post(gw.url, {"model": OPENAI_MODEL, "prompt": ["a", "b"], "n": 2, "max_tokens": 40})
    assert status == 200  # 2 + 40 x 2 x 2 = 162 <= 200


async def test_unset_max_tokens_counts_as_16(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway("caps: {max_tokens: 8, on_missing: refuse}\n")
    status, answer = await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi"})
    assert status == 400
    assert "'max_tokens' is 16 (the default when unset)" in answer["error"]["message"]


@pytest.mark.parametrize(("cap", "sent"), [(8, 8), (64, None)], ids=["under-16", "over-16"])
async def test_unset_max_tokens_is_sent_as_the_cap(
    secure_gateway: MakeSecureGateway, cap: int, sent: int | None
) -> None:
    """on_missing: apply (the default): the cap is the limit where OpenAI's default of 16 would pass it."""
    gw = await secure_gateway(f"caps: {{max_tokens: {cap}}}\n")
    status, answer = await post(gw.url, {"model": OPENAI_MODEL, "prompt": "hi"})
    assert status == 200, answer
    [seen] = gw.upstream.requests
    assert seen.body.get("max_tokens") == sent


async def test_key_caps_tighten_deployment_caps(secure_gateway: MakeSecureGateway) -> None:
    """The lower cap wins, and the message says whose cap it is."""
    gw = await secure_gateway(auth_section(b="caps: {n: 2, max_tokens: 1000}") + "caps: {n: 4, max_tokens: 32}\n")
    status, answer = await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi", "n": 3}, AUTH_B)
    assert status == 400
    assert answer["error"]["param"] == "n"
    assert "the n cap of 2 set for key 'team-b'" in answer["error"]["message"]
    status, _ = await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi", "n": 3}, AUTH_A)
    assert status == 200  # team-a only has the deployment's n cap of 4
    status, answer = await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi", "max_tokens": 100}, AUTH_B)
    assert status == 400
    assert "the max_tokens cap of 32 set for this deployment" in answer["error"]["message"]


async def test_cap_rejections_are_counted_per_key(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section() + "caps: {n: 1}\n")
    await post(gw.url, {"model": MOCK_MODEL, "prompt": "hi", "n": 2}, AUTH_A)
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    assert 'gateway_key_rejections_total{key="team-a",reason="cap"} 1.0' in text


@pytest.mark.parametrize(
    "prompt",
    [["a"] * 9, list(range(9)), [[1, 2], list(range(9))]],
    ids=["batch", "token-ids", "inner-token-ids"],
)
async def test_prompt_array_limit(secure_gateway: MakeSecureGateway, prompt: list[Any]) -> None:
    """server.max_prompt_array bounds every array in ``prompt``, with or without caps or auth."""
    gw = await secure_gateway(server="max_prompt_array: 8")
    status, answer = await post(gw.url, {"model": MOCK_MODEL, "prompt": prompt})
    assert status == 400, answer
    assert answer["error"]["param"] == "prompt"
    assert "at most 8" in answer["error"]["message"]
    status, _ = await post(gw.url, {"model": MOCK_MODEL, "prompt": prompt[:8] if len(prompt) > 2 else [[1, 2]]})
    assert status == 200


async def test_prompt_embeds_are_bounded_like_prompts(secure_gateway: MakeSecureGateway) -> None:
    """Each tensor of ``prompt_embeds`` is a prompt: bounded by server.max_prompt_array, counted by the prompts cap."""
    gw = await secure_gateway(DEPLOYMENT_CAPS, server="max_prompt_array: 8")
    status, answer = await post(gw.url, {"model": OPENAI_MODEL, "prompt_embeds": ["UEsDBA=="] * 9})
    assert status == 400 and answer["error"]["param"] == "prompt_embeds", answer
    assert answer["error"]["code"] == "cap_exceeded" and "at most 8" in answer["error"]["message"]
    status, answer = await post(gw.url, {"model": OPENAI_MODEL, "prompt": "hi", "prompt_embeds": ["UEsDBA=="] * 3})
    assert status == 400 and "'prompt' holds 4 prompts" in answer["error"]["message"], answer
    assert gw.upstream.requests == []
