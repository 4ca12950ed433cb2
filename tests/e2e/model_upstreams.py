"""Simulated model servers, one per backend type, and a gateway serving Responses in front of them all.

The chat goldens of ``chat_upstreams.py`` answer every request with the same recorded tool call,
which is right for checking shapes and wrong for a client that loops (an agent calls its tool,
sends the result, and waits for an answer). Here each HTTP backend type gets a loopback server
speaking its native chat API whose *model* is the ``mock`` backend's simulator
(``backends.mock.chat``): it calls the tool the last user message names, with the JSON object
that message carries, answers JSON of a ``json_schema`` format, and after a tool result answers
``Tool said: <result>`` (so a test sees the result reached the model). Each server records the
native request bodies it got.

- ``vllm``, ``tgi``, ``llamacpp``: ``POST /v1/chat/completions`` (TGI's grammar
  ``response_format: {"type": "json", "value": schema}`` read as a ``json_schema`` format);
- ``ollama``: ``POST /api/chat`` (arguments as objects, ``format`` a schema, NDJSON streams);
- ``vllm-pool``: one worker the gateway starts, ``sim_vllm_worker.py`` (the ``vllm`` kind's server);
- ``openai``: OpenAI's own ``POST /v1/responses``, served by a second gateway whose only backend is
  the ``mock`` (so the outer gateway relays a native Responses upstream, as it does for OpenAI); it
  takes built-in tools as OpenAI does (``builtin_tools: omit``: the mock leaves them out).

:func:`start_responses_gateway` serves ``resp-<type>`` for each of these plus ``resp-mock`` (the
gateway's own ``mock`` backend), every model on the ``responses`` endpoint.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest_asyncio
from aiohttp import web

from backends.mock.chat import chat_chunks, complete_chat
from gateway.app import create_app
from gateway.configfile import parse_config
from schemas.chat import ChatCompletionRequest
from tests.conftest import port_range, serve_app
from tests.e2e.chat_upstreams import GoldenChatUpstream

__all__ = [
    "HTTP_KINDS",
    "KINDS",
    "ResponsesGateway",
    "SimulatedUpstream",
    "model_of",
    "resp_client",
    "resp_gateway",
    "start_responses_gateway",
]

HTTP_KINDS = ("openai", "vllm", "tgi", "ollama", "llamacpp")
KINDS = (*HTTP_KINDS, "vllm-pool", "mock")
NATIVE_KINDS = ("tgi", "ollama", "llamacpp")
_CHAT_KEYS = frozenset(
    {"messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "max_tokens",
     "max_completion_tokens", "stream", "stream_options", "temperature", "seed", "logprobs", "top_logprobs", "stop"}
)  # fmt: skip


def model_of(kind: str) -> str:
    return f"resp-{kind}"


def _tool_result_answer(messages: list[dict[str, Any]]) -> str | None:
    """``Tool said: <result>`` when the conversation ends with a tool result (the model read it)."""
    last = messages[-1] if messages else {}
    if last.get("role") != "tool":
        return None
    content = last.get("content")
    if isinstance(content, list):
        content = "".join(str(part.get("text", "")) for part in content)
    return f"Tool said: {content}"


def _openai_request(body: dict[str, Any], kind: str) -> ChatCompletionRequest:
    """The OpenAI chat request a native body means, for the simulator."""
    chat = {k: v for k, v in body.items() if k in _CHAT_KEYS}
    fmt = chat.get("response_format")
    if kind == "tgi" and isinstance(fmt, dict) and fmt.get("type") == "json":
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "grammar", "schema": fmt["value"]}}
    if kind == "ollama":
        chat["messages"] = list(_ollama_messages(body["messages"]))
        chat.pop("stream", None)
        limit = (body.get("options") or {}).get("num_predict", -1)
        if limit > 0:
            chat["max_tokens"] = limit
        if isinstance(body.get("format"), dict):
            chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "f", "schema": body["format"]}}
        elif body.get("format") == "json":
            chat["response_format"] = {"type": "json_object"}
    return ChatCompletionRequest.model_validate({"model": "simulated", **chat})


def _ollama_messages(messages: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for m in messages:
        out = {"role": m["role"], "content": m.get("content") or ""}
        calls = m.get("tool_calls") or []
        if calls:
            functions = [
                {**c["function"], "arguments": orjson.dumps(c["function"]["arguments"]).decode()} for c in calls
            ]
            out["tool_calls"] = [
                {"id": c.get("id") or f"call_{i}", "type": "function", "function": f}
                for i, (c, f) in enumerate(zip(calls, functions, strict=True))
            ]
        if m["role"] == "tool":
            out["tool_call_id"] = m.get("tool_call_id") or "call_0"
        yield out


def _native_finishes(choices: list[dict[str, Any]], kind: str) -> None:
    """TGI ends every reply, a tool call's too, with ``eos_token`` (or ``length``)."""
    for choice in choices:
        if kind == "tgi" and choice.get("finish_reason") in ("stop", "tool_calls"):
            choice["finish_reason"] = "eos_token"


