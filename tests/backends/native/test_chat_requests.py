"""OpenAI chat requests -> each server's native body (golden), and every refusal named."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import respx

from schemas.errors import InvalidRequestError, UnsupportedParameterError
from tests.backends.native.chat_helpers import LOOSE_WEATHER, TIME, USER, WEATHER, chat_call, chat_route, json_answer
from tests.backends.native.helpers import make_backend


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


async def sent_body(mock: respx.MockRouter, kind: str, **fields: Any) -> dict[str, Any]:
    route = chat_route(mock, kind).mock(return_value=json_answer(kind, "chat.json"))
    await make_backend(kind).chat(chat_call(kind, **fields))
    body: dict[str, Any] = orjson.loads(route.calls[-1].request.content)
    return body


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0}  # fmt: skip
# What a bare request (model + one user message) becomes: every OpenAI default spelled out.
BARE = {
    "tgi": {"model": "tgi", "messages": [USER], "stream": False, "temperature": 1.0},
    "ollama": {"model": "llama3.2", "messages": [USER], "stream": False, "options": {"num_predict": -1, **SAMPLING}},
    "llamacpp": {"model": "tiny.gguf", "messages": [USER], "stream": False, **SAMPLING},
}


@pytest.mark.parametrize("kind", sorted(BARE))
async def test_bare_request_spells_out_the_defaults(mock: respx.MockRouter, kind: str) -> None:
    assert await sent_body(mock, kind) == BARE[kind]


async def test_tgi_full_request(mock: respx.MockRouter) -> None:
    body = await sent_body(
        mock, "tgi", messages=[{"role": "developer", "content": "Be brief."}, USER], max_completion_tokens=9,
        temperature=0.5, top_p=0.9, seed=-1, stop="END", logprobs=True, top_logprobs=3, frequency_penalty=0.2,
        tools=[WEATHER], parallel_tool_calls=False,
    )  # fmt: skip
    assert body == {
        "model": "tgi",  # anything else selects a LoRA adapter
        "messages": [{"role": "system", "content": "Be brief."}, USER],
        "stream": False,
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 2**64 - 1,
        "frequency_penalty": 0.2,
        "stop": ["END"],
        "logprobs": True,
        "top_logprobs": 3,
        "tools": [{"type": "function", "function": {k: v for k, v in WEATHER["function"].items() if k != "strict"}}],
        "tool_choice": "auto",
    }


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"temperature": 0}, {"temperature": 0.0}),
        ({"top_p": 0.0, "seed": 3}, {"temperature": 0.0}),  # top_p 0 keeps one token: greedy, no seed
        ({"top_p": 1.0}, {"temperature": 1.0}),  # TGI refuses top_p 1.0: not sent
        (
            {"response_format": {"type": "json_object"}},
            {"response_format": {"type": "json", "value": {"type": "object"}}},
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "string"}}}},
            {"response_format": {"type": "json", "value": {"type": "string"}}},
        ),
        ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}),
    ],
)
async def test_tgi_translations(mock: respx.MockRouter, fields: dict[str, Any], expected: dict[str, Any]) -> None:
    if fields.get("stream"):
        route = chat_route(mock, "tgi")
        backend = make_backend("tgi")
        payload = backend._chat.payload(chat_call("tgi", **fields).request, "x", stream=True)  # type: ignore[union-attr]
        assert payload == {**BARE["tgi"], **expected}
        assert not route.called
        return
    body = await sent_body(mock, "tgi", **fields)
    assert body == {**BARE["tgi"], "temperature": body["temperature"], **expected}


async def test_llamacpp_tools_logprobs_and_bias(mock: respx.MockRouter) -> None:
    body = await sent_body(
        mock, "llamacpp", tools=[WEATHER], logprobs=True, logit_bias={"15": -100}, max_tokens=4, seed=-2,
        response_format={"type": "json_object"}, stop=["\n"],
    )  # fmt: skip
    assert body == {
        **BARE["llamacpp"],
        "max_tokens": 4,
        "seed": 0xFFFFFFFF - 2,
        "stop": ["\n"],
        "logprobs": True,
        "top_logprobs": 1,  # explicit: llama.cpp's default is 20, and 0 would return nothing
        "logit_bias": [[15, -100.0]],
        "tools": [WEATHER],
        "tool_choice": "auto",
        "parallel_tool_calls": True,  # OpenAI's default; llama.cpp's is false
        "response_format": {"type": "json_object"},
    }


async def test_llamacpp_parallel_false_and_required_pass(mock: respx.MockRouter) -> None:
    body = await sent_body(mock, "llamacpp", tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ("required", False)


async def test_ollama_conversation_with_tool_result_and_image(mock: respx.MockRouter) -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": [
            {"type": "text", "text": "Weather here?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip
    body = await sent_body(
        mock, "ollama", messages=messages, tools=[LOOSE_WEATHER], max_tokens=7, stop="x", seed=4,
        logprobs=True, top_logprobs=2, response_format={"type": "json_object"}, reasoning_effort="none",
    )  # fmt: skip
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather here?", "images": ["iVBORw0KGgo="]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather", "tool_call_id": "call_1"},
    ]  # fmt: skip
    assert body["tools"] == [LOOSE_WEATHER]
    assert body["options"] == {"num_predict": 7, **SAMPLING, "stop": ["x"], "seed": 4}
    assert (body["logprobs"], body["top_logprobs"], body["format"], body["think"]) == (True, 2, "json", False)


async def test_ollama_json_schema_format_and_tool_choice_none(mock: respx.MockRouter) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    body = await sent_body(mock, "ollama", response_format=rf)
    assert body["format"] == schema
    assert "tools" not in await sent_body(mock, "ollama", tools=[LOOSE_WEATHER], tool_choice="none")


# --- refusals: each named --------------------------------------------------------------------------

# A strict tool whose parameters lean on $defs: TGI's tool grammar copies only properties and required.
STRICT_WITH_DEFS: dict[str, Any] = {"type": "function", "function": {"name": "get_place", "strict": True,
    "parameters": {"type": "object", "properties": {"where": {"$ref": "#/$defs/city"}}, "required": ["where"],
                   "additionalProperties": False, "$defs": {"city": {"type": "string"}}}}}  # fmt: skip
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    ("tgi", {"presence_penalty": 0.5}, "presence_penalty", "presence_penalty + 2"),
    ("tgi", {"logit_bias": {"1": 1.0}}, "logit_bias", "does not apply it"),
    ("tgi", {"logprobs": True, "top_logprobs": 6}, "top_logprobs", "at most"),
    ("tgi", {"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format", "grammar and tools"),
    ("tgi", {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": True}, "parallel_tool_calls",
     "at most one tool call"),
    ("tgi", {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA==",
     "format": "wav"}}]}]}, "messages", "input_audio"),
    ("ollama", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
     "url": "https://x.test/a.png"}}]}]}, "messages", "data: URLs"),
    ("ollama", {"tools": [WEATHER], "tool_choice": "required"}, "tool_choice", "cannot force"),
    ("ollama", {"tools": [WEATHER], "parallel_tool_calls": False}, "parallel_tool_calls", "one tool call"),
    ("ollama", {"tools": [WEATHER]}, "tools", "parses calls from the model's text"),
    ("ollama", {"tools": [TIME, WEATHER], "tool_choice": "none"}, "tools", "nothing holds the arguments"),
    ("tgi", {"tools": [STRICT_WITH_DEFS]}, "tools", "cannot hold $defs of get_place's parameters"),
    ("tgi", {"tools": [{**STRICT_WITH_DEFS, "function": {**STRICT_WITH_DEFS["function"], "parameters": {
     "anyOf": [{"type": "object"}]}}}]}, "tools", "cannot hold anyOf"),
    ("ollama", {"reasoning_effort": "minimal"}, "reasoning_effort", "none, low, medium or high"),
    ("ollama", {"messages": [{"role": "user", "content": "hi", "name": "ann"}]}, "messages", "participant names"),
    ("ollama", {"logit_bias": {"1": 1.0}}, "logit_bias", "ollama"),
    ("llamacpp", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "tool_choice", "downgrade"),
    ("llamacpp", {"tools": [WEATHER], "logprobs": True, "stream": True}, "stream", "logprobs together with tools"),
    ("llamacpp", {"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages", "function role"),
    ("llamacpp", {"messages": [USER, {"role": "assistant", "audio": {"id": "a1"}}]}, "messages", "audio"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "fields", "param", "why"), REFUSALS)
async def test_refusals_name_the_field(
    mock: respx.MockRouter, kind: str, fields: dict[str, Any], param: str, why: str
) -> None:
    route = chat_route(mock, kind)
    backend = make_backend(kind)
    call = chat_call(kind, **fields)
    with pytest.raises(UnsupportedParameterError) as caught:
        await (backend.chat_stream(call) if call.request.stream else backend.chat(call))
    assert caught.value.param == param and why.lower() in caught.value.message.lower()
    assert not route.called  # refused before anything was sent


@pytest.mark.parametrize(
    ("messages", "why"),
    [
        ([USER, {"role": "tool", "tool_call_id": "nope", "content": "x"}], "matches no earlier assistant tool call"),
        ([USER, {"role": "assistant", "tool_calls": [{**TOOL_CALL, "function": {"name": "f", "arguments": "[1]"}}]}],
         "must be a JSON object"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,raw"}}]}], "base64"),
    ],
)  # fmt: skip
async def test_ollama_messages_it_cannot_translate(mock: respx.MockRouter, messages: list[Any], why: str) -> None:
    route = chat_route(mock, "ollama")
    with pytest.raises(InvalidRequestError, match=why) as caught:
        await make_backend("ollama").chat(chat_call("ollama", messages=messages))
    assert caught.value.param == "messages" and not route.called


# --- a function tool's strict: true ----------------------------------------------------------------


async def test_tgi_strict_tool_is_sent_without_strict(mock: respx.MockRouter) -> None:
    """TGI has no strict key; its grammar holds the arguments to properties + required anyway."""
    strict = {"type": "function", "function": {**LOOSE_WEATHER["function"], "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False, "title": "W", "description": "d"}}}  # fmt: skip
    body = await sent_body(mock, "tgi", tools=[strict])
    assert body["tools"] == [{"type": "function", "function": {k: v for k, v in strict["function"].items()
                                                               if k != "strict"}}]  # fmt: skip


async def test_tgi_non_strict_tool_with_defs_is_not_refused(mock: respx.MockRouter) -> None:
    """Without strict nothing was promised: the $defs refusal is about strict only."""
    loose = {"type": "function", "function": {k: v for k, v in STRICT_WITH_DEFS["function"].items() if k != "strict"}}
    assert (await sent_body(mock, "tgi", tools=[loose]))["tools"] == [loose]


async def test_llamacpp_strict_tool_is_sent_as_is(mock: respx.MockRouter) -> None:
    """llama.cpp ignores the key (its grammar follows the parameters either way); sent as the client wrote it."""
    assert (await sent_body(mock, "llamacpp", tools=[WEATHER]))["tools"] == [WEATHER]
