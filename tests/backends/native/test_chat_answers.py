"""Native chat answers -> OpenAI's ``chat.completion`` / ``chat.completion.chunk``, on golden payloads.

Every server's golden answer (tests/fixtures/native/<server>/chat*) replies to one request
(:data:`GOLDEN_CHAT`): the client must get the *same* OpenAI answer from each.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
import respx

from backends.errors import UpstreamProtocolError
from tests.backends.native.chat_helpers import (
    GOLDEN_CHAT,
    GOLDEN_LOGPROBS,
    GOLDEN_USAGE,
    LOOSE_WEATHER,
    TIME,
    WEATHER,
    chat_call,
    chat_route,
    json_answer,
    reassemble,
    stream_answer,
)
from tests.backends.native.helpers import KINDS, drain, make_backend


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_answer_is_openai_chat_completion(mock: respx.MockRouter, kind: str) -> None:
    chat_route(mock, kind).mock(return_value=json_answer(kind, "chat.json"))
    result = await make_backend(kind).chat(chat_call(kind, **GOLDEN_CHAT))
    body = orjson.loads(result.body)
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) > 9  # TGI's "" is never passed on
    assert body["object"] == "chat.completion" and body["model"] == "public"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris.", "refusal": None},
            "logprobs": GOLDEN_LOGPROBS,
            "finish_reason": "stop",  # TGI's eos_token included
        }
    ]
    assert body["usage"] == GOLDEN_USAGE and result.usage is not None
    assert result.answer == body  # the object goes with the bytes: the Responses bridge reads it, no second parse


@pytest.mark.parametrize("piece", [0, 7])
async def test_stream_is_openai_chunks(mock: respx.MockRouter, kind: str, piece: int) -> None:
    chat_route(mock, kind).mock(return_value=stream_answer(kind, "chat_stream", piece=piece))
    call = chat_call(kind, **GOLDEN_CHAT, stream=True, stream_options={"include_usage": True})
    stream = await make_backend(kind).chat_stream(call)
    events = await drain(stream)
    *chunks, last = events
    assert {(e["id"], e["created"], e["object"], e["model"]) for e in events} == {
        (events[0]["id"], events[0]["created"], "chat.completion.chunk", "public")
    }
    assert events[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert all(c["usage"] is None for c in chunks)
    assert last == {**last, "choices": [], "usage": GOLDEN_USAGE}
    got = reassemble(chunks)
    assert got[0]["content"] == "Paris." and got[0]["finish"] == "stop"
    assert got[0]["logprobs"] == GOLDEN_LOGPROBS["content"]


async def test_stream_without_include_usage_has_no_usage_chunk(mock: respx.MockRouter, kind: str) -> None:
    chat_route(mock, kind).mock(return_value=stream_answer(kind, "chat_stream"))
    stream = await make_backend(kind).chat_stream(chat_call(kind, **GOLDEN_CHAT, stream=True))
    events = await drain(stream)
    assert all(e["choices"] for e in events)
    assert stream.usage is not None and stream.usage.completion_tokens == 2  # still counted for metrics


async def test_error_mid_stream_ends_with_the_upstream_error(mock: respx.MockRouter, kind: str) -> None:
    chat_route(mock, kind).mock(return_value=stream_answer(kind, "chat_stream_error"))
    stream = await make_backend(kind).chat_stream(chat_call(kind, stream=True))
    raw = b""
    with pytest.raises(UpstreamProtocolError) as caught:
        async for chunk in stream:
            raw += chunk
    await stream.aclose()
    assert b'"content":"Paris"' in raw  # what came before the error reached the client
    assert caught.value.reason == "stream_error"
    assert {"tgi": "CUDA out of memory", "ollama": "unexpected EOF", "llamacpp": "decode the batch"}[
        kind
    ] in caught.value.message


@pytest.mark.parametrize("kind", ["ollama", "llamacpp"])
@pytest.mark.parametrize("piece", [0, 11])
async def test_two_parallel_tool_calls_streamed_never_mix(mock: respx.MockRouter, kind: str, piece: int) -> None:
    chat_route(mock, kind).mock(return_value=stream_answer(kind, "chat_tools_stream", piece=piece))
    weather = LOOSE_WEATHER if kind == "ollama" else WEATHER
    call = chat_call(kind, tools=[weather, TIME], stream=True, stream_options={"include_usage": True})
    events = await drain(await make_backend(kind).chat_stream(call))
    got = reassemble(events[:-1])[0]
    calls = got["calls"]
    assert [calls[i]["name"] for i in (0, 1)] == ["get_weather", "get_time"]
    assert orjson.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert orjson.loads(calls[1]["arguments"]) == {"tz": "Europe/Paris"}
    assert calls[0]["id"] != calls[1]["id"] and all(c["id"] for c in calls.values())
    if kind == "llamacpp":
        assert [calls[0]["id"], calls[1]["id"]] == ["abc123", "def456"]  # the server's ids kept
    assert got["finish"] == "tool_calls" and got["content"] == ""
    assert events[-1]["usage"] == {"prompt_tokens": 140, "completion_tokens": 25, "total_tokens": 165}


async def test_ollama_tool_calls_get_string_arguments_and_stable_ids(mock: respx.MockRouter) -> None:
    chat_route(mock, "ollama").mock(return_value=json_answer("ollama", "chat_tools.json"))
    backend = make_backend("ollama")
    first = orjson.loads((await backend.chat(chat_call("ollama", tools=[LOOSE_WEATHER, TIME]))).body)
    again = orjson.loads((await backend.chat(chat_call("ollama", tools=[LOOSE_WEATHER, TIME]))).body)
    message = first["choices"][0]["message"]
    assert message["content"] is None and first["choices"][0]["finish_reason"] == "tool_calls"
    # In list order; a whole message's calls have no "index" (OpenAI's shape: that key is for stream deltas).
    assert [(c["id"], c["type"], c["function"]) for c in message["tool_calls"]] == [
        ("call_x1", "function", {"name": "get_weather", "arguments": '{"city":"Paris"}'}),
        (message["tool_calls"][1]["id"], "function", {"name": "get_time", "arguments": '{"tz":"Europe/Paris"}'}),
    ]
    assert all("index" not in c for c in message["tool_calls"])
    assert message["tool_calls"][1]["id"].startswith("call_")
    assert again["choices"][0]["message"]["tool_calls"] == message["tool_calls"]  # minted ids are stable


async def test_tgi_tool_call_object_arguments_and_minted_id(mock: respx.MockRouter) -> None:
    chat_route(mock, "tgi").mock(return_value=json_answer("tgi", "chat_tool.json"))
    body = orjson.loads((await make_backend("tgi").chat(chat_call("tgi", tools=[WEATHER]))).body)
    choice = body["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["id"] != "0"  # TGI's "0" is not unique
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert choice["finish_reason"] == "tool_calls"  # TGI says eos_token, never tool_calls


async def test_tgi_named_choice_finishes_with_stop(mock: respx.MockRouter) -> None:
    chat_route(mock, "tgi").mock(return_value=json_answer("tgi", "chat_tool.json"))
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = orjson.loads((await make_backend("tgi").chat(chat_call("tgi", tools=[WEATHER], tool_choice=choice))).body)
    assert body["choices"][0]["finish_reason"] == "stop"  # as OpenAI answers a call forced by name


async def test_tgi_streamed_tool_call_has_name_and_id_once(mock: respx.MockRouter) -> None:
    chat_route(mock, "tgi").mock(return_value=stream_answer("tgi", "chat_tool_stream"))
    events = await drain(await make_backend("tgi").chat_stream(chat_call("tgi", tools=[WEATHER], stream=True)))
    got = reassemble(events)[0]  # asserts id/name only in the first delta of the call
    assert got["calls"][0]["name"] == "get_weather" and got["calls"][0]["id"].startswith("call_")
    assert orjson.loads(got["calls"][0]["arguments"]) == {"city": "Paris"}
    assert got["finish"] == "tool_calls"


async def test_ollama_load_is_an_error_not_a_stop(mock: respx.MockRouter) -> None:
    chat_route(mock, "ollama").mock(return_value=json_answer("ollama", "chat_load.json"))
    with pytest.raises(UpstreamProtocolError, match="loaded the model") as caught:
        await make_backend("ollama").chat(chat_call("ollama"))
    assert caught.value.reason == "no_answer"


async def test_ollama_cache_hit_estimates_prompt_tokens(mock: respx.MockRouter) -> None:
    chat_route(mock, "ollama").mock(return_value=json_answer("ollama", "chat_cached.json"))
    body = orjson.loads((await make_backend("ollama").chat(chat_call("ollama"))).body)
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] == 2


async def test_logprobs_asked_and_missing_is_an_error(mock: respx.MockRouter) -> None:
    chat_route(mock, "ollama").mock(return_value=json_answer("ollama", "chat_cached.json"))
    with pytest.raises(UpstreamProtocolError) as caught:
        await make_backend("ollama").chat(chat_call("ollama", logprobs=True))
    assert caught.value.param == "logprobs"


@pytest.mark.parametrize("stream", [False, True])
async def test_n_fans_out_with_indexes_and_summed_usage(mock: respx.MockRouter, kind: str, stream: bool) -> None:
    route = chat_route(mock, kind)
    fields = {**GOLDEN_CHAT, "n": 3, "seed": 5, "temperature": 0.7}
    if stream:
        route.side_effect = lambda request: stream_answer(kind, "chat_stream")
        call = chat_call(kind, **fields, stream=True, stream_options={"include_usage": True})
        events = await drain(await make_backend(kind).chat_stream(call))
        assert len({e["id"] for e in events}) == 1
        got = reassemble(events[:-1])
        assert sorted(got) == [0, 1, 2] and {g["content"] for g in got.values()} == {"Paris."}
        usage = events[-1]["usage"]
    else:
        route.side_effect = lambda request: json_answer(kind, "chat.json")
        body = orjson.loads((await make_backend(kind).chat(chat_call(kind, **fields))).body)
        assert [c["index"] for c in body["choices"]] == [0, 1, 2]
        usage = body["usage"]
    assert route.call_count == 3
    sent = [orjson.loads(c.request.content) for c in route.calls]
    assert all("n" not in body for body in sent)  # TGI ignores n, llama.cpp refuses it: never sent
    seeds = sorted((b.get("options") or b).get("seed") for b in sent)
    assert seeds == [5, 6, 7]  # each choice its own seed, part 0 the client's
    assert usage == {"prompt_tokens": 14, "completion_tokens": 6, "total_tokens": 20}  # prompt once


async def test_greedy_n_sends_one_request_and_bills_every_choice(mock: respx.MockRouter, kind: str) -> None:
    route = chat_route(mock, kind).mock(return_value=json_answer(kind, "chat.json"))
    body = orjson.loads((await make_backend(kind).chat(chat_call(kind, **GOLDEN_CHAT, n=2, temperature=0))).body)
    assert route.call_count == 1 and [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 4
