"""``GET``/``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items`` through the
front door, with the openai SDK as clients use it (``retrieve``, ``delete``, ``input_items.list``
with auto-pagination): each key sees its own responses only, another key's are the 404 an unknown
id gets, model permissions hold, query parameters are checked by name, and every answer counts."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import openai
import pytest

from gateway.conversations import input_items, new_id
from gateway.responses_state import FinishedTurn
from gateway.state import STATE
from tests.conftest import MOCK_MODEL, OPENAI_MODEL, RunningGateway
from tests.gateway.security.conftest import AUTH_A, KEY_A, KEY_B, MakeSecureGateway, auth_section


def _response(rid: str, model: str) -> dict[str, Any]:
    return {
        "id": rid, "object": "response", "created_at": 1764547200, "status": "completed", "model": model,
        "output": [{"type": "message", "id": new_id("msg"), "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]}],
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "store": True,
        "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    }  # fmt: skip


async def _seed(gw: RunningGateway, tenant: str, model: str, inputs: Any) -> str:
    rid = new_id("resp")
    await gw.app[STATE].responses_state.save(tenant, FinishedTurn(_response(rid, model), input_items(inputs), None))
    return rid


def _client(gw: RunningGateway, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=20)


@pytest.fixture
async def gw(secure_gateway: MakeSecureGateway) -> RunningGateway:
    return await secure_gateway(auth_section())


async def test_the_sdk_retrieves_lists_and_deletes_its_own_response(gw: RunningGateway) -> None:
    questions = [{"role": "user", "content": f"question {i}"} for i in range(7)]
    rid = await _seed(gw, "team-a", OPENAI_MODEL, questions)
    async with _client(gw, KEY_A) as client:
        got = await client.responses.retrieve(rid)
        assert got.id == rid and got.output_text == "Paris." and got.usage is not None
        page = await client.responses.input_items.list(rid, limit=3)
        assert [item.content[0].text for item in page.data] == ["question 6", "question 5", "question 4"]  # type: ignore[union-attr]
        assert page.has_more and page.first_id == page.data[0].id and page.last_id == page.data[-1].id
        every = [item.content[0].text async for item in client.responses.input_items.list(rid, limit=3)]  # type: ignore[union-attr]
        assert every == [f"question {i}" for i in reversed(range(7))]
        ascending = [
            item.content[0].text  # type: ignore[union-attr]
            async for item in client.responses.input_items.list(rid, limit=2, order="asc")
        ]
        assert ascending == [f"question {i}" for i in range(7)]
        assert await client.responses.delete(rid) is None
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(rid)
        with pytest.raises(openai.NotFoundError):
            await client.responses.delete(rid)


async def test_another_keys_response_is_the_404_of_an_id_that_never_existed(gw: RunningGateway) -> None:
    rid = await _seed(gw, "team-a", MOCK_MODEL, "secret plans")
    unknown = new_id("resp")
    async with aiohttp.ClientSession() as http:
        answers = []
        for wanted in (rid, unknown):
            for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/input_items")):
                async with http.request(
                    method, f"{gw.url}/v1/responses/{wanted}{path}", headers={"api-key": KEY_B}
                ) as resp:
                    body = await resp.json()
                    answers.append((resp.status, body["error"]["message"].replace(wanted, "ID"), body["error"]["code"]))
        assert answers[:3] == answers[3:] and {a[0] for a in answers} == {404}
        async with http.get(f"{gw.url}/v1/responses/{rid}", headers=AUTH_A) as resp:
            assert resp.status == 200  # the owner's response survived the other key's delete
        async with http.get(f"{gw.url}/v1/responses/{rid}") as resp:
            assert resp.status == 401


async def test_a_key_that_may_not_use_the_model_gets_403(gw: RunningGateway) -> None:
    rid = await _seed(gw, "team-b", OPENAI_MODEL, "hi")  # team-b may use mock-* only
    async with _client(gw, KEY_B) as client:
        with pytest.raises(openai.PermissionDeniedError):
            await client.responses.retrieve(rid)


@pytest.mark.parametrize(
    ("path", "query", "param", "code"),
    [
        ("/input_items", "limit=0", "limit", None),
        ("/input_items", "limit=101", "limit", None),
        ("/input_items", "order=sideways", "order", None),
        ("/input_items", "after=msg_nope", "after", None),
        ("/input_items", "cursor=1", "cursor", "unknown_parameter"),
        ("/input_items", "include[]=nonsense", "include", None),
        ("", "stream=true", "stream", "unsupported_parameter"),
        ("", "starting_after=3", "starting_after", "unsupported_parameter"),
        ("", "limit=3&limit=4", "limit", None),
    ],
)
async def test_query_parameters_are_checked_by_name(
    gw: RunningGateway, path: str, query: str, param: str, code: str | None
) -> None:
    rid = await _seed(gw, "team-a", MOCK_MODEL, "hi")
    url = f"{gw.url}/v1/responses/{rid}{path}?{query}"
    async with aiohttp.ClientSession() as http, http.get(url, headers=AUTH_A) as resp:
        body = await resp.json()
    assert resp.status == 400, body
    assert body["error"]["param"] == param and body["error"]["code"] == code


async def test_pages_before_and_after_a_cursor(gw: RunningGateway) -> None:
    rid = await _seed(gw, "team-a", MOCK_MODEL, [{"role": "user", "content": str(i)} for i in range(6)])
    async with _client(gw, KEY_A) as client:
        ids = [item.id async for item in client.responses.input_items.list(rid, order="asc")]
        before = await client.responses.input_items.list(rid, order="asc", limit=2, extra_query={"before": ids[4]})
        assert [i.id for i in before.data] == ids[2:4] and before.has_more
        between = await client.responses.input_items.list(
            rid, order="asc", after=ids[0], extra_query={"before": ids[3]}
        )
        assert [i.id for i in between.data] == ids[1:3] and not between.has_more
        included = await client.responses.input_items.list(rid, include=["message.input_image.image_url"])
        assert len(included.data) == 6


async def test_answers_count_by_operation_and_the_store_is_in_metrics(gw: RunningGateway) -> None:
    rid = await _seed(gw, "team-a", MOCK_MODEL, "hi")
    async with aiohttp.ClientSession() as http:
        for method, path in (("GET", ""), ("GET", "/input_items"), ("DELETE", ""), ("DELETE", "")):
            async with http.request(method, f"{gw.url}/v1/responses/{rid}{path}", headers=AUTH_A):
                pass
        async with http.get(f"{gw.url}/metrics") as resp:
            text = await resp.text()

    def value(series: str) -> float:
        found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
        assert found, series
        return float(found.group(1))

    assert value('gateway_stored_response_requests_total{operation="retrieve",status="200"}') == 1
    assert value('gateway_stored_response_requests_total{operation="input_items",status="200"}') == 1
    assert value('gateway_stored_response_requests_total{operation="delete",status="200"}') == 1
    assert value('gateway_stored_response_requests_total{operation="delete",status="404"}') == 1
    assert value('gateway_state_store_items{store="responses"}') == 0
    assert value('gateway_state_store_limit{bound="items",store="responses"}') == 10_000
    assert value('gateway_state_store_limit{bound="bytes",store="responses"}') == 256 * 1024 * 1024
