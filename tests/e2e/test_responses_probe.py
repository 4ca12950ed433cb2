"""``POST /v1/responses`` and the stored-response routes probed from outside, as a hostile or
sloppy client would: wrong JSON types at every level, numbers JSON has no room for, ids with
path tricks, cursors that name nothing, another key's responses, a client that leaves mid-stream.

One gateway for the module, with two API keys (two tenants), serving the ``mock`` backend, a
slow ``mock`` (a stream a client can leave) and the ``openai`` relay over the fake upstream.
Every refusal is OpenAI's envelope with the status OpenAI gives and the field by its full path;
nothing is a 500. Each case is a request once answered wrongly or one that must stay answered so.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from schemas.errors import GatewayError
from tests.conftest import MOCK_MODEL, OPENAI_MODEL, eventually, gateway_config_text, serve_app
from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.security.conftest import KEY_A, KEY_B, auth_section

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLOW_MODEL = "slow-mock"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}  # team-b: mock-* models only


@dataclass
class Probe:
    url: str
    app: web.Application
    upstream: FakeUpstream
    http: aiohttp.ClientSession

    async def post(self, body: bytes | dict[str, Any], headers: dict[str, str] = A) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()  # (orjson has no 2**64)
        async with self.http.post(
            f"{self.url}/v1/responses", data=data, headers={**headers, "Content-Type": "application/json"}
        ) as resp:
            return resp.status, orjson.loads(await resp.read())

    async def call(self, method: str, path: str, headers: dict[str, str] = A) -> tuple[int, Any]:
        async with self.http.request(method, f"{self.url}{path}", headers=headers) as resp:
            return resp.status, orjson.loads(await resp.read())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def probe() -> AsyncIterator[Probe]:
    upstream = FakeUpstream()
    await upstream.start()
    slow = "  - name: slow\n    type: mock\n    token_delay_ms: 20\n"
    slow_model = f"  - name: {SLOW_MODEL}\n    routes: [{{backend: slow, model: m}}]\n"
    text = gateway_config_text(upstream.url, extra_backends=slow, extra_models=slow_model) + auth_section()
    app = create_app(parse_config(text, "<probe config>", env={}))
    runner, url = await serve_app(app)
    async with aiohttp.ClientSession() as http:
        yield Probe(url, app, upstream, http)
    await runner.cleanup()
    await upstream.stop()


def refused(status: int, body: Any, want_status: int, want_param: str | None) -> str:
    """The error's message, once the answer is checked to be OpenAI's envelope with this status and param."""
    assert status == want_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["param"] == want_param, body
    assert "Traceback" not in body["error"]["message"]
    message: str = body["error"]["message"]
    return message


def _raw(model: str, tail: bytes) -> bytes:
    return b'{"model": "%s", "input": "hi", %s}' % (model.encode(), tail)


# A number JSON has no room for (NaN, Infinity) is read by the request parser and refused at its
# field; the field's path must not carry the union tags the parser adds (before: one NaN anywhere
# in the body gave tools[0].function.parameters, text.format.json_schema.schema, ...).
NAN_CASES = [
    (b'"tools": [{"type": "function", "name": "f", "parameters": {"x": Infinity}}]', "tools[0].parameters"),
    (
        b'"tools": [{"type": "namespace", "name": "n", "description": "d",'
        b' "tools": [{"type": "function", "name": "f", "parameters": {"x": NaN}}]}]',
        "tools[0].tools[0].parameters",
    ),
    (b'"text": {"format": {"type": "json_schema", "name": "x", "schema": {"a": NaN}}}', "text.format.schema"),
    (
        b'"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "mcp", "server_label": "s",'
        b' "x": -Infinity}]}',
        "tool_choice.tools[0]",
    ),
]


@pytest.mark.parametrize("model", [MOCK_MODEL, OPENAI_MODEL])
@pytest.mark.parametrize(("tail", "param"), NAN_CASES)
async def test_a_number_json_cannot_hold_is_refused_at_its_field(
    probe: Probe, model: str, tail: bytes, param: str
) -> None:
    message = refused(*await probe.post(_raw(model, tail)), 400, param)
    assert "finite" in message


async def test_a_nan_elsewhere_leaves_another_fields_path_alone(probe: Probe) -> None:
    body = (
        b'{"model": "mock-test", "temperature": NaN,'
        b' "input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}'
    )
    refused(*await probe.post(body), 400, "input[0].content[0].text")


async def test_a_nan_in_a_hosted_item_names_the_item(probe: Probe) -> None:
    body = b'{"model": "gpt-test", "input": [{"role": "user", "content": "x"}, {"type": "mcp_call", "x": NaN}]}'
    refused(*await probe.post(body), 400, "input[1]")


# Requests that must stay refused by name (each was probed; the answer is OpenAI's or stricter).
BAD_REQUESTS: list[tuple[dict[str, Any], int, str | None]] = [
    ({"input": [None]}, 400, "input[0]"),
    ({"input": [{"role": "user", "content": None}]}, 400, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "bogus"}]}]}, 400, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "extra": 1}]}]}, 400,
     "input[0].content[0].extra"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]}, 400,
     "input[0].content[0].type"),
    ({"input": []}, 400, "input"),
    ({"input": {"role": "user", "content": "x"}}, 400, "input"),
    ({"max_output_tokens": True}, 400, "max_output_tokens"),
    ({"max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"max_output_tokens": -1}, 400, "max_output_tokens"),
    ({"max_output_tokens": 1.0}, 400, "max_output_tokens"),
    ({"max_output_tokens": 2**64}, 400, "max_output_tokens"),
    ({"temperature": True}, 400, "temperature"),
    ({"stream": "true"}, 400, "stream"),
    ({"store": 1}, 400, "store"),
    ({"include": ["bogus"]}, 400, "include[0]"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [{"type": "function", "name": "f"}]}, 400,
     "tool_choice"),
    ({"tool_choice": "required"}, 400, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": "str"}}}, 400, "text.format.schema"),
    ({"truncation": "weird"}, 400, "truncation"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata"),
    ({"metadata": {"k" * 65: "v"}}, 400, "metadata." + "k" * 65),
    ({"metadata": {"k": "v" * 513}}, 400, "metadata.k"),
    ({"metadata": {"k": 5}}, 400, "metadata.k"),
    ({"reasoning": {"effort": "ultra"}}, 400, "reasoning.effort"),
    ({"reasoning": []}, 400, "reasoning"),
    ({"previous_response_id": 5}, 400, "previous_response_id"),
    ({"previous_response_id": "../../etc"}, 404, "previous_response_id"),
    ({"previous_response_id": "x" * 10_000}, 404, "previous_response_id"),
    ({"bogus": 1}, 400, "bogus"),
]  # fmt: skip


@pytest.mark.parametrize("model", [MOCK_MODEL, OPENAI_MODEL])
@pytest.mark.parametrize(("fields", "status", "param"), BAD_REQUESTS)
async def test_bad_fields_are_refused_by_name(
    probe: Probe, model: str, fields: dict[str, Any], status: int, param: str | None
) -> None:
    asked = len(probe.upstream.requests)
    refused(*await probe.post({"model": model, "input": "hi", **fields}), status, param)
    assert len(probe.upstream.requests) == asked  # refused before any upstream call


@pytest.mark.parametrize(
    "body",
    [b"", b"\xff\xfe{", b"[1, 2]", b"null", b'{"model": "mock-test", "input": "hi"} {}', b"\xef\xbb\xbf{}"],
)
async def test_a_body_that_is_no_json_object_is_a_400(probe: Probe, body: bytes) -> None:
    refused(*await probe.post(body), 400, None)


async def test_a_key_given_twice_counts_once_the_last(probe: Probe) -> None:
    """As every JSON parser OpenAI's clients use: the last value wins, and is checked as any other."""
    refused(*await probe.post(b'{"model": "mock-test", "input": "hi", "input": 5}'), 400, "input")
    status, answer = await probe.post(b'{"model": "mock-test", "input": 5, "input": "hi"}')
    assert status == 200, answer


