"""``OpenAIBackend`` and ``VLLMBackend`` against a respx-mocked upstream (httpx transport).

What goes upstream (body, headers), what comes back (renamed, usage extracted),
how streams are relayed, and how every upstream failure maps to our error types.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import CompletionStream, TokenUsage, UpstreamCall
from backends.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeoutError,
)
from backends.openai.adapter import OpenAIBackend
from backends.registry import build_backend
from backends.vllm.adapter import VLLMBackend
from schemas.completions import CompletionRequest
from schemas.config import OpenAIBackendConfig, VLLMBackendConfig

# Both families speak OpenAI's wire (backends.openai.wire); these tests run each against the same upstream.
Shaped = OpenAIBackend | VLLMBackend

OPENAI_URL = "http://openai.test/v1"
VLLM_URL = "http://vllm.test:8000/v1"
UP = "org/upstream-model"
PUB = "public-model"
KEY = "sk-test-123"


def openai_config(**extra: Any) -> OpenAIBackendConfig:
    return OpenAIBackendConfig.model_validate(
        {"type": "openai", "name": "oa", "base_url": OPENAI_URL, "api_key": KEY, "transport": "httpx", **extra}
    )


def vllm_config(**extra: Any) -> VLLMBackendConfig:
    return VLLMBackendConfig.model_validate(
        {"type": "vllm", "name": "vl", "base_url": VLLM_URL, "api_key": KEY, "transport": "httpx", **extra}
    )


BACKENDS = {"openai": OPENAI_URL, "vllm": VLLM_URL}


@pytest.fixture(params=sorted(BACKENDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


async def make(kind: str, **extra: Any) -> Shaped:
    config = vllm_config(**extra) if kind == "vllm" else openai_config(**extra)
    backend = build_backend(config)
    assert type(backend) is (VLLMBackend if kind == "vllm" else OpenAIBackend)
    return backend


@pytest.fixture
async def backend(kind: str) -> AsyncIterator[Shaped]:
    b = await make(kind)
    yield b
    await b.close()


def completions_route(mock: respx.MockRouter, kind: str) -> respx.Route:
    return mock.post(BACKENDS[kind] + "/completions")


def make_call(**fields: Any) -> UpstreamCall:
    request = CompletionRequest.model_validate({"model": PUB, "prompt": "Say hi", **fields})
    return UpstreamCall(request=request, upstream_model=UP, public_model=PUB, request_id="req-42")


def sent_body(route: respx.Route) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(route.calls.last.request.content)
    return body


def completion_body(model: str = UP, **extra: Any) -> dict[str, Any]:
    return {
        "id": "cmpl-9",
        "object": "text_completion",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "text": " hi there", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
        **extra,
    }


def chunk(text: str, *, finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    return {
        "id": "cmpl-9",
        "object": "text_completion",
        "created": 1700000000,
        "model": UP,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }


USAGE_CHUNK = {
    "id": "cmpl-9",
    "object": "text_completion",
    "created": 1700000000,
    "model": UP,
    "choices": [],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
}
CHUNKS = [chunk(" one"), chunk(" two"), chunk(" three", finish="length")]


def sse(*objs: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objs)
    return out + (b"data: [DONE]\n\n" if done else b"")


class Chunks(httpx.AsyncByteStream):
    """A response body delivered in the given pieces (one network read each)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


def sse_response(pieces: list[bytes]) -> httpx.Response:
    return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=Chunks(pieces))


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    assert raw.endswith(b"\n\n")
    events = []
    for block in raw.split(b"\n\n")[:-1]:
        assert block.startswith(b"data: "), block
        payload = block[len(b"data: ") :]
        assert payload != b"[DONE]"
        events.append(orjson.loads(payload))
    return events


async def collect(stream: CompletionStream) -> list[bytes]:
    out: list[bytes] = []
    try:
        async for piece in stream:
            assert piece
            out.append(piece)
    finally:
        await stream.aclose()
    return out


# --- what goes upstream ----------------------------------------------------------------


