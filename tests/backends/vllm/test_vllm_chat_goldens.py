"""Golden vLLM chat payloads replayed through ``VLLMBackend.chat`` / ``chat_stream`` without a server (respx).

``tests/fixtures/chat/vllm/<version>/<name>.json`` hold the client's body, the body the gateway
must send to that version (``request``), the version's answer (``response`` or SSE ``events``)
and what the client must get (``expect`` / ``expect_events`` / ``expect_error`` /
``expect_stream_error``). They are written from the spec's documented shapes (each file's
``note``); ``tests/backends/vllm/real`` checks the 0.32.0 shapes against a real server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import ChatCall
from backends.errors import UpstreamError, UpstreamStatusError
from backends.vllm.adapter import VLLMBackend
from schemas.chat import ChatCompletionRequest
from schemas.config import VLLMBackendConfig

FIXTURES = Path(__file__).parents[2] / "fixtures" / "chat" / "vllm"
GOLDENS = sorted(FIXTURES.glob("*/*.json"))
URL = "http://vllm.golden:8000/v1"
PUBLIC = "public-name"


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


def backend_for(version: str, tool_parser: str | None = None) -> VLLMBackend:
    data: dict[str, Any] = {"type": "vllm", "name": "golden", "base_url": URL, "transport": "httpx", "version": version}
    if tool_parser:
        data["tool_parser"] = tool_parser
    return VLLMBackend(VLLMBackendConfig.model_validate(data))


def call_for(golden: dict[str, Any]) -> ChatCall:
    request = ChatCompletionRequest.model_validate(golden["client"])
    return ChatCall(request, golden["request"]["model"], PUBLIC, "req-golden")


def answer(golden: dict[str, Any]) -> httpx.Response:
    if "events" in golden:
        body = "".join(event + "\n\n" for event in golden["events"]).encode()
        return httpx.Response(golden["status"], content=body, headers={"Content-Type": "text/event-stream"})
    return httpx.Response(golden["status"], content=orjson.dumps(golden["response"]))


def parse_events(raw: bytes) -> list[Any]:
    return [orjson.loads(e.removeprefix(b"data: ")) for e in raw.split(b"\n\n") if e.strip()]


def test_goldens_cover_every_shape() -> None:
    names = {p.stem for p in GOLDENS}
    assert {"plain", "max_tokens", "error_flat", "error_nested", "guided_choice", "tool_calls"} <= names
    assert {"named_tool_choice", "stream_vllm_keys", "return_token_ids", "stream_return_token_ids"} <= names
    assert {"stream_parallel_tool_calls", "stream_reasoning", "stream_error", "stream_error_flat"} <= names


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_golden(path: Path, mock: respx.MockRouter) -> None:
    golden = load(path)
    version = path.parent.name
    backend = backend_for(version, golden.get("tool_parser"))
    route = mock.post(f"{URL}/chat/completions").mock(return_value=answer(golden))
    call = call_for(golden)
    try:
        if "expect_error" in golden:
            with pytest.raises(UpstreamStatusError) as info:
                await backend.chat(call)
            want = golden["expect_error"]
            assert info.value.status == want["status"]
            assert info.value.param == want["param"]
            assert want["message_has"] in str(info.value)
        elif golden["client"].get("stream"):
            stream = await backend.chat_stream(call)
            out = b""
            try:
                if "expect_stream_error" in golden:
                    with pytest.raises(UpstreamError, match=golden["expect_stream_error"]):
                        async for block in stream:
                            out += block
                else:
                    async for block in stream:
                        out += block
                    assert stream.usage is not None
                    assert [stream.usage.prompt_tokens, stream.usage.completion_tokens] == golden["expect_usage"]
            finally:
                await stream.aclose()
            assert parse_events(out) == golden["expect_events"]
            if "expect_calls" in golden:
                assert reassemble(parse_events(out)) == golden["expect_calls"]
        else:
            result = await backend.chat(call)
            body = orjson.loads(result.body)
            assert body["model"] == PUBLIC
            if "expect" in golden:
                assert body == golden["expect"]
            usage = golden["response"]["usage"]
            assert result.usage is not None and result.usage.completion_tokens == usage["completion_tokens"]
    finally:
        await backend.close()
    sent = orjson.loads(route.calls.last.request.content)
    assert sent == golden["request"]


def reassemble(events: list[Any]) -> dict[str, list[str]]:
    """Tool calls rebuilt from deltas as an OpenAI client does: by index, id/name once, arguments appended."""
    calls: dict[str, list[str]] = {}
    for event in events:
        for choice in event["choices"]:
            for delta in choice["delta"].get("tool_calls") or ():
                key = str(delta["index"])
                if key not in calls:
                    calls[key] = [delta["id"], delta["function"]["name"], ""]
                else:
                    assert "id" not in delta and "name" not in delta["function"]
                calls[key][2] += delta["function"].get("arguments") or ""
    return calls


async def test_interleaved_fragments_split_across_reads_stay_apart(mock: respx.MockRouter) -> None:
    """The same parallel-call stream cut at every byte boundary: each call's arguments stay its own."""
    golden = load(FIXTURES / "0.32.0" / "stream_parallel_tool_calls.json")
    raw = "".join(event + "\n\n" for event in golden["events"]).encode()
    for cut in range(1, len(raw), 37):
        pieces = [raw[:cut], raw[cut:]]
        mock.post(f"{URL}/chat/completions").mock(
            return_value=httpx.Response(200, stream=_Chunks(pieces), headers={"Content-Type": "text/event-stream"})
        )
        backend = backend_for("0.32.0", "hermes")
        stream = await backend.chat_stream(call_for(golden))
        out = b"".join([block async for block in stream])
        await stream.aclose()
        await backend.close()
        assert reassemble(parse_events(out)) == golden["expect_calls"], cut


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces

    async def __aiter__(self) -> Any:
        for piece in self._pieces:
            yield piece
