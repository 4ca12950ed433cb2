"""Stored Responses turns are private to the key that made them (gateway.flow.responses_turns: the
tenant is the caller's key name): another key continuing from the id gets the same 404 as an id that
never existed, and the owner continues normally."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.conftest import MOCK_MODEL
from tests.gateway.security.conftest import KEY_A, KEY_B, MakeSecureGateway, auth_section


async def _post(url: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/responses", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_another_key_cannot_continue_a_conversation(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    status, first = await _post(gw.url, KEY_A, {"model": MOCK_MODEL, "input": "remember this"})
    assert status == 200, first
    follow = {"model": MOCK_MODEL, "input": "and then?", "previous_response_id": first["id"]}
    status, other = await _post(gw.url, KEY_B, follow)
    status_unknown, unknown = await _post(gw.url, KEY_B, {**follow, "previous_response_id": "resp_" + "0" * 48})
    assert status == status_unknown == 404
    assert other["error"]["param"] == unknown["error"]["param"] == "previous_response_id"
    assert other["error"]["message"].replace(first["id"], "X") == unknown["error"]["message"].replace(
        "resp_" + "0" * 48, "X"
    )
    status, mine = await _post(gw.url, KEY_A, follow)
    assert status == 200 and mine["previous_response_id"] == first["id"]


async def test_store_false_keeps_nothing(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    status, first = await _post(gw.url, KEY_A, {"model": MOCK_MODEL, "input": "forget this", "store": False})
    assert status == 200 and first["store"] is False
    status, again = await _post(gw.url, KEY_A, {"model": MOCK_MODEL, "input": "x", "previous_response_id": first["id"]})
    assert status == 404, again
