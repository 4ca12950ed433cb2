"""The ``mock`` simulator backend: determinism, every honoured field, and its SSE stream."""

from __future__ import annotations

import math
import time
from typing import Any

import orjson
import pytest

from backends.base import UpstreamCall
from backends.capabilities import Level
from backends.mock import MOCK_CONTEXT_LENGTH, MockBackend
from schemas.completions import CompletionChunk, CompletionRequest, CompletionResponse
from schemas.config import MockBackendConfig
from schemas.errors import InvalidRequestError


def make_backend(**config: Any) -> MockBackend:
    return MockBackend(MockBackendConfig.model_validate({"type": "mock", "name": "sim", **config}))


def make_call(**fields: Any) -> UpstreamCall:
    request = CompletionRequest.model_validate({"model": "pub", "prompt": "Say something nice", **fields})
    return UpstreamCall(request=request, upstream_model="m", public_model="pub", request_id="r1")


async def complete(**fields: Any) -> dict[str, Any]:
    result = await make_backend().complete(make_call(**fields))
    body: dict[str, Any] = orjson.loads(result.body)
    CompletionResponse.model_validate(body)
    assert result.usage is not None
    assert body["usage"]["prompt_tokens"] == result.usage.prompt_tokens
    assert body["usage"]["completion_tokens"] == result.usage.completion_tokens
    return body


def texts(body: dict[str, Any]) -> list[str]:
    return [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]


def parse_sse(chunks: list[bytes]) -> list[dict[str, Any]]:
    raw = b"".join(chunks)
    assert raw.endswith(b"\n\n")
    events = []
    for block in raw.split(b"\n\n")[:-1]:
        assert block.startswith(b"data: ")
        payload = block[len(b"data: ") :]
        assert payload != b"[DONE]"
        events.append(orjson.loads(payload))
    return events


async def stream_events(backend: MockBackend | None = None, **fields: Any) -> tuple[list[bytes], list[dict[str, Any]]]:
    stream = await (backend or make_backend()).stream(make_call(stream=True, **fields))
    chunks = [chunk async for chunk in stream]
    await stream.aclose()
    assert all(chunks)
    assert stream.usage is not None
    return chunks, parse_sse(chunks)


# --- non-streaming -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_response_shape_is_labelled_simulator() -> None:
    body = await complete()
    assert body["id"].startswith("cmpl-mock-")
    assert body["object"] == "text_completion"
    assert body["model"] == "pub"
    assert body["system_fingerprint"] == "mock-simulator"
    assert isinstance(body["created"], int)
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert body["usage"]["prompt_tokens"] == 3  # three words
    assert body["choices"][0]["logprobs"] is None


@pytest.mark.asyncio
async def test_deterministic_per_prompt_and_seed() -> None:
    first, again = await complete(seed=7), await complete(seed=7)
    assert texts(first) == texts(again)
    assert texts(await complete(seed=8)) != texts(first)
    assert texts(await complete(prompt="Another prompt", seed=7)) != texts(first)
    assert texts(await complete()) == texts(await complete())  # no seed: still deterministic


@pytest.mark.asyncio
async def test_sampling_parameters_and_logprobs_do_not_change_the_text() -> None:
    plain = texts(await complete(seed=1))
    tweaked = await complete(seed=1, top_p=0.5, presence_penalty=1.0, logit_bias={"42": 5}, user="u", logprobs=3)
    assert texts(tweaked) == plain


@pytest.mark.asyncio
@pytest.mark.parametrize("max_tokens", [1, 7, 40])
async def test_max_tokens_is_honoured(max_tokens: int) -> None:
    body = await complete(max_tokens=max_tokens, logprobs=0)
    choice = body["choices"][0]
    assert len(choice["logprobs"]["tokens"]) == max_tokens
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == max_tokens
    assert all(token.startswith(" ") for token in choice["logprobs"]["tokens"])


@pytest.mark.asyncio
async def test_max_tokens_default_and_zero() -> None:
    body = await complete(logprobs=0)
    assert len(body["choices"][0]["logprobs"]["tokens"]) == 16
    empty = await complete(max_tokens=0)
    assert empty["choices"][0]["text"] == ""
    assert empty["choices"][0]["finish_reason"] == "length"
    assert empty["usage"]["completion_tokens"] == 0


@pytest.mark.asyncio
async def test_context_length_is_enforced() -> None:
    with pytest.raises(InvalidRequestError) as info:
        await complete(max_tokens=MOCK_CONTEXT_LENGTH)
    assert info.value.param == "max_tokens"


