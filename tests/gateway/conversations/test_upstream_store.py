"""An ``openai`` backend's upstream keeps no copy of a Response unless the operator says so
(``backends[].upstream_store``): the body the simulated upstream sees says ``store: false`` whatever
the client set, the gateway's own store answers ``GET``/``DELETE`` and ``previous_response_id``,
earlier reasoning that only an upstream store could resolve is not sent (the simulated upstream
answers OpenAI's 404 for it), and what needs the upstream's state (``background``,
``conversation``) is refused by name. With ``upstream_store: true`` the client's ``store`` goes as set.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from backends.base import ResponsesCall
from backends.openai.capabilities import UPSTREAM_STATE_FIELDS
from backends.responses.native import native_payload
from schemas.responses import ResponsesRequest
from tests.conftest import OPENAI_MODEL, MakeGateway, RunningGateway
from tests.fakes import Behaviour

KEEPING = """  - name: up-keeping
    type: openai
    base_url: {url}
    api_key: sk-test-secret
    upstream_store: true
"""
KEEPING_MODEL = """  - name: gpt-keeping
    routes: [{backend: up-keeping, model: upstream-gpt}]
"""


async def post(gw: RunningGateway, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/v1/responses", json=body) as resp:
        return resp.status, await resp.json()


async def stored(gw: RunningGateway, response_id: str, method: str = "GET") -> int:
    async with aiohttp.ClientSession() as http, http.request(method, f"{gw.url}/v1/responses/{response_id}") as resp:
        return resp.status


@pytest.fixture
async def gw(make_gateway: MakeGateway, fake_upstream: Any) -> RunningGateway:
    return await make_gateway(extra_backends=KEEPING.format(url=fake_upstream.url), extra_models=KEEPING_MODEL)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_upstream_is_told_to_keep_nothing_and_the_gateway_keeps_the_turn(
    gw: RunningGateway, stream: bool
) -> None:
    body = {"model": OPENAI_MODEL, "input": "hi", "max_output_tokens": 4, "stream": stream}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/v1/responses", json=body) as resp:
        assert resp.status == 200
        raw = await resp.read()
    sent = gw.upstream.requests[-1]
    assert sent.path.endswith("/responses") and sent.body["store"] is False  # the client left it unset
    response_id = raw.split(b'"id":"resp_', 1)[1].split(b'"', 1)[0].decode()
    assert await stored(gw, f"resp_{response_id}") == 200  # the gateway's copy answers GET
    assert await stored(gw, f"resp_{response_id}", "DELETE") == 200
    assert await stored(gw, f"resp_{response_id}") == 404  # and the delete leaves no copy anywhere


async def test_a_client_store_false_keeps_nothing_in_the_gateway_either(gw: RunningGateway) -> None:
    status, answer = await post(gw, {"model": OPENAI_MODEL, "input": "hi", "store": False})
    assert status == 200 and gw.upstream.requests[-1].body["store"] is False
    assert await stored(gw, answer["id"]) == 404


@pytest.mark.parametrize("field", sorted(UPSTREAM_STATE_FIELDS))
async def test_what_needs_the_upstream_state_is_refused_by_name_unless_the_operator_keeps_it(
    gw: RunningGateway, field: str
) -> None:
    value: Any = True if field == "background" else "conv_1"
    seen = len(gw.upstream.requests)
    status, answer = await post(gw, {"model": OPENAI_MODEL, "input": "hi", field: value})
    assert status == 400 and answer["error"]["param"] == field, answer
    assert "upstream_store" in answer["error"]["message"] and len(gw.upstream.requests) == seen
    status, _ = await post(gw, {"model": "gpt-keeping", "input": "hi", field: value})
    assert status == 200 and gw.upstream.requests[-1].body[field] == value


@pytest.mark.parametrize(("client", "upstream"), [({}, None), ({"store": False}, False), ({"store": True}, True)])
async def test_an_upstream_the_operator_lets_keep_gets_the_clients_store_as_set(
    gw: RunningGateway, client: dict[str, Any], upstream: bool | None
) -> None:
    status, _ = await post(gw, {"model": "gpt-keeping", "input": "hi", **client})
    assert status == 200 and gw.upstream.requests[-1].body.get("store") is upstream


def reasoned(encrypted: str | None) -> dict[str, Any]:
    """OpenAI's answer to a first turn that reasoned (its reasoning item, as the gateway stores it)."""
    reasoning: dict[str, Any] = {
        "id": "rs_up1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "t"}],
    }
    if encrypted is not None:
        reasoning["encrypted_content"] = encrypted
    message = {
        "id": "msg_up1", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "Ada", "annotations": []}],
    }  # fmt: skip
    usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    return {"id": "resp_up1", "object": "response", "created_at": 1, "status": "completed",
            "model": "upstream-gpt", "output": [reasoning, message], "usage": usage}  # fmt: skip


@pytest.mark.parametrize("encrypted", [None, "ENC"])
async def test_a_continued_conversation_sends_no_reasoning_only_an_upstream_store_could_resolve(
    gw: RunningGateway, encrypted: str | None
) -> None:
    gw.upstream.script.append(Behaviour(kind="status", status=200, body=reasoned(encrypted)))
    status, first = await post(gw, {"model": OPENAI_MODEL, "input": "my name is Ada"})
    assert status == 200 and first["output"][0]["type"] == "reasoning"
    status, second = await post(gw, {"model": OPENAI_MODEL, "input": "my name?", "previous_response_id": first["id"]})
    assert status == 200, second  # the simulated upstream answers OpenAI's 404 for an unresolvable reasoning item
    sent = gw.upstream.requests[-1].body
    kinds = [item.get("type", "message") for item in sent["input"]]
    assert kinds == (
        ["message", "message", "message"] if encrypted is None else ["message", "reasoning", "message", "message"]
    )
    if encrypted is not None:
        assert sent["input"][1]["encrypted_content"] == "ENC"


def test_the_clients_own_items_are_sent_as_they_are() -> None:
    """Only the turns the gateway expanded are filtered: the client's own input is its to decide."""
    item = {"id": "rs_client", "type": "reasoning", "summary": []}
    request = ResponsesRequest.model_validate({"model": "m", "input": [item, {"role": "user", "content": "x"}]})
    body = native_payload(ResponsesCall(request, "up", "m", "r"))
    assert body["store"] is False and [i.get("type", "message") for i in body["input"]] == ["reasoning", "message"]
