"""Issue 14's "done when": one chat request, every backend type, through the gateway, the same answer shape.

The request carries what agents send: a conversation with an assistant tool call and its
tool result, ``tools`` with ``tool_choice: auto``, a ``json_schema`` ``response_format`` and
an output limit, streamed (with and without ``include_usage``) or not. It goes through the
app ``gateway serve`` builds to a model on each backend type (``tests.e2e.chat_upstreams``:
real loopback servers answering with the recorded native payloads, vLLM pinned by its
``/version``). Each answer must be OpenAI's shape with fields that mean the same thing on
every backend, or a 400 whose ``param`` names the field that backend (or vLLM version)
cannot honour, with nothing sent upstream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from tests.e2e.chat_upstreams import KINDS, OLD_VLLM, ChatGateway, model_of, start_chat_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,  # the openai client's stream helper parses only strict tools
    },
}
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    {"role": "user", "content": "And Rome?"},
]  # fmt: skip
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "weather", "schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
REQUEST: dict[str, Any] = {
    "messages": CONVERSATION,
    "tools": [WEATHER],
    "tool_choice": "auto",
    "response_format": RESPONSE_FORMAT,
    "max_completion_tokens": 40,
}
# What a backend cannot honour in REQUEST, and the field its 400 must name.
REFUSED: dict[str, str] = {
    "tgi": "response_format",  # TGI refuses a grammar together with tools
    "ollama": "tools",  # a strict tool: nothing in Ollama holds the arguments to the schema
    OLD_VLLM: "tool_choice",  # vLLM 0.6.3 without a tool parser cannot choose tools
}
# Where the refusal is about a form of the field, not the field: what the request sends instead.
INSTEAD: dict[str, dict[str, Any]] = {
    "ollama": {
        "tools": [{"type": "function", "function": {k: v for k, v in WEATHER["function"].items() if k != "strict"}}]
    },
}


def allowed_request(model: str) -> dict[str, Any]:
    """REQUEST less what ``model``'s backend refuses (or with the form it can honour instead)."""
    kind = model.removeprefix("chat-")
    refused = REFUSED.get(model, REFUSED.get(kind))
    body = {k: v for k, v in REQUEST.items() if k != refused}
    return {**body, **INSTEAD.get(kind, {})}


FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter", "function_call"}
MODELS = [model_of(kind) for kind in KINDS]
STREAM_MODES = {"plain": None, "stream": {}, "stream+usage": {"include_usage": True}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chat_gateway() -> AsyncIterator[ChatGateway]:
    async with start_chat_gateway() as gateway:
        yield gateway


@pytest.fixture
def gateway(chat_gateway: ChatGateway) -> ChatGateway:
    chat_gateway.reset()
    return chat_gateway


def body_for(model: str, mode: str, *, allowed: bool = False) -> dict[str, Any]:
    """REQUEST for ``model`` in a stream mode; ``allowed`` leaves out what that backend refuses."""
    body = {"model": model, **REQUEST}
    if allowed:
        body = {"model": model, **allowed_request(model)}
    options = STREAM_MODES[mode]
    if options is not None:
        body["stream"] = True
        if options:
            body["stream_options"] = options
    return body


async def post(gateway: ChatGateway, body: dict[str, Any]) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway.url}/v1/chat/completions", json=body) as resp:
            return resp.status, resp.content_type, await resp.read()


# --- the shape every backend must answer in ------------------------------------------------------------


def check_call(call: dict[str, Any]) -> None:
    assert set(call) == {"id", "type", "function"}, call  # no stream-only "index" in a whole message
    assert isinstance(call["id"], str) and call["id"] and call["type"] == "function"
    assert isinstance(call["function"]["name"], str) and call["function"]["name"]
    arguments = call["function"]["arguments"]
    assert isinstance(arguments, str), "tool-call arguments must be a JSON string, not an object"
    assert isinstance(json.loads(arguments), dict)