def _answer(body: dict[str, Any], kind: str) -> dict[str, Any]:
    """The simulator's ``chat.completion`` for a native body (its text replaced after a tool result)."""
    request = _openai_request(body, kind)
    answer = complete_chat(request, "simulated")
    said = _tool_result_answer([m.model_dump(exclude_none=True) for m in request.messages])
    if said is not None:
        answer["choices"][0]["message"].update(content=said, tool_calls=None)
        answer["choices"][0]["finish_reason"] = "stop"
    _native_finishes(answer["choices"], kind)
    return answer


def _chunks(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    request = _openai_request(body, kind)
    said = _tool_result_answer([m.model_dump(exclude_none=True) for m in request.messages])
    if said is None:
        chunks = chat_chunks(request, "simulated")
        for chunk in chunks:
            _native_finishes(chunk["choices"], kind)
        return chunks
    head = {"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": int(time.time()), "model": "simulated"}
    words = said.split(" ")
    deltas = [{"role": "assistant", "content": ""}, *({"content": (" " if i else "") + w} for i, w in enumerate(words))]
    chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    _native_finishes(chunks[-1]["choices"], kind)
    usage = {"prompt_tokens": 10, "completion_tokens": len(words), "total_tokens": 10 + len(words)}
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**head, "choices": [], "usage": usage})
    return chunks


def _ollama_message(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"function": {"name": c["function"]["name"], "arguments": orjson.loads(c["function"]["arguments"])}}
            for c in message["tool_calls"]
        ]
    return out


