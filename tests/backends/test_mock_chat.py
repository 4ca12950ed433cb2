"""The chat simulator: determinism, limits, logprobs, schema-valid tool arguments and JSON replies,
and streams that follow OpenAI's chunk rules and reassemble into exactly the non-streamed answer."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel, Field

from backends.mock import MOCK_CONTEXT_LENGTH
from backends.mock.capabilities import MOCK_CHAT
from backends.mock.chat import chat_chunks, complete_chat, stream_chat
from schemas.chat import ChatCompletionRequest
from schemas.chat_responses import ChatCompletionChunk as OurChunk
from schemas.chat_responses import ChatCompletionResponse as OurResponse
from schemas.errors import InvalidRequestError

USER = {"role": "user", "content": "What is the weather in Oslo?"}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 2, "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


def fn(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


TOOLS = [fn("get_weather", WEATHER), fn("get_time", {"type": "object", "properties": {"tz": {"type": "string"}}})]


def req(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [USER], **fields})


def answer(**fields: Any) -> dict[str, Any]:
    body = complete_chat(req(**fields), "public-name", completion_id="chatcmpl-x", created=1)
    ChatCompletion.model_validate(body)  # the official client's type accepts it
    assert OurResponse.model_validate(body).model_dump(exclude_unset=True) == body  # and our typed model, losslessly
    return body


# --- determinism ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields", [{}, {"seed": 7, "n": 3}, {"tools": TOOLS}, {"response_format": {"type": "json_object"}}]
)
def test_same_request_same_answer(fields: dict[str, Any]) -> None:
    assert answer(**fields) == answer(**fields)
    first, second = complete_chat(req(**fields), "m"), complete_chat(req(**fields), "m")
    assert first["choices"] == second["choices"] and first["usage"] == second["usage"]


def test_seed_and_messages_change_the_answer() -> None:
    base = answer(seed=1)["choices"][0]["message"]["content"]
    assert answer(seed=2)["choices"][0]["message"]["content"] != base
    other = complete_chat(
        ChatCompletionRequest.model_validate({"model": "m", "seed": 1, "messages": [{"role": "user", "content": "x"}]}),
        "m",
    )
    assert other["choices"][0]["message"]["content"] != base


def test_choices_differ_unless_greedy() -> None:
    sampled = [c["message"]["content"] for c in answer(n=3, seed=5)["choices"]]
    greedy = [c["message"]["content"] for c in answer(n=3, seed=5, temperature=0)["choices"]]
    assert len(set(sampled)) == 3
    assert len(set(greedy)) == 1
    assert [c["index"] for c in answer(n=3)["choices"]] == [0, 1, 2]


def test_model_is_the_public_name_and_shape() -> None:
    body = answer()
    assert body["model"] == "public-name" and body["object"] == "chat.completion" and body["id"] == "chatcmpl-x"
    [choice] = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    assert choice["logprobs"] is None and "tool_calls" not in choice["message"]
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


# --- limits, stop, logprobs -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("limit", [0, 1, 3])
def test_max_tokens_cut_the_answer(name: str, limit: int) -> None:
    body = answer(**{name: limit}, logprobs=True)
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["content"]) == limit == body["usage"]["completion_tokens"]
    assert choice["message"]["content"] == "".join(e["token"] for e in choice["logprobs"]["content"])


@pytest.mark.parametrize(("fields", "tokens", "finish"), [
    ({"ignore_eos": True, "max_completion_tokens": 64}, 64, "length"),
    ({"ignore_eos": True, "max_tokens": 200}, 200, "length"),
    ({"min_tokens": 40}, 40, "stop"),
    ({"min_tokens": 40, "max_tokens": 50}, 40, "stop"),
])  # fmt: skip
def test_min_tokens_and_ignore_eos_lengthen_text(fields: dict[str, Any], tokens: int, finish: str) -> None:
    body = answer(**fields, seed=1)
    assert body["choices"][0]["finish_reason"] == finish
    assert body["usage"]["completion_tokens"] == tokens
    assert len(answer(seed=1)["choices"][0]["message"]["content"].split()) < 25  # without them: a short reply


def test_max_tokens_cut_tool_arguments() -> None:
    body = answer(tools=TOOLS, tool_choice="required", max_completion_tokens=4)
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4


def test_stop_cuts_before_the_sequence() -> None:
    full = answer(seed=3)["choices"][0]["message"]["content"]
    word = full.split()[3]
    body = answer(seed=3, stop=["zzz", " " + word])
    [choice] = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == full[: full.index(" " + word)]
    assert body["usage"]["completion_tokens"] == 4  # through the token that completed the stop sequence


@pytest.mark.parametrize("k", [None, 0, 1, 5, 20])
def test_logprobs_chat_shape(k: int | None) -> None:
    body = answer(logprobs=True, top_logprobs=k, seed=11)
    [choice] = body["choices"]
    entries = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None
    assert "".join(e["token"] for e in entries) == choice["message"]["content"]
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode()) and entry["logprob"] < 0
        assert len(entry["top_logprobs"]) == (k or 0)
        if k:
            assert entry["top_logprobs"][0]["token"] == entry["token"]
            assert max(t["logprob"] for t in entry["top_logprobs"]) == entry["logprob"]
    # logprobs never change the text
    assert choice["message"]["content"] == answer(seed=11)["choices"][0]["message"]["content"]


def test_context_length_refused_naming_the_field() -> None:
    with pytest.raises(InvalidRequestError) as info:
        complete_chat(req(max_completion_tokens=MOCK_CONTEXT_LENGTH), "m")
    assert info.value.param == "max_completion_tokens"
    # Without a limit, a prompt that fills the window alone is refused as vLLM refuses it, never
    # answered with an empty 'length' choice the client did not ask to cut.
    with pytest.raises(InvalidRequestError) as info:
        complete_chat(req(messages=[{"role": "user", "content": "word " * MOCK_CONTEXT_LENGTH}]), "m")
    assert info.value.param == "messages" and "input tokens" in info.value.message


# --- tool calls -------------------------------------------------------------------------------


class Address(BaseModel):
    street: str
    zip_code: str = Field(min_length=5, max_length=5)


class Order(BaseModel):
    """A pydantic model's schema: $defs, $ref, anyOf with null, arrays, enums, bounds."""

    id: int = Field(ge=1000, lt=10000)
    total: float = Field(gt=0, le=500)
    paid: bool
    status: str = Field(json_schema_extra={"enum": ["new", "sent"]})
    ship_to: Address
    billing: Address | None = None
    tags: list[str] = Field(min_length=1, max_length=4)
    lines: list[Address] = Field(default_factory=list)


SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("weather", WEATHER),
    ("pydantic", Order.model_json_schema()),
    ("empty", {"type": "object", "properties": {}}),
    ("nested", {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "array", "items": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, "minItems": 2}},
        "required": ["b"]}}, "required": ["a"]}),
    ("types", {"type": "object", "required": ["n", "c", "d", "u"], "properties": {
        "n": {"type": ["null", "integer"], "multipleOf": 5, "minimum": 3}, "c": {"const": "x"},
        "d": {"type": "string", "format": "date-time"},
        "u": {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True, "maxItems": 3}}}),
    ("all-of", {"allOf": [{"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]},
                          {"properties": {"y": {"type": "integer", "maximum": -5}}, "required": ["y"]}]}),
]  # fmt: skip


@pytest.mark.parametrize("schema", [s for _, s in SCHEMAS], ids=[n for n, _ in SCHEMAS])
def test_tool_arguments_validate_against_the_schema(schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    for seed in range(40):
        body = answer(tools=[fn("f", schema)], tool_choice="required", seed=seed)
        [choice] = body["choices"]
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "f" and call["type"] == "function" and call["id"].startswith("call_")
        validator.validate(json.loads(call["function"]["arguments"]))


@pytest.mark.parametrize("schema", [s for _, s in SCHEMAS], ids=[n for n, _ in SCHEMAS])
def test_json_schema_replies_validate(schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    for seed in range(20):
        fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}
        [choice] = answer(response_format=fmt, seed=seed)["choices"]
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
        validator.validate(json.loads(choice["message"]["content"]))


def test_json_object_reply_is_an_object() -> None:
    [choice] = answer(response_format={"type": "json_object"})["choices"]
    assert isinstance(json.loads(choice["message"]["content"]), dict)


def names(body: dict[str, Any]) -> list[str] | None:
    calls = body["choices"][0]["message"].get("tool_calls")
    return None if calls is None else sorted(c["function"]["name"] for c in calls)


TOOL_RESULT = [
    USER,
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "expected", "finish"),
    [
        ({"tools": TOOLS}, ["get_time", "get_weather"], "tool_calls"),  # auto by default, parallel by default
        ({"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False}, 1, "tool_calls"),
        ({"tools": TOOLS, "tool_choice": "none"}, None, "stop"),
        ({"tools": TOOLS, "messages": TOOL_RESULT}, None, "stop"),  # auto after a tool result: answer in text
        ({"tools": TOOLS, "messages": TOOL_RESULT, "tool_choice": "required"}, ["get_time", "get_weather"],
         "tool_calls"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, ["get_time"], "stop"),
        ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "get_weather"}}]}}}, ["get_weather"], "tool_calls"),
        ({"tools": [fn("get_weather", WEATHER)]}, ["get_weather"], "tool_calls"),
        ({"tools": [fn("bare")], "tool_choice": "required"}, ["bare"], "tool_calls"),
    ],
)  # fmt: skip
def test_tool_choice_decides_the_calls(fields: dict[str, Any], expected: Any, finish: str) -> None:
    body = answer(**fields)
    found = names(body)
    if isinstance(expected, int):
        assert found is not None and len(found) == expected
    else:
        assert found == expected
    assert body["choices"][0]["finish_reason"] == finish
    if found:
        message = body["choices"][0]["message"]
        assert message["content"] is None
        assert len({c["id"] for c in message["tool_calls"]}) == len(found)


