"""The openai SDK's Responses calls on every backend type, through the gateway (issue 21's clients).

Each backend type serves a model on its simulated native server (``tests.e2e.model_upstreams``):
``responses.create``, ``responses.stream()`` (the helper's final response equals the
non-streamed one), ``responses.parse()`` with a pydantic model, and a function tool round trip
continued with ``previous_response_id``. What a backend type cannot honour is refused by name
(400 ``unsupported_parameter`` with its ``param``) and nothing goes upstream.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from tests.e2e.model_upstreams import HTTP_KINDS, KINDS, ResponsesGateway, model_of

pytestmark = pytest.mark.asyncio(loop_scope="module")


def weather_tool(*, strict: bool = True) -> dict[str, Any]:
    return {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": strict,
    }


ASK = 'Call get_weather with {"city": "Paris", "unit": "c"}'
# Ollama holds no tool call to its schema and cannot limit a reply to one call, so a strict tool and
# parallel_tool_calls: false are refused there (tests below): it gets a non-strict tool and the default.
STRICT_OK = {kind: kind != "ollama" for kind in KINDS}
ONE_CALL: dict[str, dict[str, Any]] = {
    kind: {} if kind == "ollama" else {"parallel_tool_calls": False} for kind in KINDS
}


class Weather(BaseModel):
    city: str
    degrees: int


def _strip(obj: Any) -> Any:
    """A Response without what differs between two calls (ids, time; the stream helper's ``parsed``)."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in ("id", "created_at", "parsed", "call_id")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


@pytest.mark.parametrize("kind", KINDS)
async def test_create(resp_client: openai.AsyncOpenAI, kind: str) -> None:
    resp = await resp_client.responses.create(model=model_of(kind), input="Say hello", max_output_tokens=40)
    assert resp.object == "response" and resp.model == model_of(kind) and resp.id.startswith("resp_")
    assert resp.status in ("completed", "incomplete") and resp.output_text
    assert resp.usage is not None and resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_helper_builds_the_same_response_as_create(resp_client: openai.AsyncOpenAI, kind: str) -> None:
    kwargs: dict[str, Any] = {"model": model_of(kind), "input": "Say hello", "max_output_tokens": 200, "temperature": 0}
    plain = await resp_client.responses.create(**kwargs)
    async with resp_client.responses.stream(**kwargs) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == plain.output_text
    assert _strip(final.model_dump()) == _strip(plain.model_dump())


@pytest.mark.parametrize("kind", KINDS)
async def test_parse_with_a_pydantic_model(resp_client: openai.AsyncOpenAI, kind: str) -> None:
    parsed = await resp_client.responses.parse(model=model_of(kind), input="The weather in Paris?", text_format=Weather)
    assert isinstance(parsed.output_parsed, Weather)


@pytest.mark.parametrize("kind", KINDS)
async def test_tool_round_trip_with_previous_response_id(
    resp_client: openai.AsyncOpenAI, resp_gateway: ResponsesGateway, kind: str
) -> None:
    tool = weather_tool(strict=STRICT_OK[kind])
    first = await resp_client.responses.create(model=model_of(kind), input=ASK, tools=[tool], **ONE_CALL[kind])
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris", "unit": "c"}
    second = await resp_client.responses.create(
        model=model_of(kind),
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees"}],
        tools=[tool],
    )
    assert second.status == "completed" and second.previous_response_id == first.id
    if kind in ("openai", "mock"):
        assert second.output_text  # the simulator's words; the upstream request is checked where it is recorded
        return
    assert second.output_text == "Tool said: 21 degrees"  # the model read the tool's result
    if kind in resp_gateway.upstreams:  # (the pool's worker is a process of its own)
        sent = resp_gateway.sent(kind)[-1]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "tool"]  # the stored turn went upstream first


@pytest.mark.parametrize("kind", KINDS)
async def test_streamed_tool_call(resp_client: openai.AsyncOpenAI, kind: str) -> None:
    tool = weather_tool(strict=STRICT_OK[kind])
    async with resp_client.responses.stream(model=model_of(kind), input=ASK, tools=[tool], **ONE_CALL[kind]) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Paris", "unit": "c"}