async def test_nul_and_astral_characters_are_kept_as_sent(probe: Probe) -> None:
    text = "a\u0000b \U0001f600 \u202e"
    status, answer = await probe.post({"model": MOCK_MODEL, "input": text, "metadata": {"k\u0000": "\U0001f600" * 512}})
    assert status == 200, answer
    status, page = await probe.call("GET", f"/v1/responses/{answer['id']}/input_items")
    assert status == 200 and page["data"][0]["content"][0]["text"] == text


async def test_deep_nesting_is_a_400_not_a_crash(probe: Probe) -> None:
    deep = b'{"model": "mock-test", "input": "hi", "metadata": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001
    message = refused(*await probe.post(deep), 400, None)
    assert "parse" in message


# --- duplicate item ids -------------------------------------------------------------------------


@pytest.mark.parametrize("model", [MOCK_MODEL, OPENAI_MODEL])
async def test_two_items_with_one_id_are_refused(probe: Probe, model: str) -> None:
    """OpenAI's 400. Kept, the listing paged by id would repeat one page forever (the SDK's
    auto-pagination never ended: ``after=msg_1`` always found the first of the two)."""
    items = [
        {"role": "user", "content": "a", "id": "msg_1"},
        {"role": "user", "content": "b", "id": "msg_2"},
        {"type": "function_call_output", "call_id": "c", "output": "x", "id": "msg_1"},
    ]
    message = refused(*await probe.post({"model": model, "input": items}), 400, "input[2].id")
    assert message.startswith("Duplicate item found with id msg_1.")


