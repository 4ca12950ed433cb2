"""Translation in both directions on golden native payloads (tests/fixtures/native/), per backend.

The golden answers were written from each API's documented format (TGI's ``GenerateResponse``
and ``StreamResponse``, Ollama's ``GenerateResponse`` lines, llama.cpp's ``/completion``) and
all reply to one request (:data:`GOLDEN_REQUEST`): "The capital of France is", stop ".". TGI
leaves the stop text in its output, Ollama and llama.cpp remove it; each says so differently.
The point of these tests: every backend gives the client the *same* OpenAI answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.errors import UpstreamProtocolError, UpstreamStatusError
from tests.backends.native.helpers import (
    GOLDEN_CHOICE,
    GOLDEN_REQUEST,
    GOLDEN_USAGE,
    KINDS,
    STREAM_ERROR,
    UPSTREAM_MODEL,
    URLS,
    drain,
    fixture,
    golden_complete,
    golden_stream,
    make_backend,
    make_call,
    route,
    sent,
    stream_response,
)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# --- request: OpenAI -> native ------------------------------------------------------------------

# What a bare request (model + prompt) becomes: every OpenAI default spelled out.
DEFAULTS = {
    "tgi": {
        "inputs": "Hi",
        "parameters": {
            "max_new_tokens": 16,
            "details": True,
            "return_full_text": False,
            "do_sample": True,
            "temperature": 1.0,
        },
    },
    "ollama": {
        "model": "llama3.2",
        "prompt": "Hi",
        "raw": True,
        "stream": False,
        "options": {
            "num_predict": 16,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
        },
    },
    "llamacpp": {
        "prompt": "Hi",
        "n_predict": 16,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stream": False,
    },
}
# What the golden request becomes.
GOLDEN_NATIVE = {
    "tgi": {
        "inputs": "The capital of France is",
        "parameters": {
            "max_new_tokens": 8,
            "details": True,
            "return_full_text": False,
            "do_sample": True,
            "temperature": 0.7,
            "seed": 42,
            "stop": ["."],
            "top_n_tokens": 2,
        },
    },
    "ollama": {
        "model": "llama3.2",
        "prompt": "The capital of France is",
        "raw": True,
        "stream": False,
        "options": {**DEFAULTS["ollama"]["options"], "num_predict": 8, "temperature": 0.7, "stop": ["."], "seed": 42},  # type: ignore[dict-item]
        "logprobs": True,
        "top_logprobs": 2,
    },
    "llamacpp": {
        **DEFAULTS["llamacpp"],
        "prompt": "The capital of France is",
        "n_predict": 8,
        "temperature": 0.7,
        "stop": ["."],
        "seed": 42,
        "n_probs": 2,
    },
}


def test_bare_request_sends_openai_defaults_explicitly(kind: str) -> None:
    backend = make_backend(kind)
    call = make_call(kind)
    assert backend.payload(call.request, UPSTREAM_MODEL[kind], stream=False) == DEFAULTS[kind]


def test_golden_request_translation(kind: str) -> None:
    backend = make_backend(kind)
    call = make_call(kind, **GOLDEN_REQUEST)
    assert backend.payload(call.request, UPSTREAM_MODEL[kind], stream=False) == GOLDEN_NATIVE[kind]


@pytest.mark.parametrize("temperature", [0.0, None])
def test_tgi_greedy_when_temperature_or_top_p_is_zero(temperature: float | None) -> None:
    backend = make_backend("tgi")
    fields: dict[str, Any] = {"top_k": 5, "top_p": 0.5, "seed": 3}
    fields.update({"temperature": 0.0} if temperature == 0.0 else {"top_p": 0.0})
    params = backend.payload(make_call("tgi", **fields).request, "m", stream=False)["parameters"]
    assert params["do_sample"] is False
    assert not {"temperature", "top_p", "top_k", "seed"} & set(params)


def test_tgi_top_p_one_is_omitted_and_negative_seed_wraps() -> None:
    params = make_backend("tgi").payload(make_call("tgi", top_p=1.0, seed=-1).request, "m", stream=False)["parameters"]
    assert "top_p" not in params
    assert params["seed"] == 2**64 - 1


@pytest.mark.parametrize("kind", ["ollama", "llamacpp"])
def test_negative_seed_never_means_random(kind: str) -> None:
    body = make_backend(kind).payload(make_call(kind, seed=-1).request, "m", stream=False)
    seed = body["options"]["seed"] if kind == "ollama" else body["seed"]
    assert 0 <= seed < 0xFFFFFFFF


def test_ollama_suffix_uses_the_template() -> None:
    body = make_backend("ollama").payload(make_call("ollama", suffix="return x").request, "m", stream=True)
    assert body["raw"] is False and body["suffix"] == "return x" and body["stream"] is True


def test_max_tokens_zero_asks_for_one_token(kind: str) -> None:
    body = make_backend(kind).payload(make_call(kind, max_tokens=0).request, "m", stream=False)
    limit = {"tgi": lambda b: b["parameters"]["max_new_tokens"], "ollama": lambda b: b["options"]["num_predict"]}
    assert limit.get(kind, lambda b: b["n_predict"])(body) == 1


# --- response: native -> OpenAI -----------------------------------------------------------------------


async def test_golden_answer_is_the_same_openai_answer(kind: str, mock: respx.MockRouter) -> None:
    upstream = route(mock, kind).mock(return_value=golden_complete(kind))
    backend = make_backend(kind)
    result = await backend.complete(make_call(kind, **GOLDEN_REQUEST))
    body = orjson.loads(result.body)
    assert set(body) == {"id", "object", "created", "model", "choices", "system_fingerprint", "usage"}
    assert body["id"].startswith("cmpl-") and isinstance(body["created"], int)
    assert body["object"] == "text_completion" and body["model"] == "public"
    assert body["choices"] == [GOLDEN_CHOICE]
    assert body["usage"] == GOLDEN_USAGE
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (6, 2)
    assert sent(upstream) == GOLDEN_NATIVE[kind]
    assert upstream.calls.last.request.headers["x-request-id"] == "req-7"
    await backend.close()


@pytest.mark.parametrize("piece", [0, 1, 7])
async def test_golden_stream_is_the_same_openai_stream(kind: str, mock: respx.MockRouter, piece: int) -> None:
    """Whatever the reads' boundaries (one read, byte by byte, 7 bytes), the same chunks."""
    upstream = route(mock, kind, stream=True).mock(return_value=golden_stream(kind, piece=piece))
    backend = make_backend(kind)
    call = make_call(kind, **GOLDEN_REQUEST, stream=True, stream_options={"include_usage": True})
    stream = await backend.stream(call)
    events = await drain(stream)
    *chunks, usage = events
    assert usage["choices"] == [] and usage["usage"] == GOLDEN_USAGE
    assert all(e["id"] == usage["id"] and e["model"] == "public" and e["object"] == "text_completion" for e in events)
    assert all(c["usage"] is None for c in chunks)
    choices = [c["choices"][0] for c in chunks]
    assert "".join(c["text"] for c in choices) == " Paris"
    assert [c["finish_reason"] for c in choices][-1] == "stop"
    assert all(c["finish_reason"] is None for c in choices[:-1])
    tokens = [t for c in choices for t in c["logprobs"]["tokens"]]
    offsets = [o for c in choices for o in c["logprobs"]["text_offset"]]
    tops = [t for c in choices for t in c["logprobs"]["top_logprobs"]]
    assert tokens == [" Paris"] and offsets == [0] and tops == [{" Paris": -0.31, " the": -1.9}]
    assert stream.usage is not None and stream.usage.prompt_tokens == 6
    body = sent(upstream)
    assert body.get("stream", True) is True  # TGI streams by path, the others by flag
    await backend.close()