@pytest.mark.asyncio
async def test_n_and_prompt_batches_index_choices() -> None:
    body = await complete(prompt=["one two", "three"], n=2, max_tokens=5, seed=3)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert len(set(texts(body))) == 4
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 20, "total_tokens": 23}
    # Choice ``prompt_index * n + i`` is the same as choice ``i`` of that prompt alone.
    alone = await complete(prompt="three", n=2, max_tokens=5, seed=3)
    assert texts(body)[2:] == texts(alone)


@pytest.mark.asyncio
async def test_token_id_prompts() -> None:
    body = await complete(prompt=[[1, 2, 3], [4]], max_tokens=2)
    assert body["usage"]["prompt_tokens"] == 4
    assert len(body["choices"]) == 2
    single = await complete(prompt=[5, 6, 7], echo=True, max_tokens=1)
    assert single["usage"]["prompt_tokens"] == 3
    assert single["choices"][0]["text"].startswith("5 6 7 ")


@pytest.mark.asyncio
async def test_temperature_zero_makes_choices_identical() -> None:
    greedy = await complete(n=3, temperature=0.0)
    assert len(set(texts(greedy))) == 1
    assert len(set(texts(await complete(n=3, temperature=0.7)))) == 3


@pytest.mark.asyncio
async def test_stop_cuts_before_the_sequence() -> None:
    full = texts(await complete(seed=11, max_tokens=12))[0]
    words = full.split()
    stop = " " + words[4]  # a whole token
    expected = full[: full.find(stop)]
    body = await complete(seed=11, max_tokens=12, stop=stop, logprobs=1)
    choice = body["choices"][0]
    assert choice["text"] == expected
    assert stop not in choice["text"]
    assert choice["finish_reason"] == "stop"
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]
    assert body["usage"]["completion_tokens"] == len(expected.split()) + 1  # the stop token was generated


@pytest.mark.asyncio
async def test_stop_inside_a_token_and_lists() -> None:
    full = texts(await complete(seed=11, max_tokens=12))[0]
    stop = full[8:10]  # may start mid-token
    body = await complete(seed=11, max_tokens=12, stop=["never-generated", stop], logprobs=2)
    choice = body["choices"][0]
    assert choice["text"] == full[: full.find(stop)]
    assert choice["finish_reason"] == "stop"
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"])
    for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True):
        assert token in top
    missing = await complete(seed=11, max_tokens=12, stop="never-generated")
    assert missing["choices"][0]["finish_reason"] == "length"
    assert missing["choices"][0]["text"] == full


@pytest.mark.asyncio
async def test_echo_prepends_the_prompt() -> None:
    plain = texts(await complete(seed=2, max_tokens=4))[0]
    body = await complete(seed=2, max_tokens=4, echo=True, logprobs=1)
    choice = body["choices"][0]
    assert choice["text"] == "Say something nice" + plain
    logprobs = choice["logprobs"]
    assert logprobs["tokens"][:3] == ["Say", " something", " nice"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert body["usage"]["completion_tokens"] == 4
    prompt_only = await complete(echo=True, max_tokens=0)
    assert prompt_only["choices"][0]["text"] == "Say something nice"


@pytest.mark.asyncio
@pytest.mark.parametrize("k", [0, 1, 2, 5])
async def test_logprobs_shape(k: int) -> None:
    body = await complete(logprobs=k, max_tokens=10, n=2, seed=4)
    for choice in body["choices"]:
        logprobs = choice["logprobs"]
        tokens = logprobs["tokens"]
        assert (
            len(tokens)
            == len(logprobs["token_logprobs"])
            == len(logprobs["top_logprobs"])
            == len(logprobs["text_offset"])
        )
        assert "".join(tokens) == choice["text"]
        for token, logprob, top, offset in zip(
            tokens, logprobs["token_logprobs"], logprobs["top_logprobs"], logprobs["text_offset"], strict=True
        ):
            assert choice["text"][offset : offset + len(token)] == token
            assert logprob < 0
            assert len(top) == max(k, 1)  # the chosen token plus k - 1 alternatives
            assert top[token] == logprob == max(top.values())
            assert sum(math.exp(v) for v in top.values()) <= 1.0


@pytest.mark.asyncio
async def test_best_of_returns_the_best_candidates_and_counts_them_all() -> None:
    # Candidate j of best_of is choice j of the same request with n = best_of.
    candidates = (await complete(n=5, logprobs=0, max_tokens=6, seed=9))["choices"]

    def mean(choice: dict[str, Any]) -> float:
        values: list[float] = choice["logprobs"]["token_logprobs"]
        return sum(values) / len(values)

    best = sorted(candidates, key=mean, reverse=True)[:2]
    body = await complete(n=2, best_of=5, logprobs=0, max_tokens=6, seed=9)
    assert texts(body) == [c["text"] for c in best]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 5 * 6
    without_logprobs = await complete(n=2, best_of=5, max_tokens=6, seed=9)
    assert texts(without_logprobs) == texts(body)


# --- streaming -------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"n": 2, "max_tokens": 5, "seed": 5, "logprobs": 2},
        {"prompt": ["a b", "c"], "n": 2, "echo": True, "logprobs": 1, "max_tokens": 3},
        {"stop": [" the", " a"], "max_tokens": 40, "logprobs": 0},
        {"max_tokens": 0},
        {"best_of": 2, "n": 2, "max_tokens": 4},
    ],
)
async def test_stream_deltas_match_the_non_streaming_answer(fields: dict[str, Any]) -> None:
    body = await complete(**fields)
    _, events = await stream_events(**fields)
    for event in events:
        CompletionChunk.model_validate(event)
        assert event["usage"] is None
        assert event["system_fingerprint"] == "mock-simulator"
        assert len(event["choices"]) == 1
    assert len({e["id"] for e in events}) == 1
    for choice in body["choices"]:
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == choice["index"]]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert [c["finish_reason"] for c in mine] == [None] * (len(mine) - 1) + [choice["finish_reason"]]
        if choice["logprobs"] is not None:
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                assert [v for c in mine for v in c["logprobs"][key]] == choice["logprobs"][key]


