"""``/openapi.json`` never lists a model name the caller could not list with ``GET /v1/models``
(issue 13 item 6)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import MOCK_MODEL, OPENAI_MODEL, VLLM_MODEL
from tests.gateway.security.conftest import AUTH_A, AUTH_B, MakeSecureGateway, auth_section

ALL = {OPENAI_MODEL, VLLM_MODEL, MOCK_MODEL}


async def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[bytes, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/openapi.json", headers=headers) as resp:
            assert resp.status == 200
            return await resp.read(), await resp.json()


def examples(doc: dict[str, Any]) -> set[str]:
    model = doc["components"]["schemas"]["CompletionRequest"]["properties"]["model"]
    return set(model.get("examples", []))


@pytest.mark.parametrize(
    "headers", [None, {"Authorization": "Bearer sk-not-a-configured-key-0000"}], ids=["anonymous", "unknown-key"]
)
async def test_no_model_names_without_a_valid_key(secure_gateway: MakeSecureGateway, headers: Any) -> None:
    gw = await secure_gateway(auth_section())
    raw, doc = await fetch(gw.url, headers)
    assert examples(doc) == set()
    for name in ALL:
        assert name.encode() not in raw
    example = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["example"]
    assert example["model"] not in ALL


async def test_a_key_sees_its_own_models_as_in_v1_models(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    _, doc_a = await fetch(gw.url, AUTH_A)
    assert examples(doc_a) == ALL
    raw_b, doc_b = await fetch(gw.url, AUTH_B)  # team-b may use mock-* only
    assert examples(doc_b) == {MOCK_MODEL}
    assert OPENAI_MODEL.encode() not in raw_b and VLLM_MODEL.encode() not in raw_b
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/v1/models", headers=AUTH_B) as resp:
        listed = {card["id"] for card in (await resp.json())["data"]}
    assert examples(doc_b) == listed