@pytest.mark.parametrize("model", [MOCK_MODEL, OPENAI_MODEL])
async def test_an_item_the_conversation_already_holds_is_refused(probe: Probe, model: str) -> None:
    """Sent back with ``previous_response_id``, an earlier output item would reach the model twice
    (the bridge sent the assistant message twice; OpenAI, given the history by value, refuses it)."""
    status, first = await probe.post({"model": model, "input": [{"role": "user", "content": "a", "id": "msg_q"}]})
    assert status == 200, first
    asked = len(probe.upstream.requests)
    again = {"model": model, "previous_response_id": first["id"]}
    output = first["output"]
    refused(*await probe.post({**again, "input": [*output, {"role": "user", "content": "b"}]}), 400, "input[0].id")
    repeated = [{"role": "user", "content": "b"}, {"role": "user", "content": "a", "id": "msg_q"}]
    refused(*await probe.post({**again, "input": repeated}), 400, "input[1].id")
    assert len(probe.upstream.requests) == asked
    status, answer = await probe.post({**again, "input": [{"role": "user", "content": "b", "id": "msg_new"}]})
    assert status == 200, answer


async def test_the_sdk_pages_through_every_input_item_once(probe: Probe) -> None:
    items = [{"role": "user", "content": f"q{i}", "id": f"msg_{i}"} for i in range(5)]
    status, answer = await probe.post({"model": MOCK_MODEL, "input": items})
    assert status == 200, answer
    async with openai.AsyncOpenAI(base_url=f"{probe.url}/v1", api_key=KEY_A, max_retries=0) as client:
        seen = []
        async for item in client.responses.input_items.list(answer["id"], limit=2, order="asc"):
            seen.append(item.id)
            assert len(seen) <= len(items)
    assert seen == [item["id"] for item in items]


# --- the stored-response routes -----------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module")
async def stored(probe: Probe) -> str:
    items = [{"role": "user", "content": f"q{i}"} for i in range(3)]
    status, answer = await probe.post({"model": MOCK_MODEL, "input": items})
    assert status == 200, answer
    rid: str = answer["id"]
    return rid


QUERIES = [
    ("limit=0", "limit"), ("limit=-1", "limit"), ("limit=1000", "limit"), ("limit=x", "limit"), ("limit=1.5", "limit"),
    ("limit=true", "limit"), ("limit=", "limit"), ("limit=2&limit=3", "limit"), ("after=nope", "after"),
    ("before=nope", "before"), ("order=weird", "order"), ("order=ASC", "order"), ("include=bogus", "include"),
    ("after=" + "x" * 300, "after"), ("foo=1", "foo"),
]  # fmt: skip


@pytest.mark.parametrize(("query", "param"), QUERIES)
async def test_a_bad_page_is_a_400_naming_the_parameter(probe: Probe, stored: str, query: str, param: str) -> None:
    refused(*await probe.call("GET", f"/v1/responses/{stored}/input_items?{query}"), 400, param)


@pytest.mark.parametrize(
    "rid", ["%2F", "a%2Fb", "resp_%00", "x" * 257, "r%C3%A9sp_%C3%BC", "%FF", "%20", "null", "{stored}%2Finput_items"]
)
@pytest.mark.parametrize(("method", "tail"), [("GET", ""), ("DELETE", ""), ("GET", "/input_items")])
async def test_an_id_with_path_tricks_is_a_404(probe: Probe, stored: str, rid: str, method: str, tail: str) -> None:
    refused(*await probe.call(method, f"/v1/responses/{rid.format(stored=stored)}{tail}"), 404, "response_id")