async def test_model_mapped_and_only_set_fields_forwarded(kind: str, backend: Shaped, mock: respx.MockRouter) -> None:
    route = completions_route(mock, kind).mock(return_value=httpx.Response(200, json=completion_body()))
    await backend.complete(make_call(max_tokens=7, temperature=None, stop=["\n"], seed=None, echo=False))
    body = sent_body(route)
    expected: dict[str, Any] = {"model": UP, "prompt": "Say hi", "max_tokens": 7, "stop": ["\n"]}
    # echo=false is a neutral value, but echo is native on both types, so it goes up as sent.
    assert body == {**expected, "echo": False}


async def test_openai_drops_neutral_values_of_unsupported_fields(mock: respx.MockRouter) -> None:
    backend = await make("openai")
    route = completions_route(mock, "openai").mock(return_value=httpx.Response(200, json=completion_body()))
    try:
        await backend.complete(
            make_call(top_k=-1, min_p=0.0, repetition_penalty=1.0, stop_token_ids=[], skip_special_tokens=True, n=1)
        )
    finally:
        await backend.close()
    assert sent_body(route) == {"model": UP, "prompt": "Say hi", "n": 1}


async def test_openai_capability_override_forwards_the_field(mock: respx.MockRouter) -> None:
    backend = await make("openai", capabilities={"top_k": "native"})
    route = completions_route(mock, "openai").mock(return_value=httpx.Response(200, json=completion_body()))
    try:
        await backend.complete(make_call(top_k=5, min_p=0.0))
    finally:
        await backend.close()
    assert sent_body(route) == {"model": UP, "prompt": "Say hi", "top_k": 5}


async def test_vllm_forwards_its_extras(mock: respx.MockRouter) -> None:
    # A vLLM that still takes guided_* as they are (< 0.11; newer ones: tests/backends/test_vllm_*.py).
    backend = await make("vllm", version="0.10.1")
    route = completions_route(mock, "vllm").mock(return_value=httpx.Response(200, json=completion_body()))
    extras = {
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "stop_token_ids": [7, 9],
        "min_tokens": 2,
        "ignore_eos": True,
        "skip_special_tokens": True,  # neutral, but vLLM takes it natively
        "guided_regex": "[a-z]+",
    }
    try:
        await backend.complete(make_call(**extras))
    finally:
        await backend.close()
    assert sent_body(route) == {"model": UP, "prompt": "Say hi", **extras}


