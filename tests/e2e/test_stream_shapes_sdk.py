"""Odd upstream stream shapes, read through the gateway by the official client's stream helpers.

A scripted upstream answers every backend type that speaks OpenAI's chunk shape (``openai``,
``vllm``, and the native ``tgi`` and ``llamacpp`` translators) with one shape, picked by the
user message: tool-call indexes with a gap, ``id``/``name`` repeated on every fragment, the
usage chunk before the last content chunk, no ``finish_reason`` before ``[DONE]``, a cut JSON
event carrying the upstream's exact model id. The rule (docs/api.md): what the client gets is
what ``client.chat.completions.stream()`` and the completions stream accept and build the
right answer from, or an error event naming the problem (the SDK raises ``APIError``); and a
stream that failed is not counted a success.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import serve_app

UP = "org/up-model"  # the id every route asks for and every chunk carries: the relay's fast path applies
KINDS = ("openai", "vllm", "tgi", "llamacpp")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, *, chat: bool = True) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if chat:
        choice["delta"] = delta or {}
    else:
        choice["text"] = (delta or {}).get("content", "")
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": "c-1", "object": kind, "created": 1, "model": UP, "choices": [choice]}


def _usage(chat: bool = True) -> dict[str, Any]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": "c-1", "object": kind, "created": 1, "model": UP, "choices": [], "usage": USAGE}


def _call(index: int, *, call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    out: dict[str, Any] = {"index": index, "function": function}
    if call_id is not None:
        out.update(id=call_id, type="function")
    return out


def _calls(first: int, second: int, *, repeat: bool, finish: str) -> list[dict[str, Any]]:
    """Two tool calls, each in three fragments (``repeat``: id/name on every fragment)."""
    out = [_chunk({"role": "assistant", "content": None})]
    for index, call_id, name, parts in (
        (first, "call_a", "get_weather", ['{"city', '": "Paris"', "}"]),
        (second, "call_b", "get_time", ['{"zone"', ': "UTC"', "}"]),
    ):
        for at, part in enumerate(parts):
            head = at == 0 or repeat
            call = _call(index, call_id=call_id if head else None, name=name if head else None, arguments=part)
            out.append(_chunk({"tool_calls": [call]}))
    return [*out, _chunk({}, finish), _usage()]


def _text(*, finish: bool = True, usage_first: bool = False, chat: bool = True) -> list[dict[str, Any]]:
    out = [_chunk({"role": "assistant", "content": ""}, chat=chat)] if chat else []
    out += [_chunk({"content": "Hello"}, chat=chat), _chunk({"content": " there"}, chat=chat)]
    last = _chunk({"content": "!"}, "stop" if finish else None, chat=chat)
    return [*out, _usage(chat), last] if usage_first else [*out, last, _usage(chat)]


def _events(shape: str, chat: bool) -> bytes:
    shape, _, finish = shape.partition("|")  # TGI ends a tool call with its own reason
    if shape == "gap":
        objs = _calls(0, 2, repeat=False, finish=finish or "tool_calls")
    elif shape == "repeat":
        objs = _calls(0, 1, repeat=True, finish=finish or "tool_calls")
    elif shape == "usage_first":
        objs = _text(usage_first=True, chat=chat)
    elif shape == "no_finish":
        objs = _text(finish=False, chat=chat)
    else:
        objs = _text(chat=chat)
    events = [b"data: " + orjson.dumps(o) + b"\n\n" for o in objs]
    if shape == "cut_json":
        whole = events[2]
        events[2] = whole[: whole.index(b'"finish_reason"')] + b"\n\n"  # the model key is there, the rest is not
    return b"".join(events) + b"data: [DONE]\n\n"


async def _answer(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    chat = "messages" in body
    shape = body["messages"][-1]["content"] if chat else body["prompt"]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_events(shape, chat))
    await response.write_eof()
    return response


async def _get(request: web.Request) -> web.Response:
    if request.path == "/version":
        return web.json_response({"version": "0.32.0"})
    return web.json_response({"status": "ok"})


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    upstream = web.Application()
    upstream.router.add_post("/v1/chat/completions", _answer)
    upstream.router.add_post("/v1/completions", _answer)
    upstream.router.add_get("/{tail:.*}", _get)
    up_runner, up_url = await serve_app(upstream)
    backends = [
        f"  - {{name: b-openai, type: openai, base_url: {up_url}/v1, api_key: sk-x}}",
        f"  - {{name: b-vllm, type: vllm, base_url: {up_url}/v1, tool_parser: hermes}}",
        f"  - {{name: b-tgi, type: tgi, base_url: {up_url}}}",
        f"  - {{name: b-llamacpp, type: llamacpp, base_url: {up_url}}}",
    ]
    models = [f"  - {{name: m-{k}, routes: [{{backend: b-{k}, model: {UP}}}]}}" for k in KINDS]
    text = "server: {host: 127.0.0.1, port: 0}\nbackends:\n" + "\n".join([*backends, "models:", *models]) + "\n"
    runner, url = await serve_app(create_app(parse_config(text, "<shapes>", env={})))
    try:
        yield url
    finally:
        await runner.cleanup()
        await up_runner.cleanup()


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=20) as c:
        yield c


async def _final(client: openai.AsyncOpenAI, kind: str, shape: str, **extra: Any) -> Any:
    async with client.chat.completions.stream(
        model=f"m-{kind}",
        messages=[{"role": "user", "content": shape}],
        stream_options={"include_usage": True},
        **extra,
    ) as stream:
        chunks = [event.chunk async for event in stream if event.type == "chunk"]
        return await stream.get_final_completion(), chunks


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["gap", "repeat"])
async def test_tool_calls_build_the_right_message(client: openai.AsyncOpenAI, kind: str, shape: str) -> None:
    asked = shape + ("|eos_token" if kind == "tgi" else "")
    final, chunks = await _final(client, kind, asked, tools=[WEATHER, TIME])
    calls = final.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", '{"zone": "UTC"}'),
    ]
    assert len({c.id for c in calls}) == 2
    if kind in ("openai", "vllm"):  # the upstream's own ids pass (TGI's and llama.cpp's are minted)
        assert [c.id for c in calls] == ["call_a", "call_b"]
    assert final.choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None and not chunks[-1].choices  # usage is the last chunk


@pytest.mark.parametrize("kind", KINDS)
async def test_usage_before_the_last_content_still_comes_last(client: openai.AsyncOpenAI, kind: str) -> None:
    final, chunks = await _final(client, kind, "usage_first")
    assert final.choices[0].message.content == "Hello there!"
    assert final.choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert all(chunk.usage is None for chunk in chunks[:-1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["no_finish", "cut_json"])
async def test_a_stream_that_cannot_be_repaired_ends_with_an_error_event(
    client: openai.AsyncOpenAI, base_url: str, kind: str, shape: str
) -> None:
    with pytest.raises(openai.APIError) as caught:
        await _final(client, kind, shape)
    assert ("finish" if shape == "no_finish" else "JSON") in caught.value.message


@pytest.mark.parametrize("kind", ["openai", "vllm"])
@pytest.mark.parametrize("shape", ["plain", "usage_first", "no_finish", "cut_json"])
async def test_completions_streams_hold_the_same_rules(client: openai.AsyncOpenAI, kind: str, shape: str) -> None:
    stream = await client.completions.create(
        model=f"m-{kind}", prompt=shape, stream=True, stream_options={"include_usage": True}
    )
    chunks = []
    if shape in ("no_finish", "cut_json"):
        with pytest.raises(openai.APIError):
            async for chunk in stream:
                chunks.append(chunk)
        return
    async for chunk in stream:
        chunks.append(chunk)
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == "Hello there!"
    assert [c.finish_reason for chunk in chunks for c in chunk.choices][-1] == "stop"
    assert chunks[-1].usage is not None and not chunks[-1].choices


# --- the same shapes through the Responses chat bridge (issue 21): its events are built from them ---

BRIDGED = ("vllm", "tgi", "llamacpp")  # (openai's Responses go to its own /v1/responses)
RESP_WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
RESP_TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}


async def _response_events(client: openai.AsyncOpenAI, kind: str, shape: str, **extra: Any) -> list[Any]:
    async with client.responses.stream(model=f"m-{kind}", input=shape, **extra) as stream:
        return [event async for event in stream]


@pytest.mark.parametrize("kind", BRIDGED)
@pytest.mark.parametrize("shape", ["gap", "repeat"])
async def test_responses_tool_calls_are_whole_whatever_the_indexes(
    client: openai.AsyncOpenAI, kind: str, shape: str
) -> None:
    asked = shape + ("|eos_token" if kind == "tgi" else "")
    events = await _response_events(client, kind, asked, tools=[RESP_WEATHER, RESP_TIME])
    assert events[-1].type == "response.completed"
    calls = [item for item in events[-1].response.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", '{"zone": "UTC"}'),
    ]
    assert len({c.call_id for c in calls}) == 2
    done = [e.item.model_dump() for e in events if e.type == "response.output_item.done"]
    assert done == [item.model_dump(exclude={"parsed_arguments"}) for item in events[-1].response.output]
    assert events[-1].response.usage is not None and events[-1].response.usage.output_tokens == 5


@pytest.mark.parametrize("kind", BRIDGED)
async def test_responses_usage_before_the_last_content(client: openai.AsyncOpenAI, kind: str) -> None:
    events = await _response_events(client, kind, "usage_first")
    final = events[-1].response
    assert events[-1].type == "response.completed" and final.output_text == "Hello there!"
    assert final.usage is not None and final.usage.output_tokens == 5
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "Hello there!"


@pytest.mark.parametrize("kind", BRIDGED)
@pytest.mark.parametrize("shape", ["no_finish", "cut_json"])
async def test_a_responses_stream_that_cannot_be_repaired_fails(
    client: openai.AsyncOpenAI, base_url: str, kind: str, shape: str
) -> None:
    events = await _response_events(client, kind, shape)
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.failed" and "response.completed" not in kinds
    failed = events[-1].response
    assert failed.error is not None and ("finish" if shape == "no_finish" else "JSON") in failed.error.message
    stored = await client.responses.retrieve(failed.id)  # the store keeps it failed, never completed
    assert stored.status == "failed"
