"""``POST /v1/responses`` end to end with the official ``openai`` client: the mock (through the chat
bridge), an ``openai`` backend (OpenAI's own endpoint, relayed) and a ``vllm`` backend (through its
chat dialect), on the fake upstream.

What each test proves: the client's own parsing accepts the gateway's answers (``create``,
``stream()`` building the same final response as ``create``, ``parse`` with a pydantic model,
tool calls, ``previous_response_id``), and the request path holds for Responses (404 for a
model not served there, 400 naming what a backend cannot honour, the built-in-tools choice and
its header, ``response.failed`` for an upstream that fails midway, a client that leaves cancels
the upstream and the stored turn ends ``cancelled``, metrics labelled ``endpoint="responses"``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from pydantic import BaseModel

from gateway.responses_state import NO_AUTH_TENANT
from gateway.state import STATE
from tests.conftest import MOCK_MODEL, OPENAI_MODEL, UPSTREAM_IDS, VLLM_MODEL, MakeGateway, RunningGateway, eventually
from tests.fakes import Behaviour

CHAT_ONLY = "mock-chat-only"
OMITTING = "mock-omitting"
EXTRA_MODELS = f"""  - name: {CHAT_ONLY}
    endpoints: [chat]
    routes: [{{backend: sim, model: m}}]
  - name: {OMITTING}
    routes: [{{backend: sim, model: m}}]
    responses: {{builtin_tools: omit}}
