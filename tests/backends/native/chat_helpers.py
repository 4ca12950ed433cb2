"""Shared pieces of the native chat tests: calls, golden payload names, respx routes."""

from __future__ import annotations

from typing import Any

import httpx
import respx

from backends.base import ChatCall
from schemas.chat import ChatCompletionRequest
from tests.backends.native.helpers import UPSTREAM_MODEL, URLS, fixture, stream_response

CHAT_PATH = {"tgi": "/v1/chat/completions", "ollama": "/api/chat", "llamacpp": "/v1/chat/completions"}
CONTENT_TYPE = {"tgi": "text/event-stream", "ollama": "application/x-ndjson", "llamacpp": "text/event-stream"}
STREAM_EXT = {"tgi": "txt", "ollama": "ndjson", "llamacpp": "txt"}
USER = {"role": "user", "content": "The capital of France?"}
# The request every golden chat answer replies to, and what the client gets from every backend.
GOLDEN_CHAT: dict[str, Any] = {"messages": [USER], "logprobs": True, "top_logprobs": 1, "max_tokens": 8}
GOLDEN_LOGPROBS = {
    "content": [
        {"token": "Paris", "logprob": -0.31, "bytes": [80, 97, 114, 105, 115], "top_logprobs": [
            {"token": "Paris", "logprob": -0.31, "bytes": [80, 97, 114, 105, 115]}]},
        {"token": ".", "logprob": -0.05, "bytes": [46], "top_logprobs": [
            {"token": ".", "logprob": -0.05, "bytes": [46]}]},
    ],
    "refusal": None,
}  # fmt: skip
GOLDEN_USAGE = {"prompt_tokens": 14, "completion_tokens": 2, "total_tokens": 16}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}
# WEATHER without strict: Ollama refuses strict tools (nothing there holds the arguments to the schema).
LOOSE_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER["function"].items() if k != "strict"}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def chat_call(kind: str, **fields: Any) -> ChatCall:
    request = ChatCompletionRequest.model_validate({"model": "public", "messages": [USER], **fields})
    return ChatCall(request, UPSTREAM_MODEL[kind], "public", "req-7")


def chat_route(mock: respx.MockRouter, kind: str) -> respx.Route:
    return mock.post(URLS[kind] + CHAT_PATH[kind])


def json_answer(kind: str, name: str) -> httpx.Response:
    return httpx.Response(200, content=fixture(f"{kind}/{name}"), headers={"Content-Type": "application/json"})


def stream_answer(kind: str, name: str, *, piece: int = 0) -> httpx.Response:
    return stream_response(fixture(f"{kind}/{name}.{STREAM_EXT[kind]}"), CONTENT_TYPE[kind], piece=piece)


def reassemble(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Chunks -> per choice index: content, tool calls (by index), finish, logprobs (as a client does)."""
    out: dict[int, dict[str, Any]] = {}
    for event in events:
        for choice in event["choices"]:
            got = out.setdefault(choice["index"], {"content": "", "calls": {}, "finish": None, "logprobs": []})
            delta = choice["delta"]
            got["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                entry = got["calls"].setdefault(call["index"], {"id": None, "name": None, "arguments": ""})
                if "id" in call:
                    assert entry["id"] is None, "id sent twice for one call"
                    entry["id"], entry["name"] = call["id"], call["function"]["name"]
                    assert call["type"] == "function"
                else:
                    assert "name" not in call["function"], "name after the call's first delta"
                entry["arguments"] += call["function"].get("arguments") or ""
            if choice["logprobs"]:
                got["logprobs"] += choice["logprobs"]["content"]
            if choice["finish_reason"]:
                got["finish"] = choice["finish_reason"]
    return out