async def test_stream_asks_upstream_for_usage(kind: str, backend: Shaped, mock: respx.MockRouter) -> None:
    route = completions_route(mock, kind).mock(return_value=sse_response([sse(*CHUNKS, USAGE_CHUNK)]))
    stream = await backend.stream(make_call(stream=True, max_tokens=3))
    out = await collect(stream)
    assert sent_body(route) == {
        "model": UP,
        "prompt": "Say hi",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = parse_sse(b"".join(out))
    # The usage chunk was the gateway's own request: hidden from the client, kept for metrics.
    assert [e["choices"][0]["text"] for e in events] == [" one", " two", " three"]
    assert all(e["choices"] for e in events)
    assert stream.usage == TokenUsage(3, 3)


async def test_stream_relays_usage_when_the_client_asked(kind: str, backend: Shaped, mock: respx.MockRouter) -> None:
    route = completions_route(mock, kind).mock(return_value=sse_response([sse(*CHUNKS, USAGE_CHUNK)]))
    stream = await backend.stream(make_call(stream=True, stream_options={"include_usage": True}))
    events = parse_sse(b"".join(await collect(stream)))
    assert sent_body(route)["stream_options"] == {"include_usage": True}
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == USAGE_CHUNK["usage"]
    assert events[-1]["model"] == PUB
    assert stream.usage == TokenUsage(3, 3)


@pytest.mark.parametrize(
    ("options", "sent"),
    [
        # The gateway's own usage request never turns on per-chunk usage (issue 13 item 26).
        ({"include_usage": False, "continuous_usage_stats": True}, {"include_usage": True}),
        (
            {"include_usage": True, "continuous_usage_stats": True},
            {"include_usage": True, "continuous_usage_stats": True},
        ),
    ],
)
async def test_stream_options_the_client_asked_for_are_kept(
    mock: respx.MockRouter, options: dict[str, bool], sent: dict[str, bool]
) -> None:
    backend = await make("vllm")
    route = completions_route(mock, "vllm").mock(return_value=sse_response([sse(*CHUNKS)]))
    try:
        stream = await backend.stream(make_call(stream=True, stream_options=options))
        await collect(stream)
    finally:
        await backend.close()
    assert sent_body(route)["stream_options"] == sent


async def test_stream_usage_off_in_config_leaves_the_request_alone(kind: str, mock: respx.MockRouter) -> None:
    backend = await make(kind, stream_usage=False)
    route = completions_route(mock, kind).mock(return_value=sse_response([sse(*CHUNKS)]))
    try:
        stream = await backend.stream(make_call(stream=True))
        await collect(stream)
    finally:
        await backend.close()
    assert "stream_options" not in sent_body(route)
    assert stream.usage is None


async def test_headers(kind: str, mock: respx.MockRouter) -> None:
    backend = await make(kind, headers={"OpenAI-Organization": "org-1"})
    route = completions_route(mock, kind).mock(return_value=httpx.Response(200, json=completion_body()))
    try:
        await backend.complete(make_call())
    finally:
        await backend.close()
    headers = route.calls.last.request.headers
    assert headers["Authorization"] == f"Bearer {KEY}"
    assert headers["X-Request-Id"] == "req-42"
    assert headers["Content-Type"] == "application/json"
    assert headers["OpenAI-Organization"] == "org-1"


async def test_no_api_key_no_authorization_header(kind: str, mock: respx.MockRouter) -> None:
    backend = await make(kind, api_key=None)
    route = completions_route(mock, kind).mock(return_value=httpx.Response(200, json=completion_body()))
    try:
        await backend.complete(make_call())
    finally:
        await backend.close()
    assert "Authorization" not in route.calls.last.request.headers


# --- non-streaming answers -------------------------------------------------------------


async def test_complete_renames_model_and_extracts_usage(kind: str, backend: Shaped, mock: respx.MockRouter) -> None:
    upstream = completion_body(system_fingerprint="fp", extra_vllm_field={"kept": True})
    completions_route(mock, kind).mock(return_value=httpx.Response(200, json=upstream))
    result = await backend.complete(make_call())
    body = orjson.loads(result.body)
    expected = {**upstream, "model": PUB}
    if kind == "vllm":  # vLLM answers are rebuilt in OpenAI's shape (tests/backends/test_vllm_normalise.py)
        del expected["extra_vllm_field"]
    assert body == expected
    assert result.usage == TokenUsage(3, 5)


async def test_complete_without_usage(kind: str, backend: Shaped, mock: respx.MockRouter) -> None:
    upstream = completion_body()
    del upstream["usage"]
    completions_route(mock, kind).mock(return_value=httpx.Response(200, json=upstream))
    result = await backend.complete(make_call())
    assert orjson.loads(result.body)["model"] == PUB
    assert result.usage is None


# --- streaming relay ---------------------------------------------------------------------


async def test_stream_relays_every_chunk_renamed(kind: str, backend: Shaped, mock: respx.MockRouter) -> None:
    payload = sse(*CHUNKS, USAGE_CHUNK)
    # Awkward network reads: mid-event, mid-"model", mid-[DONE].
    pieces = [payload[:10], payload[10:95], payload[95:96], payload[96:-7], payload[-7:]]
    completions_route(mock, kind).mock(return_value=sse_response(pieces))
    stream = await backend.stream(make_call(stream=True))
    raw = b"".join(await collect(stream))
    assert b"[DONE]" not in raw
    events = parse_sse(raw)
    assert [e["model"] for e in events] == [PUB] * 3
    assert events == [{**c, "model": PUB} for c in CHUNKS]
    assert stream.usage == TokenUsage(3, 3)


async def test_stream_without_done_raises_from_the_iterator(kind: str, backend: Shaped, mock: respx.MockRouter) -> None:
    completions_route(mock, kind).mock(return_value=sse_response([sse(*CHUNKS, done=False)]))
    stream = await backend.stream(make_call(stream=True))
    with pytest.raises(UpstreamProtocolError) as info:
        await collect(stream)
    assert info.value.reason == "stream_cut"


@pytest.mark.parametrize(
    "error",
    [
        {"error": {"message": "engine died", "type": "InternalServerError", "param": None, "code": 500}},
        {"object": "error", "message": "engine died", "type": "InternalServerError", "param": None, "code": 500},
    ],
    ids=["nested", "flat"],
)
async def test_mid_stream_error_event_raises_with_the_message(
    kind: str, backend: Shaped, mock: respx.MockRouter, error: dict[str, Any]
) -> None:
    completions_route(mock, kind).mock(return_value=sse_response([sse(CHUNKS[0], done=False), sse(error)]))
    stream = await backend.stream(make_call(stream=True))
    first = await stream.__anext__()
    assert parse_sse(first)[0]["model"] == PUB
    with pytest.raises(UpstreamProtocolError, match="engine died"):
        await stream.__anext__()
    await stream.aclose()


async def test_stream_cut_by_the_transport(kind: str, backend: Shaped, mock: respx.MockRouter) -> None:
    class Cut(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield sse(CHUNKS[0], done=False)
            raise httpx.ReadError("connection reset")

    completions_route(mock, kind).mock(return_value=httpx.Response(200, stream=Cut()))
    stream = await backend.stream(make_call(stream=True))
    with pytest.raises(UpstreamProtocolError) as info:
        await collect(stream)
    assert info.value.reason == "stream_cut"


# --- errors ------------------------------------------------------------------------------

VLLM_NESTED_400 = {"error": {"message": "bad top_k", "type": "BadRequestError", "param": "top_k", "code": 400}}
VLLM_FLAT_400 = {"object": "error", "message": "bad top_k", "type": "BadRequestError", "param": None, "code": 400}


@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize(
    ("status", "body"),
    [(400, VLLM_NESTED_400), (400, VLLM_FLAT_400), (422, VLLM_NESTED_400), (422, {"detail": "bad top_k"})],
    ids=["400-nested", "400-flat", "422-nested", "422-detail"],
)
async def test_request_errors_become_400_with_the_upstream_message(
    kind: str, backend: Shaped, mock: respx.MockRouter, status: int, body: dict[str, Any], streaming: bool
) -> None:
    completions_route(mock, kind).mock(return_value=httpx.Response(status, json=body))
    err = await failure(backend, streaming)
    assert isinstance(err, UpstreamStatusError)
    assert (err.status, err.type, err.message, err.retryable) == (400, "invalid_request_error", "bad top_k", False)
    assert err.upstream_status == status
    assert err.envelope()["error"]["message"] == "bad top_k"


async def failure(backend: Shaped, streaming: bool) -> UpstreamError:
    with pytest.raises(UpstreamError) as info:
        if streaming:
            stream = await backend.stream(make_call(stream=True))
            await collect(stream)
        else:
            await backend.complete(make_call())
    return info.value


@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize(
    ("status", "body", "expected_status", "code", "retryable"),
    [
        (401, {"error": "Unauthorized"}, 502, "upstream_auth_failed", False),
        (403, {"error": {"message": "nope"}}, 502, "upstream_auth_failed", False),
        (
            404,
            {"error": {"message": "The model `x` does not exist.", "code": 404}},
            502,
            "upstream_model_not_found",
            False,
        ),
        (500, {"error": {"message": "oops"}}, 502, "upstream_error", True),
        (502, "<html>bad gateway</html>", 502, "upstream_error", True),
        (503, "", 503, "upstream_unavailable", True),
        (504, "gateway timeout", 504, "upstream_timeout", True),
    ],
)
async def test_status_mapping(
    kind: str,
    backend: Shaped,
    mock: respx.MockRouter,
    streaming: bool,
    status: int,
    body: Any,
    expected_status: int,
    code: str,
    retryable: bool,
) -> None:
    response = httpx.Response(status, json=body) if isinstance(body, dict) else httpx.Response(status, text=body)
    completions_route(mock, kind).mock(return_value=response)
    err = await failure(backend, streaming)
    assert isinstance(err, UpstreamStatusError)
    assert (err.status, err.code, err.retryable) == (expected_status, code, retryable)
    assert err.upstream_status == status
    assert err.backend == backend.name
    if status in (401, 403):
        assert KEY not in err.message


@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
async def test_429_keeps_retry_after(kind: str, backend: Shaped, mock: respx.MockRouter, streaming: bool) -> None:
    completions_route(mock, kind).mock(
        return_value=httpx.Response(
            429, headers={"Retry-After": "7"}, json={"error": {"message": "slow down", "type": "rate_limit_error"}}
        )
    )
    err = await failure(backend, streaming)
    assert isinstance(err, UpstreamStatusError)
    assert (err.status, err.type, err.retryable, err.retry_after) == (429, "rate_limit_error", True, 7.0)
    assert "slow down" in err.message


@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx.ConnectError("refused"), UpstreamConnectError),
        (httpx.RemoteProtocolError("reset before any byte"), UpstreamConnectError),
        (httpx.ConnectTimeout("connect timeout"), UpstreamTimeoutError),
        (httpx.ReadTimeout("read timeout"), UpstreamTimeoutError),
    ],
    ids=["connect", "reset", "connect-timeout", "read-timeout"],
)
async def test_transport_failures(
    kind: str, backend: Shaped, mock: respx.MockRouter, streaming: bool, exc: Exception, expected: type
) -> None:
    completions_route(mock, kind).mock(side_effect=exc)
    err = await failure(backend, streaming)
    assert type(err) is expected
    assert err.retryable
    assert err.backend == backend.name