"""
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Weather(BaseModel):
    city: str
    degrees: int


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> RunningGateway:
    return await make_gateway(extra_models=EXTRA_MODELS)


@pytest.fixture
async def client(gw: RunningGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
        yield c


def _strip_ids(obj: Any) -> Any:
    """A Response without what differs between two calls (ids, time; the stream helper's ``parsed``)."""
    if isinstance(obj, dict):
        return {k: _strip_ids(v) for k, v in obj.items() if k not in ("id", "created_at", "parsed")}
    if isinstance(obj, list):
        return [_strip_ids(v) for v in obj]
    return obj


@pytest.mark.parametrize("model", [MOCK_MODEL, OPENAI_MODEL, VLLM_MODEL])
async def test_create(client: openai.AsyncOpenAI, model: str) -> None:
    resp = await client.responses.create(model=model, input="Say hello", max_output_tokens=30)
    assert resp.object == "response"
    assert resp.model == model  # the name the client asked for, never the upstream id
    assert resp.id.startswith("resp_")
    assert resp.status in ("completed", "incomplete")
    assert resp.output_text
    assert resp.usage is not None
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens


# Not vLLM here: the fake upstream's chat answers differ streamed and not (tests/backends/vllm/real checks it).
@pytest.mark.parametrize("model", [MOCK_MODEL, OPENAI_MODEL])
async def test_stream_helper_builds_the_same_response_as_create(client: openai.AsyncOpenAI, model: str) -> None:
    kwargs: dict[str, Any] = {"model": model, "input": "Say hello", "max_output_tokens": 200, "temperature": 0}
    plain = await client.responses.create(**kwargs)
    async with client.responses.stream(**kwargs) as stream:
        events = [event async for event in stream]
        if events[-1].type == "response.completed":  # the helper builds its response from that event alone
            final = await stream.get_final_response()
            assert final.output_text == plain.output_text
            assert _strip_ids(final.model_dump()) == _strip_ids(plain.model_dump())
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == f"response.{plain.status}"
    assert _strip_ids(events[-1].response.model_dump()) == _strip_ids(plain.model_dump())


async def test_parse_with_a_pydantic_model(client: openai.AsyncOpenAI) -> None:
    parsed = await client.responses.parse(model=MOCK_MODEL, input="The weather in Paris?", text_format=Weather)
    assert isinstance(parsed.output_parsed, Weather)


async def test_tool_call_round_trip_with_previous_response_id(client: openai.AsyncOpenAI) -> None:
    first = await client.responses.create(
        model=MOCK_MODEL, input="What is the weather in Paris?", tools=[WEATHER], parallel_tool_calls=False
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert set(json.loads(calls[0].arguments)) == {"city", "unit"}
    second = await client.responses.create(
        model=MOCK_MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"degrees": 21}'}],
        tools=[WEATHER],
    )
    # The stored turn went upstream too: the conversation ends with the tool's result, so the model answers.
    assert second.status == "completed" and second.output_text
    assert second.previous_response_id == first.id


async def test_streamed_tool_call(client: openai.AsyncOpenAI) -> None:
    async with client.responses.stream(
        model=MOCK_MODEL, input="weather?", tools=[WEATHER], parallel_tool_calls=False
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert set(json.loads(call.arguments)) == {"city", "unit"}


async def test_unknown_previous_response_is_404_naming_it(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        await client.responses.create(model=MOCK_MODEL, input="hi", previous_response_id="resp_never")
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]


async def test_model_not_served_on_responses_is_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        await client.responses.create(model=CHAT_ONLY, input="hi")
    assert err.value.body["code"] == "model_not_supported_on_endpoint"  # type: ignore[index]
    assert "v1/chat/completions" in err.value.body["message"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ],
)
async def test_what_the_mock_cannot_honour_is_refused_by_name(
    client: openai.AsyncOpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(**{"model": MOCK_MODEL, "input": "hi", **extra})
    body = err.value.body
    assert body["code"] == "unsupported_parameter" and body["param"] == param  # type: ignore[index]


async def test_unknown_field_is_refused_by_its_full_path(gw: RunningGateway) -> None:
    bad = {"model": MOCK_MODEL, "input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "y": 1}]}]}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/v1/responses", json=bad) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["param"] == "input[0].content[0].y" and error["code"] == "unknown_parameter"


async def test_builtin_tools_go_to_openai_as_sent(client: openai.AsyncOpenAI, gw: RunningGateway) -> None:
    await client.responses.create(model=OPENAI_MODEL, input="news?", tools=[{"type": "web_search"}], store=False)
    sent = gw.upstream.requests[-1]
    assert sent.path == "/v1/responses"
    assert sent.body["tools"] == [{"type": "web_search"}]
    assert sent.body["model"] == UPSTREAM_IDS[OPENAI_MODEL] and sent.body["store"] is False


async def test_omit_leaves_builtin_tools_out_and_says_so(gw: RunningGateway) -> None:
    body = {"model": OMITTING, "input": "hi", "tools": [{"type": "web_search"}, WEATHER], "tool_choice": "none"}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/v1/responses", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["x-gateway-omitted-tools"] == "web_search"
        answer = await resp.json()
    assert answer["tools"][0] == {"type": "web_search"}  # the request is echoed as sent
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/v1/responses", json=body | {"model": MOCK_MODEL}) as resp,
    ):
        assert resp.status == 400  # without the operator's choice: refused by name
        assert "x-gateway-omitted-tools" not in resp.headers


async def test_upstream_failure_midway_ends_in_response_failed(client: openai.AsyncOpenAI, gw: RunningGateway) -> None:
    gw.upstream.script.append(Behaviour(kind="error_event", events=3))
    stream = await client.responses.create(model=OPENAI_MODEL, input="hi", stream=True, max_output_tokens=8)
    events = [event async for event in stream]
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None and "engine died" in events[-1].response.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert not any(e.type == "response.completed" for e in events)


async def test_bridge_failure_midway_ends_in_response_failed(client: openai.AsyncOpenAI, gw: RunningGateway) -> None:
    gw.upstream.script.append(Behaviour(kind="error_event", events=2))  # the vLLM chat stream fails
    stream = await client.responses.create(model=VLLM_MODEL, input="hi", stream=True, max_output_tokens=8)
    events = [event async for event in stream]
    assert events[-1].type == "response.failed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == " t0 t1"  # what was produced before the failure, never more


@pytest.mark.parametrize("end", ["error_event", "cut", "no_last_event"])
async def test_relay_failing_midway_stores_failed_with_the_text_sent(gw: RunningGateway, end: str) -> None:
    # An upstream error event, a dropped connection, a body that ends without its last event: the
    # response.failed the client gets and the stored turn hold the text relayed, as the bridge's do.
    if end == "no_last_event":
        start = {"id": "resp_x", "object": "response", "status": "in_progress", "model": "m", "output": []}
        item = {"id": "m", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        at = {"output_index": 0, "item_id": "m", "content_index": 0}
        part = {"type": "output_text", "text": "", "annotations": []}
        events = [("response.created", {"response": start}),
                  ("response.output_item.added", {"output_index": 0, "item": item}),
                  ("response.content_part.added", {**at, "part": part}),
                  *(("response.output_text.delta", {**at, "delta": f" t{i}"}) for i in range(3))]  # fmt: skip
        body = b"".join(gw.upstream.response_event(seq, kind, **fields) for seq, (kind, fields) in enumerate(events))
        gw.upstream.script.append(Behaviour(kind="raw", body=body))
    else:
        gw.upstream.script.append(Behaviour(kind=end, events=3))
    request = {"model": OPENAI_MODEL, "input": "hi", "stream": True, "max_output_tokens": 8}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/responses", json=request) as resp:
            events = [json.loads(line[6:]) for line in (await resp.read()).splitlines() if line.startswith(b"data: ")]
        failed = events[-1]["response"]
        async with http.get(f"{gw.url}/v1/responses/{events[0]['response']['id']}") as got:
            stored = await got.json()
    assert events[-1]["type"] == "response.failed" and failed["status"] == stored["status"] == "failed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == " t0 t1 t2"
    item = {"id": failed["output"][0]["id"], "type": "message", "role": "assistant", "status": "incomplete",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    assert failed["output"] == stored["output"] == [item] and stored["error"] == failed["error"]


@pytest.mark.parametrize("model", [OPENAI_MODEL, VLLM_MODEL])  # its own /v1/responses; the chat bridge
async def test_client_leaving_cancels_upstream_and_stores_cancelled(gw: RunningGateway, model: str) -> None:
    gw.upstream.script.append(Behaviour(kind="ok", delay=0.05))
    body = {"model": model, "input": "hi", "stream": True, "max_output_tokens": 200}
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{gw.url}/v1/responses", json=body)
        first = await resp.content.readline()
        while b"response.created" not in first:
            first = await resp.content.readline()
        created = json.loads((await resp.content.readline()).removeprefix(b"data: "))
        resp.close()
    await eventually(lambda: gw.upstream.cancelled_streams == 1)
    rid = created["response"]["id"]
    state = gw.app[STATE].responses_state
    history = await state.history(NO_AUTH_TENANT, rid)
    assert history[0]["role"] == "user"  # the turn was kept, ended, not left in_progress
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/v1/responses/{rid}") as got:
        assert (await got.json())["status"] == "cancelled"


@pytest.mark.parametrize("model", [OPENAI_MODEL, VLLM_MODEL])
async def test_client_leaving_midway_stores_the_text_it_was_sent(gw: RunningGateway, model: str) -> None:
    gw.upstream.script.append(Behaviour(kind="ok", delay=0.05))
    body = {"model": model, "input": "hi", "stream": True, "max_output_tokens": 200}
    read, rid = "", None
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{gw.url}/v1/responses", json=body)
        while read.count(" t") < 3:
            line = await resp.content.readline()
            if line.startswith(b"data: "):
                event = json.loads(line.removeprefix(b"data: "))
                rid = rid or event["response"]["id"]
                read += event["delta"] if event["type"] == "response.output_text.delta" else ""
        resp.close()
    await eventually(lambda: gw.upstream.cancelled_streams == 1)
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/v1/responses/{rid}") as got:
        stored = await got.json()
    assert stored["status"] == "cancelled" and len(stored["output"]) == 1
    item = stored["output"][0]  # the bridge's shape, on both: the message so far, incomplete
    assert item["type"] == "message" and item["status"] == "incomplete"
    assert [part["type"] for part in item["content"]] == ["output_text"]
    text = item["content"][0]["text"]
    assert text.startswith(read) and "".join(f" t{i}" for i in range(200)).startswith(text)


# Integer edges at the front door, on the mock: never a 500. A limit past the context window is
# vLLM's 400 naming the field the client sent; past int64 (or below a bound) the schema's 400.
EDGE_VALUES = (2**62, 2**63 - 1, 2**63, 2**64, -1, 0)
EDGE_FIELDS = {"/v1/responses": ("max_output_tokens", "top_logprobs", "max_tool_calls"),
               "/v1/chat/completions": ("max_tokens", "max_completion_tokens", "top_logprobs", "seed")}  # fmt: skip


async def test_integer_edges_are_answered_or_refused_by_name(gw: RunningGateway) -> None:
    async with aiohttp.ClientSession() as http:
        for path, fields in EDGE_FIELDS.items():
            for field, value, stream in itertools.product(fields, EDGE_VALUES, (False, True)):
                if path == "/v1/responses":
                    body: dict[str, Any] = {"model": MOCK_MODEL, "input": "hi"}
                else:
                    body = {"model": MOCK_MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True}
                async with http.post(f"{gw.url}{path}", json={**body, field: value, "stream": stream}) as resp:
                    status, answer = resp.status, await resp.read()
                case = (path, field, value, stream)
                if status == 200:  # within every bound: an answer, not an error
                    assert field in ("max_tool_calls", "seed") or value == 0, case
                    assert b'"error":{' not in answer and b"response.failed" not in answer, case
                    continue
                error = json.loads(answer)["error"]
                assert status == 400 and error["param"] == field, case
                if field.startswith("max_") and field != "max_tool_calls" and 0 < value < 2**63:
                    assert "maximum context length" in error["message"], case


async def test_metrics_say_responses(client: openai.AsyncOpenAI, gw: RunningGateway) -> None:
    await client.responses.create(model=MOCK_MODEL, input="hi")
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/metrics") as resp:
        text = await resp.text()
    assert 'endpoint="responses"' in text and f'model="{MOCK_MODEL}"' in text


async def test_sync_client(gw: RunningGateway) -> None:
    def call() -> Any:
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
            return c.responses.create(
                model=MOCK_MODEL, input=[{"role": "user", "content": "hi"}], instructions="Be brief"
            )

    resp = await asyncio.to_thread(call)
    assert resp.instructions == "Be brief" and resp.output_text
