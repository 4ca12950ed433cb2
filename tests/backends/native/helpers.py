"""Shared pieces of the native-backend tests: configs, golden payloads, respx responses, SSE parsing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import respx

from backends.base import CompletionStream, UpstreamCall
from backends.native.base import NativeBackend
from backends.registry import build_backend
from schemas.completions import CompletionRequest
from schemas.config import LlamaCppBackendConfig, OllamaBackendConfig, TGIBackendConfig

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "native"
KINDS = ("tgi", "ollama", "llamacpp")
URLS = {"tgi": "http://tgi.test:8080", "ollama": "http://ollama.test:11434", "llamacpp": "http://llamacpp.test:8081"}
UPSTREAM_MODEL = {"tgi": "tgi-served", "ollama": "llama3.2", "llamacpp": "tiny.gguf"}
COMPLETE_PATH = {"tgi": "/generate", "ollama": "/api/generate", "llamacpp": "/completion"}
STREAM_PATH = {"tgi": "/generate_stream", "ollama": "/api/generate", "llamacpp": "/completion"}
# The golden answers, per backend: (non-streaming body, stream body, stream content type).
GOLDEN = {
    "tgi": ("tgi/generate.json", "tgi/generate_stream.txt", "text/event-stream"),
    "ollama": ("ollama/generate.json", "ollama/generate_stream.ndjson", "application/x-ndjson"),
    "llamacpp": ("llamacpp/completion.json", "llamacpp/completion_stream.txt", "text/event-stream"),
}
STREAM_ERROR = {
    "tgi": "tgi/generate_stream_error.txt",
    "ollama": "ollama/generate_stream_error.ndjson",
    "llamacpp": "llamacpp/completion_stream_error.txt",
}
CONFIGS = {"tgi": TGIBackendConfig, "ollama": OllamaBackendConfig, "llamacpp": LlamaCppBackendConfig}
# The request every golden answer replies to, and what the client must get back from each backend.
GOLDEN_REQUEST: dict[str, Any] = {
    "prompt": "The capital of France is",
    "max_tokens": 8,
    "stop": ["."],
    "logprobs": 2,
    "temperature": 0.7,
    "seed": 42,
}
GOLDEN_CHOICE = {
    "text": " Paris",
    "index": 0,
    "logprobs": {
        "tokens": [" Paris"],
        "token_logprobs": [-0.31],
        "top_logprobs": [{" Paris": -0.31, " the": -1.9}],
        "text_offset": [0],
    },
    "finish_reason": "stop",
}
GOLDEN_USAGE = {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def config(kind: str, **extra: Any) -> TGIBackendConfig | OllamaBackendConfig | LlamaCppBackendConfig:
    data = {"type": kind, "name": f"{kind}-a", "base_url": URLS[kind], "transport": "httpx", **extra}
    return CONFIGS[kind].model_validate(data)  # type: ignore[no-any-return]


def make_backend(kind: str, **extra: Any) -> NativeBackend:
    backend = build_backend(config(kind, **extra))
    assert isinstance(backend, NativeBackend) and backend.kind == kind
    return backend


def make_call(kind: str, **fields: Any) -> UpstreamCall:
    request = CompletionRequest.model_validate({"model": "public", "prompt": "Hi", **fields})
    return UpstreamCall(request, UPSTREAM_MODEL[kind], "public", "req-7")


class Pieces(httpx.AsyncByteStream):
    """A response body delivered in the given pieces (one network read each)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


def stream_response(body: bytes, content_type: str, *, piece: int = 0) -> httpx.Response:
    """``body`` as a 200 stream, cut into ``piece``-byte reads (0: one read)."""
    pieces = [body[i : i + piece] for i in range(0, len(body), piece)] if piece else [body]
    return httpx.Response(200, headers={"Content-Type": content_type}, stream=Pieces(pieces))


def golden_stream(kind: str, *, piece: int = 0) -> httpx.Response:
    _, name, content_type = GOLDEN[kind]
    return stream_response(fixture(name), content_type, piece=piece)


def golden_complete(kind: str) -> httpx.Response:
    headers = {"x-prompt-tokens": "6"} if kind == "tgi" else {}
    return httpx.Response(
        200, content=fixture(GOLDEN[kind][0]), headers={"Content-Type": "application/json", **headers}
    )


def route(mock: respx.MockRouter, kind: str, *, stream: bool = False) -> respx.Route:
    return mock.post(URLS[kind] + (STREAM_PATH if stream else COMPLETE_PATH)[kind])


def sent(route_: respx.Route, call: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(route_.calls[call].request.content)
    return body


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for block in raw.split(b"\n\n"):
        if block:
            assert block.startswith(b"data: "), block
            events.append(orjson.loads(block[len(b"data: ") :]))
    return events


async def drain(stream: CompletionStream) -> list[dict[str, Any]]:
    """Every event of a stream (closing it), checking ``finished`` is set with the last one."""
    raw = b""
    try:
        async for chunk in stream:
            assert chunk
            raw += chunk
    finally:
        await stream.aclose()
    assert stream.finished
    return parse_sse(raw)