SELF_HOSTED = [kind for kind in KINDS if kind != "openai"]
# What a backend type cannot honour, and the field its 400 names (nothing goes upstream).
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("ollama", {"tools": [weather_tool(strict=True)]}, "tools"),  # nothing in Ollama holds arguments to a schema
    ("ollama", {"tools": [weather_tool(strict=False)], "parallel_tool_calls": False}, "parallel_tool_calls"),
    ("llamacpp", {"tools": [weather_tool()], "tool_choice": {"type": "function", "name": "get_weather"}},
     "tool_choice"),  # llama.cpp reads a named choice as "auto"
    ("tgi", {"tools": [weather_tool()], "text": {"format": {"type": "json_object"}}},
     "text.format"),  # TGI: grammar and tools are mutually exclusive
    *((kind, {"tools": [{"type": "web_search"}]}, "tools") for kind in SELF_HOSTED),
    *((kind, {"background": True}, "background") for kind in SELF_HOSTED),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "extra", "param"), REFUSED, ids=[f"{k}-{p}" for k, _, p in REFUSED])
async def test_what_a_backend_cannot_honour_is_refused_by_name(
    resp_client: openai.AsyncOpenAI, resp_gateway: ResponsesGateway, kind: str, extra: dict[str, Any], param: str
) -> None:
    before = len(resp_gateway.sent(kind)) if kind in resp_gateway.upstreams else 0
    with pytest.raises(openai.BadRequestError) as err:
        await resp_client.responses.create(**{"model": model_of(kind), "input": ASK, **extra})
    body: Any = err.value.body
    assert body["code"] == "unsupported_parameter", body
    assert body["param"] == param, body
    if kind in resp_gateway.upstreams:
        assert len(resp_gateway.sent(kind)) == before


async def test_every_http_kind_was_reached(resp_gateway: ResponsesGateway) -> None:
    """The simulated servers served the tests above (no model was answered by something else)."""
    assert all(resp_gateway.sent(kind) for kind in HTTP_KINDS if kind != "openai")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_streamed_continuation_names_its_previous_response(resp_client: openai.AsyncOpenAI, kind: str) -> None:
    """On ``openai`` the gateway resolves the id and does not send it; the answer still names it."""
    first = await resp_client.responses.create(model=model_of(kind), input="Remember lighthouse.", max_output_tokens=20)
    async with resp_client.responses.stream(
        model=model_of(kind), input="Which word?", previous_response_id=first.id, max_output_tokens=20
    ) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    lifecycle = [e for e in events if e.type in ("response.created", "response.in_progress", "response.completed")]
    assert len(lifecycle) == 3 and all(e.response.previous_response_id == first.id for e in lifecycle)
    assert final.previous_response_id == first.id


@pytest.mark.parametrize("kind", KINDS)
async def test_retrieve_input_items_and_delete(resp_client: openai.AsyncOpenAI, kind: str) -> None:
    """The conversation the gateway keeps, whatever backend served the turn."""
    tool = weather_tool(strict=STRICT_OK[kind])
    first = await resp_client.responses.create(model=model_of(kind), input=ASK, tools=[tool], **ONE_CALL[kind])
    (call,) = [item for item in first.output if item.type == "function_call"]
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees"}
    second = await resp_client.responses.create(
        model=model_of(kind), previous_response_id=first.id, input=[answer], tools=[tool]
    )
    got = await resp_client.responses.retrieve(second.id)
    assert _strip(got.model_dump()) == _strip(second.model_dump()) and got.id == second.id
    items = [item async for item in resp_client.responses.input_items.list(second.id, order="asc")]
    assert [item.type for item in items] == ["function_call_output"]  # this turn's input, not the chain's
    assert items[0].call_id == call.call_id  # type: ignore[union-attr]
    first_items = [item async for item in resp_client.responses.input_items.list(first.id)]
    assert [item.type for item in first_items] == ["message"]
    deleted = await resp_client.responses.delete(second.id)
    assert deleted is None  # the SDK's delete returns nothing on success
    with pytest.raises(openai.NotFoundError):
        await resp_client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        await resp_client.responses.create(model=model_of(kind), previous_response_id=second.id, input="and now?")