@dataclass
class SimulatedUpstream(GoldenChatUpstream):
    """One backend type's native chat server on loopback (``GoldenChatUpstream``'s), its model the mock's simulator."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = orjson.loads(await request.read())
        self.requests.append(body)
        if self.kind == "ollama":
            return await self._ollama(request, body)
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(_answer(body, self.kind)), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in _chunks(body, self.kind):
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _ollama(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        answer = _answer(body, "ollama")
        choice, usage = answer["choices"][0], answer["usage"]
        done = {"done": True, "done_reason": "length" if choice["finish_reason"] == "length" else "stop",
                "prompt_eval_count": usage["prompt_tokens"], "eval_count": usage["completion_tokens"]}  # fmt: skip
        head = {"model": body["model"], "created_at": "2026-01-01T00:00:00Z"}
        message = _ollama_message(choice["message"])
        if not body.get("stream", True):
            return web.json_response({**head, "message": message, **done})
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        lines = [{**head, "message": {"role": "assistant", "content": w}, "done": False}
                 for w in message["content"].split(" ") if message["content"]]  # fmt: skip
        lines = [{**line, "message": {**line["message"], "content": (" " if i else "") + line["message"]["content"]}}
                 for i, line in enumerate(lines)]  # fmt: skip
        if "tool_calls" in message:
            lines.append({**head, "message": {"role": "assistant", "content": "", "tool_calls": message["tool_calls"]},
                          "done": False})  # fmt: skip
        lines.append({**head, "message": {"role": "assistant", "content": ""}, **done})
        for line in lines:
            await response.write(orjson.dumps(line) + b"\n")
        await response.write_eof()
        return response


@dataclass
class ResponsesGateway:
    url: str  # http://127.0.0.1:PORT (no /v1)
    upstreams: dict[str, SimulatedUpstream]  # by backend type (not openai: that one is a gateway)

    def sent(self, kind: str) -> list[dict[str, Any]]:
        return self.upstreams[kind].requests


_TIMEOUT = "{connect: 2, first_byte: 20, total: 30, stream_idle: 20}"
_WORKER = Path(__file__).with_name("sim_vllm_worker.py")


def _pool_backend() -> list[str]:
    """One ``vllm-pool`` worker: ``sim_vllm_worker.py`` in place of ``vllm serve``, a hermes tool parser."""
    low, high = port_range(41)  # free now, not a fixed guess: other pytest processes share the machine
    return [
        "  - name: b-vllm-pool",
        "    type: vllm-pool",
        "    model: up-vllm-pool",
        f"    command: {json.dumps([sys.executable, str(_WORKER)])}",
        '    vllm_args: ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]',
        f"    port_range: [{low}, {high}]",
        "    workers: 1",
        "    startup_timeout: 20",
        "    stop_timeout: 2",
        "    routing: {wait_for_ready: 20}",
        f"    timeout: {_TIMEOUT}",
    ]


def _config(urls: dict[str, str], extra_models: str) -> str:
    backends = [
        f"  - {{name: b-openai, type: openai, base_url: {urls['openai']}, api_key: sk-e2e, timeout: {_TIMEOUT}}}",
        f"  - {{name: b-vllm, type: vllm, base_url: {urls['vllm']}, tool_parser: hermes, timeout: {_TIMEOUT}}}",
        *(f"  - {{name: b-{k}, type: {k}, base_url: {urls[k]}, timeout: {_TIMEOUT}}}" for k in NATIVE_KINDS),
        "  - {name: b-mock, type: mock}",
        *_pool_backend(),
    ]  # fmt: skip
    models = [f"  - {{name: {model_of(k)}, routes: [{{backend: b-{k}, model: up-{k}}}]}}" for k in KINDS]
    head = "server: {host: 127.0.0.1, port: 0}\nbackends:\n"
    return head + "\n".join([*backends, "models:", *models]) + "\n" + extra_models


async def _pool_ready(url: str) -> None:
    """One request through the pool: it waits for the worker, whose version the pool then knows (until
    then a pool refuses what depends on the version, e.g. a strict tool, rather than fail open)."""
    body = {"model": model_of("vllm-pool"), "input": "warm up", "max_output_tokens": 2}
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/responses", json=body) as resp:
        assert resp.status == 200, await resp.text()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def resp_gateway() -> AsyncIterator[ResponsesGateway]:
    """One gateway of :func:`start_responses_gateway` per test module."""
    async with start_responses_gateway() as gateway:
        yield gateway


@pytest_asyncio.fixture(loop_scope="module")
async def resp_client(resp_gateway: ResponsesGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    """The openai client on ``resp_gateway``."""
    async with openai.AsyncOpenAI(base_url=f"{resp_gateway.url}/v1", api_key="x", max_retries=0, timeout=30) as c:
        yield c


@asynccontextmanager
async def start_responses_gateway(extra_models: str = "") -> AsyncIterator[ResponsesGateway]:
    """A gateway with one Responses model per backend type, each HTTP one on its simulated server."""
    upstreams = {kind: SimulatedUpstream(kind) for kind in HTTP_KINDS if kind != "openai"}
    runners: list[web.AppRunner] = []
    try:
        for upstream in upstreams.values():
            await upstream.start()
        inner = "server: {host: 127.0.0.1, port: 0}\nbackends:\n  - {name: sim, type: mock}\nmodels:\n"
        # OpenAI runs the built-in tools a client offers (Codex offers web_search every turn); its
        # stand-in's mock cannot, so it leaves them out rather than refuse what OpenAI would take.
        inner += "  - {name: up-openai, routes: [{backend: sim, model: up-openai}], responses: {builtin_tools: omit}}\n"
        runner, openai_url = await serve_app(create_app(parse_config(inner, "<openai stand-in>", env={})))
        runners.append(runner)
        urls = {"openai": openai_url + "/v1", **{kind: up.base_url for kind, up in upstreams.items()}}
        app = create_app(parse_config(_config(urls, extra_models), "<responses e2e config>", env={}))
        runner, url = await serve_app(app)
        runners.append(runner)
        await _pool_ready(url)
        yield ResponsesGateway(url, upstreams)
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
        for upstream in upstreams.values():
            await upstream.stop()
