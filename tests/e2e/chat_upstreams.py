"""Golden chat upstreams, one real loopback server per backend type, and a gateway in front of them all.

Each :class:`GoldenChatUpstream` is an aiohttp server that speaks one backend type's native chat
API with the recorded payloads of ``tests/fixtures`` (vLLM 0.32.0 for ``openai``/``vllm``, the
TGI, Ollama and llama.cpp goldens for the native servers). It records every request body it
got, so a test sees what the gateway sent upstream, and answers every GET (health probes,
vLLM's ``/version``) with 200. The golden answers are fixed: the tests check the *shape* the
gateway gives back, not the words.

:func:`start_chat_gateway` serves one model per backend type (``chat-<type>``), plus
``chat-vllm-old`` (a vLLM pinned at 0.6.3 without a tool parser) whose refusals differ by
version, on the app ``gateway serve`` builds, with the default transport.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import serve_app

__all__ = [
    "CHAT_PATH",
    "HTTP_KINDS",
    "KINDS",
    "OLD_VERSION",
    "OLD_VLLM",
    "ChatGateway",
    "GoldenChatUpstream",
    "model_of",
    "start_chat_gateway",
]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HTTP_KINDS = ("openai", "vllm", "tgi", "ollama", "llamacpp")  # the ones with an upstream server
KINDS = (*HTTP_KINDS, "mock")
OLD_VLLM = "chat-vllm-old"
CHAT_PATH = {
    "openai": "/v1/chat/completions",
    "vllm": "/v1/chat/completions",
    "tgi": "/v1/chat/completions",
    "ollama": "/api/chat",
    "llamacpp": "/v1/chat/completions",
}
VLLM_VERSION = "0.32.0"
OLD_VERSION = "0.6.3"  # no tool parser either: refuses tool_choice "auto" by name


def model_of(kind: str) -> str:
    return f"chat-{kind}"


def _vllm_golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "chat" / "vllm" / VLLM_VERSION / f"{name}.json").read_text())
    return data


def _native(name: str) -> bytes:
    return (FIXTURES / "native" / name).read_bytes()


def _sse(events: list[str]) -> bytes:
    return "".join(event + "\n\n" for event in events).encode()


# llama.cpp's non-streamed tool-call answer: the golden stream's calls, as one OpenAI-shaped body.
_LLAMACPP_TOOLS = {
    "id": "chatcmpl-Z1", "object": "chat.completion", "created": 1732000000, "model": "tiny.gguf",
    "system_fingerprint": "b6000-abcdef",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
        "tool_calls": [
            {"id": "abc123", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "def456", "type": "function",
             "function": {"name": "get_time", "arguments": '{"tz": "Europe/Rome"}'}},
        ]}}],
    "usage": {"completion_tokens": 25, "prompt_tokens": 140, "total_tokens": 165},
}  # fmt: skip


def _answers(kind: str) -> tuple[bytes, bytes, str]:
    """``(non-stream body, stream body, stream content type)`` of ``kind``'s golden tool-call answer."""
    if kind in ("openai", "vllm"):
        plain = orjson.dumps(_vllm_golden("tool_calls")["response"])
        return plain, _sse(_vllm_golden("stream_parallel_tool_calls")["events"]), "text/event-stream"
    if kind == "tgi":
        return _native("tgi/chat_tool.json"), _native("tgi/chat_tool_stream.txt"), "text/event-stream"
    if kind == "ollama":
        return _native("ollama/chat_tools.json"), _native("ollama/chat_tools_stream.ndjson"), "application/x-ndjson"
    return orjson.dumps(_LLAMACPP_TOOLS), _native("llamacpp/chat_tools_stream.txt"), "text/event-stream"


@dataclass
class GoldenChatUpstream:
    """One backend type's native chat server on loopback, answering with its golden payloads."""

    kind: str
    version: str = VLLM_VERSION  # what GET /version reports (vLLM: the server's word beats a pin)
    requests: list[dict[str, Any]] = field(default_factory=list)  # chat request bodies, in order
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(CHAT_PATH[self.kind], self._chat)
        app.router.add_get("/{tail:.*}", self._get)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        """What the backend's ``base_url`` key takes (OpenAI-family backends include ``/v1``)."""
        return self.url + "/v1" if self.kind in ("openai", "vllm") else self.url

    async def _get(self, request: web.Request) -> web.Response:
        if request.path == "/version":
            return web.json_response({"version": self.version})
        if request.path.endswith("/models"):
            return web.json_response({"object": "list", "data": [{"id": "upstream", "object": "model"}]})
        return web.json_response({"version": "0.12.0"})  # Ollama's /api/version; TGI/llama.cpp /health

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = orjson.loads(await request.read())
        self.requests.append(body)
        plain, stream, content_type = _answers(self.kind)
        # Ollama streams unless told not to; the others stream only when asked.
        streaming = body.get("stream", True) if self.kind == "ollama" else bool(body.get("stream"))
        if not streaming:
            return web.Response(body=plain, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        await response.write(stream)
        await response.write_eof()
        return response


@dataclass
class ChatGateway:
    url: str  # http://127.0.0.1:PORT (no /v1)
    upstreams: dict[str, GoldenChatUpstream]  # by backend type, plus OLD_VLLM

    def reset(self) -> None:
        for upstream in self.upstreams.values():
            upstream.requests.clear()

    def sent(self, kind: str) -> list[dict[str, Any]]:
        return self.upstreams[kind].requests


def _config(upstreams: dict[str, GoldenChatUpstream]) -> str:
    backends = [
        f"  - {{name: b-openai, type: openai, base_url: {upstreams['openai'].base_url}, api_key: sk-e2e}}",
        f"  - {{name: b-vllm, type: vllm, base_url: {upstreams['vllm'].base_url}, tool_parser: hermes}}",
        f"  - {{name: b-vllm-old, type: vllm, base_url: {upstreams[OLD_VLLM].base_url}, version: '{OLD_VERSION}'}}",
        *(f"  - {{name: b-{k}, type: {k}, base_url: {upstreams[k].base_url}}}" for k in ("tgi", "ollama", "llamacpp")),
        "  - {name: b-mock, type: mock}",
    ]
    models = [f"  - {{name: {model_of(k)}, routes: [{{backend: b-{k}, model: up-{k}}}]}}" for k in KINDS]
    models.append(f"  - {{name: {OLD_VLLM}, routes: [{{backend: b-vllm-old, model: up-vllm}}]}}")
    # The audit log on: ``user`` is honoured there on every backend (tests/e2e/test_chat_nothing_dropped.py).
    head = "server: {host: 127.0.0.1, port: 0, audit_log: true}\nbackends:\n"
    return head + "\n".join([*backends, "models:", *models]) + "\n"


@asynccontextmanager
async def start_chat_gateway() -> AsyncIterator[ChatGateway]:
    """A gateway with one model per backend type, each HTTP one on its own golden upstream."""
    upstreams = {kind: GoldenChatUpstream(kind) for kind in HTTP_KINDS}
    upstreams[OLD_VLLM] = GoldenChatUpstream("vllm", OLD_VERSION)
    for upstream in upstreams.values():
        await upstream.start()
    runner: web.AppRunner | None = None
    try:
        app = create_app(parse_config(_config(upstreams), "<chat e2e config>", env={}))
        runner, url = await serve_app(app)
        yield ChatGateway(url, upstreams)
    finally:
        if runner is not None:
            await runner.cleanup()
        for upstream in upstreams.values():
            await upstream.stop()