# --- streaming ----------------------------------------------------------------------------------

STREAM_CASES: list[dict[str, Any]] = [
    {},
    {"n": 3, "logprobs": True, "top_logprobs": 2, "stop": "."},
    {"tools": TOOLS, "n": 2},
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": Order.model_json_schema()}}},
    {"max_completion_tokens": 2},
    {"max_completion_tokens": 64, "ignore_eos": True},
    {"tools": TOOLS, "tool_choice": "required", "max_tokens": 5},
]


def reassemble(chunks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Chunks back into choices the way a careful client does, asserting OpenAI's rules on the way."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert OurChunk.model_validate(chunk).model_dump(exclude_unset=True) == chunk
        assert chunk["object"] == "chat.completion.chunk"
        if chunk["usage"] is not None:
            assert chunk["choices"] == [] and usage is None
            usage = chunk["usage"]
            continue
        [entry] = chunk["choices"]
        delta = entry["delta"]
        state = choices.get(entry["index"])
        if state is None:
            assert delta["role"] == "assistant"
            state = choices[entry["index"]] = {
                "content": delta["content"],
                "calls": {},
                "logprobs": None,
                "finish": None,
            }
        else:
            assert "role" not in delta and state["finish"] is None
        if delta.get("content"):
            state["content"] += delta["content"]
        for piece in delta.get("tool_calls", ()):
            call = state["calls"].get(piece["index"])
            if call is None:
                assert piece["type"] == "function" and piece["id"] and piece["function"]["name"]
                assert piece["index"] == len(state["calls"])  # new calls get the next index
                state["calls"][piece["index"]] = {
                    "id": piece["id"], "type": "function", "function": {"name": piece["function"]["name"],
                                                                        "arguments": piece["function"]["arguments"]},
                }  # fmt: skip
            else:
                assert set(piece) == {"index", "function"} and set(piece["function"]) == {"arguments"}
                call["function"]["arguments"] += piece["function"]["arguments"]
        if entry["logprobs"] is not None:
            state["logprobs"] = state["logprobs"] or {"content": [], "refusal": None}
            state["logprobs"]["content"] += entry["logprobs"]["content"]
        state["finish"] = entry["finish_reason"] or state["finish"]
    out = []
    for index in sorted(choices):
        state = choices[index]
        message: dict[str, Any] = {"role": "assistant", "content": state["content"], "refusal": None}
        if state["calls"]:
            message["tool_calls"] = [state["calls"][i] for i in sorted(state["calls"])]
        out.append(
            {"index": index, "message": message, "logprobs": state["logprobs"], "finish_reason": state["finish"]}
        )
    return out, usage


@pytest.mark.parametrize("fields", STREAM_CASES, ids=[str(sorted(f)) for f in STREAM_CASES])
@pytest.mark.parametrize("include_usage", [True, False])
def test_stream_reassembles_to_the_answer(fields: dict[str, Any], include_usage: bool) -> None:
    streamed = req(**fields, stream=True, stream_options={"include_usage": include_usage})
    chunks = chat_chunks(streamed, "public-name")
    assert len({(c["id"], c["created"]) for c in chunks}) == 1
    assert all(c["model"] == "public-name" for c in chunks)
    choices, usage = reassemble(chunks)
    body = answer(**fields)
    for choice in body["choices"]:  # a tool-call answer streams logprobs only for content
        if choice["logprobs"] == {"content": [], "refusal": None}:
            choice["logprobs"] = None
    assert choices == body["choices"]
    if include_usage:
        assert chunks[-1]["choices"] == [] and usage == body["usage"]
        assert all(c["usage"] is None for c in chunks[:-1])
    else:
        assert usage is None


async def test_stream_chat_sse_bytes_end_with_done() -> None:
    request = req(tools=TOOLS, stream=True, stream_options={"include_usage": True})
    events = [e async for e in stream_chat(request, "m", completion_id="chatcmpl-1", created=5)]
    assert events[-1] == b"data: [DONE]\n\n"
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks == chat_chunks(request, "m", completion_id="chatcmpl-1", created=5)
    assert [e async for e in stream_chat(request, "m", done=False)][-1] != b"data: [DONE]\n\n"


def test_parallel_calls_stream_one_after_the_other_with_stable_indices() -> None:
    chunks = chat_chunks(req(tools=TOOLS, stream=True), "m")
    indices = [p["index"] for c in chunks for e in c["choices"] for p in e["delta"].get("tool_calls", ())]
    assert indices[0] == 0 and sorted(set(indices)) == [0, 1]
    assert indices == sorted(indices)  # never interleaved: a client that appends by index reads two clean calls
    firsts = [p for c in chunks for e in c["choices"] for p in e["delta"].get("tool_calls", ()) if "id" in p]
    assert [p["index"] for p in firsts] == [0, 1]


# --- capability table -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": 5}, "top_k"),
        ({"ignore_eos": True, "min_tokens": 3}, None),
        ({"modalities": ["text", "audio"], "audio": {"voice": "a", "format": "wav"}}, "modalities"),
        ({"tools": [{"type": "custom", "custom": {"name": "g"}}]}, "tools"),
        ({"tools": TOOLS, "tool_choice": "required"}, None),
        ({"response_format": {"type": "json_object"}, "logprobs": True, "seed": 1, "store": True}, None),
    ],
)  # fmt: skip
def test_mock_chat_table(fields: dict[str, Any], param: str | None) -> None:
    found = MOCK_CHAT.first_refusal(req(**fields))
    assert (found.param if found else None) == param