@pytest.mark.asyncio
async def test_stream_one_event_per_token() -> None:
    _, events = await stream_events(n=3, max_tokens=4)
    assert len(events) == 3 * 4
    assert [e["choices"][0]["index"] for e in events[:3]] == [0, 1, 2]  # choices interleave step by step


@pytest.mark.asyncio
async def test_stream_usage_chunk_only_when_asked() -> None:
    body = await complete(n=2, max_tokens=3)
    _, events = await stream_events(n=2, max_tokens=3, stream_options={"include_usage": True})
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == body["usage"]
    assert all(e["usage"] is None for e in events[:-1])
    _, plain = await stream_events(n=2, max_tokens=3)
    assert all(e["choices"] and e["usage"] is None for e in plain)
    _, off = await stream_events(n=2, max_tokens=3, stream_options={"include_usage": False})
    assert all(e["choices"] for e in off)


@pytest.mark.asyncio
async def test_stream_sets_usage_and_aclose_is_idempotent() -> None:
    stream = await make_backend().stream(make_call(stream=True, max_tokens=5, prompt="x y"))
    assert stream.usage is None
    chunks = [chunk async for chunk in stream]
    assert stream.usage is not None
    assert (stream.usage.prompt_tokens, stream.usage.completion_tokens) == (2, 5)
    assert len(chunks) == 1  # no delays: everything coalesced
    await stream.aclose()
    await stream.aclose()


@pytest.mark.asyncio
async def test_stream_closed_early_stops() -> None:
    stream = await make_backend(token_delay_ms=1).stream(make_call(stream=True, max_tokens=5))
    first = await stream.__anext__()
    assert first.startswith(b"data: ")
    await stream.aclose()
    await stream.aclose()
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert stream.usage is None


@pytest.mark.asyncio
async def test_stream_delays_pace_the_events() -> None:
    backend = make_backend(first_token_delay_ms=30, token_delay_ms=10)
    started = time.monotonic()
    chunks, events = await stream_events(backend, max_tokens=4)
    elapsed = time.monotonic() - started
    assert len(chunks) == len(events) == 4  # one token step per write
    assert elapsed >= 0.055


# --- capabilities ----------------------------------------------------------------------


def test_capabilities() -> None:
    backend = make_backend()
    assert backend.kind == "mock"
    assert backend.capabilities.level("top_k") is Level.UNSUPPORTED
    assert backend.capabilities.level("suffix") is Level.UNSUPPORTED
    for field in ("best_of", "echo", "logprobs", "stop", "n", "temperature", "logit_bias"):
        assert backend.capabilities.level(field) is Level.NATIVE
    overridden = make_backend(capabilities={"top_k": "native"})
    assert overridden.capabilities.level("top_k") is Level.NATIVE
