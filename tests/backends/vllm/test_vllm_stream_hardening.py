"""vLLM streams from a strict reader's side (issue 13 items 17, 24, 25, 26)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import UpstreamCall
from backends.errors import UpstreamError
from backends.vllm.adapter import VLLMBackend
from schemas.completions import CompletionRequest
from schemas.config import VLLMBackendConfig

URL = "http://vllm.hard:8000/v1"
VERSION_URL = "http://vllm.hard:8000/version"


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def event(finish: Any = None, *, spaced: bool = False, usage: Any = "absent", text: str = " a") -> bytes:
    obj: dict[str, Any] = {"id": "c", "object": "text_completion", "created": 1, "model": "m",
                           "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                                        "stop_reason": None}]}  # fmt: skip
    if usage != "absent":
        obj["usage"] = usage
    data = json.dumps(obj).encode() if spaced else orjson.dumps(obj)
    return b"data: " + data + b"\n\n"


USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


async def run(mock: respx.MockRouter, body: bytes, **fields: Any) -> tuple[list[dict[str, Any]], Exception | None]:
    mock.get(VERSION_URL).mock(return_value=httpx.Response(200, json={"version": "0.32.0"}))
    route = mock.post(URL + "/completions").mock(
        return_value=httpx.Response(200, content=body, headers={"Content-Type": "text/event-stream"})
    )
    config = {"type": "vllm", "name": "v", "base_url": URL, "transport": "httpx"}
    backend = VLLMBackend(VLLMBackendConfig.model_validate(config))
    await backend.start()
    request = CompletionRequest.model_validate({"model": "p", "prompt": "x", "stream": True, **fields})
    stream = await backend.stream(UpstreamCall(request, "m", "p", "r"))
    got = b""
    error: Exception | None = None
    try:
        async for block in stream:
            got += block
    except UpstreamError as exc:
        error = exc
    await stream.aclose()
    await backend.close()
    assert route.called
    events = []
    for raw in got.split(b"\n\n")[:-1]:
        assert raw.startswith(b"data: ") and b"\n" not in raw, raw
        events.append(orjson.loads(raw[len(b"data: ") :]))
    return events, error


async def test_spaced_abort_is_an_error_not_relayed(mock: respx.MockRouter) -> None:
    """Item 24: ``"finish_reason": "abort"`` (spaced JSON) never reaches the client unmapped."""
    events, error = await run(mock, event(spaced=True) + event("abort", spaced=True) + b"data: [DONE]\n\n")
    assert [e["choices"][0]["finish_reason"] for e in events] == [None]
    assert error is not None and error.status == 502


async def test_spaced_repetition_becomes_stop(mock: respx.MockRouter) -> None:
    events, error = await run(mock, event(spaced=True) + event("repetition", spaced=True) + b"data: [DONE]\n\n")
    assert error is None and events[-1]["choices"][0]["finish_reason"] == "stop"


async def test_an_id_line_is_not_a_decode_error(mock: respx.MockRouter) -> None:
    """Item 24: an ``id:`` line before the data of a final event with a foreign finish_reason."""
    body = event() + b"id: 42\n" + event("repetition") + b"data: [DONE]\n\n"
    events, error = await run(mock, body)
    assert error is None
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, "stop"]


async def test_include_usage_gives_usage_null_on_ordinary_chunks(mock: respx.MockRouter) -> None:
    """Item 17: as OpenAI, every ordinary chunk carries ``"usage": null`` when the client asked for usage."""
    usage_chunk = b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":[],"usage":' + \
        orjson.dumps(USAGE) + b"}\n\n"  # fmt: skip
    body = event() + event("length") + usage_chunk + b"data: [DONE]\n\n"
    events, error = await run(mock, body, stream_options={"include_usage": True})
    assert error is None
    assert [e["usage"] for e in events] == [None, None, USAGE]


async def test_without_include_usage_no_usage_key_is_added(mock: respx.MockRouter) -> None:
    events, _ = await run(mock, event() + event("length") + b"data: [DONE]\n\n")
    assert all("usage" not in e for e in events)


async def test_continuous_usage_without_include_usage_sends_no_usage(mock: respx.MockRouter) -> None:
    """Item 26: what vLLM does directly: no usage anywhere, although the gateway asked for its own."""
    body = event(usage=USAGE) + event("length", usage=USAGE) + \
        b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":[],"usage":' + \
        orjson.dumps(USAGE) + b"}\n\n" + b"data: [DONE]\n\n"  # fmt: skip
    events, error = await run(mock, body, stream_options={"include_usage": False, "continuous_usage_stats": True})
    assert error is None and len(events) == 2
    assert all(e.get("usage") is None for e in events)


async def test_concurrent_guided_streams_confirm_the_version_once(mock: respx.MockRouter) -> None:
    """Item 25: 40 guided streams at once make one ``GET /version``, not 40 in a row."""

    async def slow_version(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)  # long enough for every stream to queue behind the first GET
        return httpx.Response(200, json={"version": "0.10.2"})

    version = mock.get(VERSION_URL).mock(side_effect=slow_version)
    mock.post(URL + "/completions").mock(
        return_value=httpx.Response(
            200, content=event("length") + b"data: [DONE]\n\n", headers={"Content-Type": "text/event-stream"}
        )
    )
    config = {"type": "vllm", "name": "v", "base_url": URL, "transport": "httpx"}
    backend = VLLMBackend(VLLMBackendConfig.model_validate(config))
    await backend.start()
    await asyncio.sleep(1.1)  # the start-up confirmation is now too old for a guided stream
    before = version.call_count
    request = CompletionRequest.model_validate({"model": "p", "prompt": "x", "stream": True, "guided_regex": "a+"})

    async def one() -> None:
        stream = await backend.stream(UpstreamCall(request, "m", "p", "r"))
        async for _ in stream:
            pass
        await stream.aclose()

    await asyncio.gather(*(one() for _ in range(40)))
    await backend.close()
    assert version.call_count - before == 1


async def test_vllm_extras_that_carry_nothing_are_cut_and_the_rest_kept(mock: respx.MockRouter) -> None:
    """OpenAI's chunk shape: a null ``stop_reason`` / ``token_ids`` leaves; a matched stop string and
    the token ids a client asked for stay."""
    first = event(text=" a").replace(b'"stop_reason":null}', b'"stop_reason":null,"token_ids":null}')
    last = event("stop", text=" b").replace(b'"stop_reason":null}', b'"stop_reason":"\\n","token_ids":[5,6]}')
    events, error = await run(mock, first + last + b"data: [DONE]\n\n")
    assert error is None
    assert events[0]["choices"][0] == {"index": 0, "text": " a", "logprobs": None, "finish_reason": None}
    assert events[1]["choices"][0]["stop_reason"] == "\n" and events[1]["choices"][0]["token_ids"] == [5, 6]