@pytest.mark.parametrize(
    "body", [b"not json at all", b'{"choices": "nope"}', b"[1, 2]", b""], ids=["garbage", "shape", "list", "empty"]
)
async def test_garbage_body_is_a_protocol_error(
    kind: str, backend: Shaped, mock: respx.MockRouter, body: bytes
) -> None:
    completions_route(mock, kind).mock(return_value=httpx.Response(200, content=body))
    with pytest.raises(UpstreamProtocolError):
        await backend.complete(make_call())


async def test_garbage_stream_event_is_a_protocol_error(kind: str, backend: Shaped, mock: respx.MockRouter) -> None:
    completions_route(mock, kind).mock(return_value=sse_response([b'data: {"usage":{oops\n\n', b"data: [DONE]\n\n"]))
    stream = await backend.stream(make_call(stream=True))
    with pytest.raises(UpstreamProtocolError):
        await collect(stream)


# --- health ------------------------------------------------------------------------------


async def test_openai_health_gets_models(mock: respx.MockRouter) -> None:
    backend = await make("openai")
    route = mock.get(OPENAI_URL + "/models").mock(return_value=httpx.Response(200, json={"object": "list", "data": []}))
    try:
        assert await backend.health() is True
        assert route.calls.last.request.headers["Authorization"] == f"Bearer {KEY}"
        route.mock(return_value=httpx.Response(401, json={"error": "Unauthorized"}))
        assert await backend.health() is False
        route.mock(side_effect=httpx.ConnectError("refused"))
        assert await backend.health() is False
    finally:
        await backend.close()


async def test_vllm_health_gets_root_health(mock: respx.MockRouter) -> None:
    backend = await make("vllm")
    route = mock.get("http://vllm.test:8000/health").mock(return_value=httpx.Response(200))
    try:
        assert await backend.health() is True
        assert route.call_count == 1
        route.mock(return_value=httpx.Response(503))
        assert await backend.health() is False
        route.mock(side_effect=httpx.ReadTimeout("slow"))
        assert await backend.health() is False
    finally:
        await backend.close()


async def test_vllm_health_without_v1_suffix(mock: respx.MockRouter) -> None:
    backend = await make("vllm", base_url="http://vllm.test:8000")
    route = mock.get("http://vllm.test:8000/health").mock(return_value=httpx.Response(200))
    try:
        assert await backend.health() is True
        assert route.called
    finally:
        await backend.close()