async def test_stream_without_include_usage_has_no_usage_chunk(kind: str, mock: respx.MockRouter) -> None:
    route(mock, kind, stream=True).mock(return_value=golden_stream(kind))
    backend = make_backend(kind)
    stream = await backend.stream(make_call(kind, **GOLDEN_REQUEST, stream=True))
    events = await drain(stream)
    assert all(e["choices"] and e["usage"] is None for e in events)
    assert stream.usage is not None  # for the gateway's metrics all the same
    await backend.close()


async def test_stop_text_cut_and_include_stop_str(mock: respx.MockRouter) -> None:
    """TGI keeps the stop text: cut by the gateway, or kept with include_stop_str_in_output.
    llama.cpp removes it and names it: put back on request."""
    route(mock, "tgi").mock(return_value=golden_complete("tgi"))
    route(mock, "llamacpp").mock(return_value=golden_complete("llamacpp"))
    for kind in ("tgi", "llamacpp"):
        backend = make_backend(kind)
        body = orjson.loads((await backend.complete(make_call(kind, stop=".", include_stop_str_in_output=True))).body)
        assert body["choices"][0]["text"] == " Paris."
        assert body["choices"][0]["finish_reason"] == "stop"
        await backend.close()


async def test_tgi_eos_token_is_not_in_text_or_logprobs(mock: respx.MockRouter) -> None:
    answer = {
        "generated_text": " Paris",
        "details": {
            "finish_reason": "eos_token",
            "generated_tokens": 2,
            "tokens": [
                {"id": 1, "text": " Paris", "logprob": -0.3, "special": False},
                {"id": 2, "text": "</s>", "logprob": -0.01, "special": True},
            ],
        },
    }
    route(mock, "tgi").mock(return_value=httpx.Response(200, json=answer, headers={"x-prompt-tokens": "4"}))
    backend = make_backend("tgi")
    body = orjson.loads((await backend.complete(make_call("tgi", logprobs=0))).body)
    assert body["choices"][0]["logprobs"]["tokens"] == [" Paris"]
    assert body["choices"][0]["logprobs"]["top_logprobs"] == [{" Paris": -0.3}]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    await backend.close()