def check_usage(usage: dict[str, Any]) -> None:
    assert all(isinstance(usage[k], int) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def check_completion(answer: dict[str, Any], model: str) -> None:
    assert answer["object"] == "chat.completion"
    assert answer["id"].startswith("chatcmpl-") and isinstance(answer["created"], int)
    assert answer["model"] == model  # the client's name, never the upstream's
    assert [c["index"] for c in answer["choices"]] == list(range(len(answer["choices"]))) != []
    for choice in answer["choices"]:
        message = choice["message"]
        assert message["role"] == "assistant"
        assert message["content"] is None or isinstance(message["content"], str)
        for call in message.get("tool_calls") or ():
            check_call(call)
        assert choice["finish_reason"] in FINISH_REASONS
        if message.get("tool_calls"):
            assert choice["finish_reason"] == "tool_calls"
    check_usage(answer["usage"])


def check_stream(raw: bytes, model: str, include_usage: bool) -> dict[int, dict[str, Any]]:
    """The SSE rules of OpenAI's chat stream; returns the calls reassembled per choice and call index."""
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert events[-1] == b"data: [DONE]" and b"data: [DONE]" not in events[:-1]
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert len({c["created"] for c in chunks}) == 1 and {c["model"] for c in chunks} == {model}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    if include_usage:
        assert chunks[-1]["choices"] == [] and all(c["usage"] is None for c in chunks[:-1])
        check_usage(chunks[-1]["usage"])
        chunks = chunks[:-1]
    assert all(c["choices"] and c.get("usage") is None for c in chunks)  # no usage chunk unless asked
    calls: dict[int, dict[str, Any]] = {}
    finishes = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            assert choice["index"] == 0
            if choice is not chunks[0]["choices"][0]:
                assert "role" not in choice["delta"], "role after the first delta"
            for delta in choice["delta"].get("tool_calls") or ():
                assert isinstance(delta["index"], int)
                first = delta["index"] not in calls
                if first:  # id, type and name in the first delta of each call, and only there
                    assert delta["id"] and delta["type"] == "function" and delta["function"]["name"]
                    calls[delta["index"]] = {"id": delta["id"], "name": delta["function"]["name"], "arguments": ""}
                else:
                    assert "id" not in delta and "type" not in delta and "name" not in delta["function"]
                calls[delta["index"]]["arguments"] += delta["function"].get("arguments") or ""
            if choice["finish_reason"] is not None:
                finishes.append(choice["finish_reason"])
    assert len(finishes) == 1 and finishes[0] in FINISH_REASONS
    assert sorted(calls) == list(range(len(calls)))
    for call in calls.values():
        assert isinstance(json.loads(call["arguments"]), dict)  # fragments never mix between calls
    if calls:
        assert finishes == ["tool_calls"]
    return calls


# --- the tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(STREAM_MODES))
@pytest.mark.parametrize("model", [*MODELS, OLD_VLLM])
async def test_same_request_answers_or_refuses_by_name(gateway: ChatGateway, model: str, mode: str) -> None:
    status, content_type, raw = await post(gateway, body_for(model, mode))
    kind = model.removeprefix("chat-")
    refused = REFUSED.get(model, REFUSED.get(kind))
    if refused is not None:
        assert status == 400, raw
        error = json.loads(raw)["error"]
        assert error["param"] == refused and error["code"] == "unsupported_parameter"
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert all(not u.requests for u in gateway.upstreams.values()), "a refused request reached an upstream"
        return
    assert status == 200, raw
    if mode == "plain":
        assert content_type == "application/json"
        answer = json.loads(raw)
        check_completion(answer, model)
        assert answer["choices"][0]["message"].get("tool_calls"), "the golden answers call tools"
    else:
        assert content_type == "text/event-stream"
        assert check_stream(raw, model, include_usage=mode == "stream+usage")


@pytest.mark.parametrize("mode", list(STREAM_MODES))
@pytest.mark.parametrize("model", [model_of("tgi"), model_of("ollama")])
async def test_without_the_refused_field_the_shape_is_the_same(gateway: ChatGateway, model: str, mode: str) -> None:
    status, _, raw = await post(gateway, body_for(model, mode, allowed=True))
    assert status == 200, raw
    if mode == "plain":
        check_completion(json.loads(raw), model)
    else:
        check_stream(raw, model, include_usage=mode == "stream+usage")


@pytest.mark.parametrize("model", MODELS)
async def test_the_conversation_reaches_the_upstream(gateway: ChatGateway, model: str) -> None:
    """The assistant's call and the tool result arrive in the upstream's own form (nothing dropped)."""
    kind = model.removeprefix("chat-")
    status, _, raw = await post(gateway, body_for(model, "plain", allowed=True))
    assert status == 200, raw
    if kind == "mock":
        return  # in-process: no upstream to look at
    (sent,) = gateway.sent(kind)
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    (call,) = messages[2]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    arguments = call["function"]["arguments"]
    assert (json.loads(arguments) if isinstance(arguments, str) else arguments) == {"city": "Paris"}
    assert messages[3]["content"] == '{"celsius": 21}'
    if kind == "ollama":
        assert messages[3]["tool_name"] == "get_weather"  # Ollama matches results by name
    else:
        assert messages[3]["tool_call_id"] == "call_1"
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather"]
    if kind != "tgi":  # TGI got no response_format (it would refuse it with tools)
        schema = sent["format"] if kind == "ollama" else sent["response_format"]["json_schema"]["schema"]
        assert schema == RESPONSE_FORMAT["json_schema"]["schema"]  # type: ignore[index]


def client_extra(model: str) -> dict[str, Any]:
    return {k: v for k, v in allowed_request(model).items() if k != "messages"}


@pytest.mark.parametrize("model", MODELS)
async def test_openai_client_parses_and_reassembles_every_stream(chat_gateway: ChatGateway, model: str) -> None:
    """The official client parses every chunk of every backend's stream; calls reassemble by index."""
    chat_gateway.reset()
    async with openai.AsyncOpenAI(base_url=f"{chat_gateway.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
        stream = await c.chat.completions.create(
            model=model,
            messages=CONVERSATION,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
            **client_extra(model),
        )
        chunks = [chunk async for chunk in stream]
    assert {chunk.model for chunk in chunks} == {model} and len({chunk.id for chunk in chunks}) == 1
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                assert delta.function is not None
                entry["id"] += delta.id or ""
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and calls
    assert all(call["id"] and call["name"] == call["name"].strip() != "" for call in calls.values())
    assert all(isinstance(json.loads(call["arguments"]), dict) for call in calls.values())
    assert chunks[-1].usage is not None and chunks[-1].choices == []


# The client's ``stream()`` helper closes a tool call when the next index appears: it assumes
# calls arrive one after another, as OpenAI sends them. The openai/vllm/llama.cpp goldens
# interleave two calls' fragments; the gateway re-emits every chat stream with calls in order
# (backends/tool_call_order.py), so every backend type is asked to pass it.
SEQUENTIAL_CALLS = [model_of(kind) for kind in KINDS]


@pytest.mark.parametrize("model", SEQUENTIAL_CALLS)
async def test_openai_stream_helper_builds_the_final_completion(chat_gateway: ChatGateway, model: str) -> None:
    chat_gateway.reset()
    async with openai.AsyncOpenAI(base_url=f"{chat_gateway.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
        async with c.chat.completions.stream(
            model=model,
            messages=CONVERSATION,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
            **client_extra(model),
        ) as stream:
            final = await stream.get_final_completion()
    assert final.model == model and final.id.startswith("chatcmpl-")
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.role == "assistant"
    calls = choice.message.tool_calls or []
    assert calls and all(call.id and call.type == "function" for call in calls)
    # The helper parses the arguments of strict tools only (Ollama is sent a non-strict one: INSTEAD).
    strict = client_extra(model)["tools"][0]["function"].get("strict", False)
    for call in calls:
        assert isinstance(call.function.arguments, str)  # type: ignore[union-attr]
        if call.function.name == "get_weather":  # type: ignore[union-attr]  # (the goldens also call tools not offered)
            parsed = call.function.parsed_arguments  # type: ignore[union-attr]
            assert isinstance(parsed, dict) if strict else parsed is None
    assert final.usage is not None and final.usage.total_tokens > 0
