"""``POST /v1/chat/completions`` end to end with the official ``openai`` client, against the mock.

The gateway runs in-process on loopback; its ``mock`` backend serves chat through the chat
simulator. What each test proves: the client's own parsing (sync, async, streams, tool calls,
``parse`` with a pydantic model) accepts the gateway's answers, and the shared request path
(404 for a model not served on chat, 400 naming an unsupported field, metrics labelled
``endpoint="chat"``) holds for chat.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from schemas.endpoints import Endpoint
from tests.conftest import MOCK_MODEL, MakeGateway, RunningGateway

COMPLETIONS_ONLY = "mock-completions-only"
EXTRA_MODELS = f"""  - name: {COMPLETIONS_ONLY}
    endpoints: [completions]
    routes: [{{backend: sim, model: m}}]
"""
HELLO = [{"role": "user", "content": "Say hello"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}


@pytest.fixture
async def chat_gateway(make_gateway: MakeGateway) -> RunningGateway:
    return await make_gateway(extra_models=EXTRA_MODELS)


@pytest.fixture
async def client(chat_gateway: RunningGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{chat_gateway.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
        yield c


async def test_async_create(client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(model=MOCK_MODEL, messages=HELLO, max_completion_tokens=30)  # type: ignore[arg-type]
    assert resp.object == "chat.completion"
    assert resp.model == MOCK_MODEL  # the name the client asked for, not the upstream id
    assert resp.id.startswith("chatcmpl-")
    message = resp.choices[0].message
    assert message.role == "assistant" and message.content
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage is not None and resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


async def test_sync_create(chat_gateway: RunningGateway) -> None:
    def call() -> Any:
        with openai.OpenAI(base_url=f"{chat_gateway.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
            return c.chat.completions.create(model=MOCK_MODEL, messages=HELLO, n=2, seed=7)  # type: ignore[arg-type]

    resp = await asyncio.to_thread(call)
    assert [c.index for c in resp.choices] == [0, 1]
    assert all(c.message.content for c in resp.choices)


@pytest.mark.parametrize("include_usage", [False, True])
async def test_stream_shape(client: openai.AsyncOpenAI, include_usage: bool) -> None:
    options: Any = {"include_usage": True} if include_usage else openai.NOT_GIVEN
    stream = await client.chat.completions.create(
        model=MOCK_MODEL,
        messages=HELLO,  # type: ignore[arg-type]
        stream=True,
        stream_options=options,
        max_completion_tokens=12,
    )
    chunks = [chunk async for chunk in stream]
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.usage is None and c.choices for c in chunks)


async def test_stream_ends_with_done_and_usage_null_on_the_wire(chat_gateway: RunningGateway) -> None:
    body = {"model": MOCK_MODEL, "messages": HELLO, "stream": True, "max_tokens": 5}
    async with aiohttp.ClientSession() as s, s.post(f"{chat_gateway.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        raw = await resp.read()
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert all("usage" in c and c["usage"] is None for c in chunks)  # present and null, as OpenAI sends


async def test_streamed_tool_calls_reassemble(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MOCK_MODEL,
        messages=[{"role": "user", "content": "weather and time in Paris?"}],
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice="required",
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                if delta.id:
                    assert not call["id"], "id only in a call's first delta"
                    call["id"] = delta.id
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls"
    assert sorted(c["name"] for c in calls.values()) == ["get_time", "get_weather"]
    for call in calls.values():
        args = json.loads(call["arguments"])  # each call's fragments alone make valid JSON
        assert call["id"] and isinstance(args, dict)
    weather = next(c for c in calls.values() if c["name"] == "get_weather")
    assert set(json.loads(weather["arguments"])) == {"city", "unit"}

    # the same conversation, non-streamed, with the tool result sent back
    first = await client.chat.completions.create(
        model=MOCK_MODEL,
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    follow = await client.chat.completions.create(
        model=MOCK_MODEL,
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert follow.choices[0].message.content and follow.choices[0].finish_reason == "stop"


class Weather(BaseModel):
    city: str
    temperature: float
    raining: bool


async def test_parse_with_a_pydantic_response_format(client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.parse(
        model=MOCK_MODEL,
        messages=[{"role": "user", "content": "Weather in Oslo as JSON"}],
        response_format=Weather,
    )
    parsed = resp.choices[0].message.parsed
    assert isinstance(parsed, Weather)


async def test_completions_only_model_is_404_naming_the_endpoint(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model=COMPLETIONS_ONLY, messages=HELLO)  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "model"
    assert "v1/chat/completions" in error["message"] and "served on v1/completions" in error["message"]
    # and it is still served on completions
    done = await client.completions.create(model=COMPLETIONS_ONLY, prompt="hi", max_tokens=2)
    assert done.choices[0].text


async def test_unsupported_chat_field_is_400_naming_it(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MOCK_MODEL,
            messages=HELLO,  # type: ignore[arg-type]
            extra_body={"top_k": 5},  # a vLLM extra the simulator cannot honour
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "top_k" and error["code"] == "unsupported_parameter"
    assert "(type mock)" in error["message"]


async def test_unsupported_form_names_the_field_and_the_form(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MOCK_MODEL,
            messages=HELLO,  # type: ignore[arg-type]
            tools=[{"type": "custom", "custom": {"name": "grep"}}],  # type: ignore[list-item]
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "tools" and 'tools "custom"' in error["message"]


async def test_nested_message_error_names_its_path(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MOCK_MODEL,
            messages=[{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}],  # type: ignore[list-item,typeddict-item]
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "messages[1].tool_call_id"


async def test_metrics_carry_the_endpoint(client: openai.AsyncOpenAI, chat_gateway: RunningGateway) -> None:
    await client.chat.completions.create(model=MOCK_MODEL, messages=HELLO)  # type: ignore[arg-type]
    stream = await client.chat.completions.create(model=MOCK_MODEL, messages=HELLO, stream=True)  # type: ignore[arg-type]
    _ = [c async for c in stream]
    await client.completions.create(model=MOCK_MODEL, prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MOCK_MODEL, messages=HELLO, extra_body={"top_k": 5})  # type: ignore[arg-type]
    async with aiohttp.ClientSession() as s, s.get(f"{chat_gateway.url}/metrics") as resp:
        text = await resp.text()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def value(name: str, **labels: str) -> float:
        return sum(s.value for s in samples if s.name == name and s.labels == labels)

    ok = {"model": MOCK_MODEL, "backend": "sim"}
    assert value("gateway_requests_total", **ok, status="200", endpoint="chat") == 2
    assert value("gateway_requests_total", **ok, status="200", endpoint="completions") == 1
    assert value("gateway_time_to_first_token_seconds_count", **ok, endpoint="chat") == 1
    assert value("gateway_request_duration_seconds_count", **ok, endpoint="chat", status_class="2xx") == 2
    assert value("gateway_completion_tokens_total", **ok, endpoint="chat") > 0
    assert value("gateway_unsupported_parameter_rejections_total", backend="sim", param="top_k", endpoint="chat") == 1
    assert value("gateway_requests_in_flight", model=MOCK_MODEL, endpoint="chat") == 0
    assert {s.labels["endpoint"] for s in samples if "endpoint" in s.labels} <= {e.value for e in Endpoint}
