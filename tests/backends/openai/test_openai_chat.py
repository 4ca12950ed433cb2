"""``OpenAIBackend.chat`` / ``chat_stream`` against a respx-mocked OpenAI upstream (httpx transport)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import ChatCall
from backends.errors import UpstreamError, UpstreamStatusError
from backends.openai.adapter import OpenAIBackend
from backends.openai.capabilities import OPENAI_CHAT
from backends.openai.chat import chat_refusal
from schemas.chat import ChatCompletionRequest
from schemas.config import OpenAIBackendConfig
from schemas.endpoints import Endpoint

URL = "http://openai.test/v1"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


def backend(**extra: Any) -> OpenAIBackend:
    data = {"type": "openai", "name": "oa", "base_url": URL, "api_key": "sk-secret", "transport": "httpx", **extra}
    return OpenAIBackend(OpenAIBackendConfig.model_validate(data))


def call(**fields: Any) -> ChatCall:
    request = ChatCompletionRequest.model_validate({"model": "public", "messages": MESSAGES, **fields})
    return ChatCall(request, "gpt-upstream", "public", "req-1")


def body(**extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-upstream-2025",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi", "refusal": None}, "logprobs": None,
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        **extra,
    }  # fmt: skip


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    obj = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-upstream",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}  # fmt: skip
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_openai_serves_chat() -> None:
    assert Endpoint.CHAT in OpenAIBackend.endpoints
    assert backend().chat_capabilities is OPENAI_CHAT


@pytest.mark.parametrize(
    ("setting", "client", "sent"),
    [
        (None, {"max_tokens": 5}, {"max_completion_tokens": 5}),
        (None, {"max_completion_tokens": 5}, {"max_completion_tokens": 5}),
        ("max_tokens", {"max_completion_tokens": 5}, {"max_tokens": 5}),
        ("max_tokens", {"max_tokens": 5}, {"max_tokens": 5}),
    ],
)
async def test_output_limit_under_the_upstreams_name(
    mock: respx.MockRouter, setting: str | None, client: dict[str, Any], sent: dict[str, Any]
) -> None:
    route = mock.post(f"{URL}/chat/completions").mock(return_value=httpx.Response(200, json=body()))
    b = backend(**({"chat_max_tokens_field": setting} if setting else {}))
    await b.chat(call(**client, temperature=0.5))
    assert orjson.loads(route.calls.last.request.content) == {
        "model": "gpt-upstream", "messages": MESSAGES, "temperature": 0.5, **sent
    }  # fmt: skip
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-secret"
    await b.close()


async def test_non_stream_keeps_openais_shape_with_the_public_name(mock: respx.MockRouter) -> None:
    mock.post(f"{URL}/chat/completions").mock(return_value=httpx.Response(200, json=body(service_tier="default")))
    result = await backend().chat(call())
    assert orjson.loads(result.body) == {**body(service_tier="default"), "model": "public"}
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 1)


async def test_error_answer_names_the_field(mock: respx.MockRouter) -> None:
    error = {"error": {"message": "Unsupported value: 'temperature'", "type": "invalid_request_error",
                       "param": "temperature", "code": "unsupported_value"}}  # fmt: skip
    mock.post(f"{URL}/chat/completions").mock(return_value=httpx.Response(400, json=error))
    with pytest.raises(UpstreamStatusError) as info:
        await backend().chat(call(temperature=0.5))
    assert info.value.status == 400 and info.value.param == "temperature"


async def stream_through(mock: respx.MockRouter, events: bytes, **fields: Any) -> tuple[list[Any], Any, dict[str, Any]]:
    route = mock.post(f"{URL}/chat/completions").mock(
        return_value=httpx.Response(200, content=events, headers={"Content-Type": "text/event-stream"})
    )
    stream = await backend().chat_stream(call(stream=True, **fields))
    out = b"".join([block async for block in stream])
    await stream.aclose()
    parsed = [orjson.loads(e.removeprefix(b"data: ")) for e in out.split(b"\n\n") if e]
    return parsed, stream.usage, orjson.loads(route.calls.last.request.content)


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


async def test_stream_usage_asked_for_metrics_and_dropped(mock: respx.MockRouter) -> None:
    usage_chunk = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-upstream","choices":[],'
    events = (chunk({"role": "assistant", "content": ""}, usage=None) + chunk({"content": "Hi"}, usage=None)
              + chunk({}, "stop", usage=None) + usage_chunk + b'"usage":' + orjson.dumps(USAGE)
              + b"}\n\ndata: [DONE]\n\n")  # fmt: skip
    parsed, usage, sent = await stream_through(mock, events)
    assert sent["stream_options"] == {"include_usage": True}
    assert [e["choices"][0]["delta"] for e in parsed] == [{"role": "assistant", "content": ""}, {"content": "Hi"}, {}]
    assert all(e["model"] == "public" for e in parsed)
    assert (usage.prompt_tokens, usage.completion_tokens) == (3, 2)


async def test_stream_usage_null_added_when_the_client_asked(mock: respx.MockRouter) -> None:
    """An OpenAI-compatible upstream that leaves ``usage`` out of ordinary chunks: the client that
    asked for include_usage still gets OpenAI's shape (usage null, then the usage chunk)."""
    events = (chunk({"role": "assistant", "content": ""}) + chunk({"content": "Hi"}) + chunk({}, "stop")
              + b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-upstream",'
              b'"choices":[],"usage":' + orjson.dumps(USAGE) + b"}\n\ndata: [DONE]\n\n")  # fmt: skip
    parsed, _, sent = await stream_through(mock, events, stream_options={"include_usage": True})
    assert sent["stream_options"] == {"include_usage": True}
    assert [e["usage"] for e in parsed] == [None, None, None, USAGE]
    assert parsed[-1]["choices"] == []


async def test_stream_error_event_after_200_fails_the_stream(mock: respx.MockRouter) -> None:
    events = chunk({"content": "Hi"}) + b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n'
    mock.post(f"{URL}/chat/completions").mock(
        return_value=httpx.Response(200, content=events, headers={"Content-Type": "text/event-stream"})
    )
    stream = await backend().chat_stream(call(stream=True))
    first = await stream.__anext__()
    assert b'"Hi"' in first
    with pytest.raises(UpstreamError, match="overloaded"):
        await stream.__anext__()
    await stream.aclose()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": 5}, "top_k"),
        ({"guided_choice": ["a"]}, "guided_choice"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ],
)
def test_vllm_extras_refused_by_name(fields: dict[str, Any], param: str) -> None:
    error = chat_refusal(OPENAI_CHAT, call(**fields).request, "oa", "openai")
    assert error is not None and error.param == param and param in str(error)