@pytest.mark.parametrize("path", ["..", "%2E%2E", "../v1/models"])
async def test_dot_segments_never_reach_another_route(probe: Probe, path: str) -> None:
    status, body = await probe.call("GET", f"/v1/responses/{path}")
    assert refused(status, body, 404, None).startswith("Unknown path")


@pytest.mark.parametrize(("method", "tail"), [("GET", ""), ("DELETE", ""), ("GET", "/input_items")])
async def test_another_keys_response_is_a_404_and_stays_there(
    probe: Probe, stored: str, method: str, tail: str
) -> None:
    refused(*await probe.call(method, f"/v1/responses/{stored}{tail}", headers=B), 404, "response_id")
    follow = {"model": MOCK_MODEL, "input": "x", "previous_response_id": stored}
    refused(*await probe.post(follow, headers=B), 404, "previous_response_id")
    status, kept = await probe.call("GET", f"/v1/responses/{stored}")
    assert status == 200 and kept["id"] == stored


async def test_a_deleted_response_cannot_be_continued(probe: Probe, stored: str) -> None:
    status, deleted = await probe.call("DELETE", f"/v1/responses/{stored}")
    assert status == 200 and deleted == {"id": stored, "object": "response.deleted", "deleted": True}
    follow = {"model": MOCK_MODEL, "input": "x", "previous_response_id": stored}
    refused(*await probe.post(follow), 404, "previous_response_id")
    refused(*await probe.call("DELETE", f"/v1/responses/{stored}"), 404, "response_id")


# --- a client that leaves mid-stream ------------------------------------------------------------


@pytest.mark.parametrize("model", [SLOW_MODEL, OPENAI_MODEL])
async def test_a_stream_the_client_left_is_stored_cancelled(probe: Probe, model: str) -> None:
    if model == OPENAI_MODEL:
        probe.upstream.script.append(Behaviour(delay=0.05))  # the relayed stream, paced by the upstream
    body = {"model": model, "input": "a long story", "stream": True, "max_output_tokens": 200}
    resp = await probe.http.post(f"{probe.url}/v1/responses", json=body, headers=A)
    rid = None
    async for line in resp.content:
        if line.startswith(b"data:"):
            event = orjson.loads(line[5:])
            if event["type"] == "response.created":
                rid = event["response"]["id"]
            if event["type"] == "response.output_text.delta":
                break
    resp.close()  # gone before the last event
    assert rid is not None
    store = probe.app[STATE].responses_state

    async def kept() -> bool:
        try:
            return (await store.get("team-a", rid)).response["status"] == "cancelled"
        except GatewayError:  # not kept yet
            return False

    await eventually(kept)
    status, answer = await probe.call("GET", f"/v1/responses/{rid}")
    assert status == 200 and answer["status"] == "cancelled"


# --- what the openai upstream says about the request ---------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_openais_404_for_an_item_it_never_kept_is_relayed(probe: Probe, stream: bool) -> None:
    """A reasoning item sent by id alone, which OpenAI (told ``store: false``) cannot resolve: its
    404 and words reach the client, as docs/responses.md says (before: a 502 blaming the base_url),
    and the backend stays in service."""
    items = [{"type": "reasoning", "id": "rs_alone", "summary": []}, {"role": "user", "content": "hi"}]
    for _ in range(6):  # more than the circuit's failure threshold
        status, body = await probe.post({"model": OPENAI_MODEL, "input": items, "stream": stream})
        message = refused(status, body, 404, "input")
        assert message.startswith("Item with id 'rs_alone' not found.")
    status, answer = await probe.post({"model": OPENAI_MODEL, "input": "still there?"})
    assert status == 200, answer


@pytest.mark.parametrize(
    "body",
    [b'data: {"type":"response.output_text.delta","delta":"x"}\n\ndata: [DONE]\n\n', b"data: [DONE]\n\n"],
)
async def test_a_relayed_stream_that_opens_no_response_is_a_502_before_a_byte(probe: Probe, body: bytes) -> None:
    """An upstream whose Responses stream does not begin with ``response.created`` (a bare delta, ``[DONE]``
    alone): a 502 naming it, not a 200 whose events no client can read; the backend still answers."""
    probe.upstream.script.append(Behaviour(kind="raw", body=body))
    status, answer = await probe.post({"model": OPENAI_MODEL, "input": "hi", "stream": True})
    assert status == 502, answer
    assert "not response.created" in answer["error"]["message"]
    status, answer = await probe.post({"model": OPENAI_MODEL, "input": "still there?"})
    assert status == 200, answer