async def test_llamacpp_length_and_echo_of_token_prompt(mock: respx.MockRouter) -> None:
    answer = {**orjson.loads(fixture("llamacpp/completion.json")), "stop_type": "limit", "stopping_word": ""}
    upstream = route(mock, "llamacpp").mock(return_value=httpx.Response(200, json=answer))
    detok = mock.post(URLS["llamacpp"] + "/detokenize").mock(
        return_value=httpx.Response(200, content=fixture("llamacpp/detokenize.json"))
    )
    backend = make_backend("llamacpp")
    body = orjson.loads((await backend.complete(make_call("llamacpp", prompt=[450, 7483], echo=True))).body)
    assert body["choices"][0]["text"] == "The capital of France is Paris"
    assert body["choices"][0]["finish_reason"] == "length"
    assert sent(detok) == {"tokens": [450, 7483]}
    assert sent(upstream)["prompt"] == [450, 7483]
    await backend.close()


async def test_max_tokens_zero_returns_no_completion(kind: str, mock: respx.MockRouter) -> None:
    route(mock, kind).mock(return_value=golden_complete(kind))
    backend = make_backend(kind)
    body = orjson.loads(
        (
            await backend.complete(
                make_call(kind, **{**GOLDEN_REQUEST, "max_tokens": 0, "echo": True, "logprobs": None})
            )
        ).body
    )
    assert body["choices"] == [
        {"text": GOLDEN_REQUEST["prompt"], "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 0, "total_tokens": 6}
    stream = await backend.stream(make_call(kind, prompt="Hi", max_tokens=0, stream=True))
    events = await drain(stream)
    assert [e["choices"] for e in events] == [[{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}]]
    await backend.close()


# --- errors ----------------------------------------------------------------------------------------------

ERRORS = [
    # kind, upstream status, golden body, client status, retryable, message part
    ("tgi", 422, "tgi/error_422.json", 400, False, "Input validation error"),
    ("tgi", 424, "tgi/error_424.json", 502, True, None),
    ("tgi", 429, "tgi/error_429.json", 429, True, "Model is overloaded"),
    ("ollama", 400, "ollama/error_400.json", 400, False, "invalid format"),
    ("ollama", 404, "ollama/error_404.json", 502, False, "model 'llama3.2' not found"),
    ("llamacpp", 400, "llamacpp/error_400.json", 400, False, "exceeds the available context size"),
    ("llamacpp", 503, "llamacpp/error_503.json", 503, True, None),
]


@pytest.mark.parametrize(("kind", "status", "name", "client_status", "retryable", "message"), ERRORS)
@pytest.mark.parametrize("streaming", [False, True])
async def test_native_error_statuses(
    mock: respx.MockRouter,
    kind: str,
    status: int,
    name: str,
    client_status: int,
    retryable: bool,
    message: str | None,
    streaming: bool,
) -> None:
    route(mock, kind, stream=streaming).mock(return_value=httpx.Response(status, content=fixture(name)))
    backend = make_backend(kind)
    call = make_call(kind, stream=streaming)
    with pytest.raises(UpstreamStatusError) as caught:
        await (backend.stream(call) if streaming else backend.complete(call))
    error = caught.value
    assert (error.status, error.retryable, error.backend) == (client_status, retryable, f"{kind}-a")
    if message is not None:
        assert message in error.message
    assert error.reason == f"status_{status}"
    await backend.close()


async def test_mid_stream_error_after_the_chunks_before_it(kind: str, mock: respx.MockRouter) -> None:
    _, _, content_type = ("", "", "application/x-ndjson" if kind == "ollama" else "text/event-stream")
    route(mock, kind, stream=True).mock(return_value=stream_response(fixture(STREAM_ERROR[kind]), content_type))
    backend = make_backend(kind)
    stream = await backend.stream(make_call(kind, stream=True))
    first = await stream.__anext__()
    assert b'" Paris"' in first
    with pytest.raises(UpstreamProtocolError) as caught:
        await stream.__anext__()
    assert caught.value.reason == "stream_error" and "mid-stream" in caught.value.message
    assert not stream.finished
    await stream.aclose()
    await backend.close()


async def test_stream_cut_before_the_final_event(kind: str, mock: respx.MockRouter) -> None:
    whole = fixture(STREAM_ERROR[kind])
    cut = whole[: whole.index(b"\n") + 2] if kind != "ollama" else whole.split(b"\n")[0] + b"\n"
    content_type = "application/x-ndjson" if kind == "ollama" else "text/event-stream"
    route(mock, kind, stream=True).mock(return_value=stream_response(cut, content_type))
    backend = make_backend(kind)
    stream = await backend.stream(make_call(kind, stream=True))
    with pytest.raises(UpstreamProtocolError) as caught:
        async for _ in stream:
            pass
    assert caught.value.reason == "stream_cut"
    await stream.aclose()
    await backend.close()


async def test_garbage_stream_event(kind: str, mock: respx.MockRouter) -> None:
    body = b"data: {not json\n\n" if kind != "ollama" else b"{not json\n"
    route(mock, kind, stream=True).mock(return_value=stream_response(body, "text/plain"))
    backend = make_backend(kind)
    stream = await backend.stream(make_call(kind, stream=True))
    with pytest.raises(UpstreamProtocolError) as caught:
        await stream.__anext__()
    assert caught.value.reason == "stream_garbage"
    await stream.aclose()
    await backend.close()


async def test_non_json_body(kind: str, mock: respx.MockRouter) -> None:
    route(mock, kind).mock(return_value=httpx.Response(200, content=b"<html>oops</html>"))
    backend = make_backend(kind)
    with pytest.raises(UpstreamProtocolError):
        await backend.complete(make_call(kind))
    await backend.close()
