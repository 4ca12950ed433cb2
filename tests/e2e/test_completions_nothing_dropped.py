"""Nothing silently dropped on ``/v1/completions``: vLLM's own fields that chat takes too
(``schemas.vllm_extras``) and ``prompt_embeds``, each set to a value that asks for something, on
every backend type; vLLM's completions ``response_format`` likewise.

Each HTTP backend type has its own loopback upstream that records the bodies it got. A field must
reach a vLLM server whose version has it (the value in the recorded body, under its own name) and
be refused by name everywhere else (400 ``unsupported_parameter``, ``param`` the field, nothing
sent): on ``openai``, ``mock``, the native servers, a vLLM too old for it and a vLLM whose version
is unknown. The expectations are written out here, and the backend's table must agree with them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from backends.capabilities import Level
from backends.vllm.versions import COMPLETIONS_EXTRAS_SINCE
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from tests.conftest import serve_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

# field -> (a value that asks for something, other fields that value needs)
ASKS: dict[str, tuple[Any, dict[str, Any]]] = {
    "bad_words": (["BAD77"], {}),
    "logprob_token_ids": ([771, 772], {"logprobs": 1}),
    "thinking_token_budget": (77, {}),
    "watermarking": (True, {}),
    "priority": (77, {}),
    "request_id": ("rid-77", {}),
    "session_id": ("session-77", {}),
    "routed_experts_prompt_start": (77, {}),
    "cache_salt": ("salt-77", {}),
    "kv_transfer_params": ({"kv77": True}, {}),
    "ec_transfer_params": ({"ec77": True}, {}),
    "vllm_xargs": ({"xarg77": 77}, {}),
    "repetition_detection": ({"max_pattern_size": 7, "min_count": 3}, {}),
    "stream_interval": (7, {}),
    "prompt_embeds": (["UEsDBA==", "gAJ9cQAu"], {}),  # a server without --enable-prompt-embeds answers 400
}
# What /version says (None: no answer, and no pin); the native types answer their own probes.
VERSIONS = {"vllm": "0.32.0", "vllm-multi": "0.32.0", "vllm-0.12": "0.12.0", "vllm-unknown": None}
HTTP_KINDS = ("openai", *VERSIONS, "tgi", "ollama", "llamacpp")
KINDS = (*HTTP_KINDS, "mock")
# Where each field is honoured: every one from 0.32; 0.12.0 has those its completions request had.
HONOURED = {
    "vllm": set(ASKS),
    "vllm-multi": set(ASKS),  # several servers (the dispatcher a vllm-pool uses too)
    "vllm-0.12": {"priority", "request_id", "cache_salt", "kv_transfer_params", "vllm_xargs", "prompt_embeds"},
}
ANSWER = {
    "id": "cmpl-77", "object": "text_completion", "created": 1, "model": "up",
    "choices": [{"index": 0, "text": " ok", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                 "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": "RE77"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    "kv_transfer_params": {"remote_block_ids": [77]}, "ec_transfer_params": None,
}  # fmt: skip


@dataclass
class Recorder:
    """An upstream on loopback that records every POST body and answers a vLLM-shaped completion."""

    version: str | None
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._post)
        app.router.add_get("/{tail:.*}", self._get)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def _get(self, request: web.Request) -> web.Response:
        if request.path == "/version":
            return web.json_response({"version": self.version}, status=200 if self.version else 404)
        if request.path.endswith("/models"):
            return web.json_response({"object": "list", "data": [{"id": "up", "object": "model"}]})
        return web.json_response({"version": "0.12.0"})  # Ollama's /api/version; health probes

    async def _post(self, request: web.Request) -> web.Response:
        self.requests.append(orjson.loads(await request.read()))
        return web.json_response(ANSWER)


@dataclass
class Gateway:
    url: str
    app: web.Application
    upstreams: dict[str, Recorder]


def _config(up: dict[str, Recorder]) -> str:
    lines = [f"  - {{name: b-openai, type: openai, base_url: {up['openai'].url}/v1, api_key: sk-e2e}}"]
    for kind in ("vllm", "vllm-0.12", "vllm-unknown"):
        lines.append(f"  - {{name: b-{kind}, type: vllm, base_url: {up[kind].url}/v1}}")
    lines.append(f"  - {{name: b-vllm-multi, type: vllm, base_urls: [{up['vllm-multi'].url}/v1]}}")
    lines += [f"  - {{name: b-{k}, type: {k}, base_url: {up[k].url}}}" for k in ("tgi", "ollama", "llamacpp")]
    lines.append("  - {name: b-mock, type: mock}")
    models = [f"  - {{name: m-{k}, routes: [{{backend: b-{k}, model: up}}]}}" for k in KINDS]
    return "backends:\n" + "\n".join([*lines, "models:", *models]) + "\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    upstreams = {kind: Recorder(VERSIONS.get(kind, "0.32.0")) for kind in HTTP_KINDS}
    for upstream in upstreams.values():
        await upstream.start()
    app = create_app(parse_config(_config(upstreams), "<completions e2e config>", env={}))
    runner, url = await serve_app(app)
    try:
        yield Gateway(url, app, upstreams)
    finally:
        await runner.cleanup()
        for upstream in upstreams.values():
            assert upstream.runner is not None
            await upstream.runner.cleanup()


async def post(gateway: Gateway, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway.url}/v1/completions", json=body) as resp:
            return resp.status, orjson.loads(await resp.read())


async def test_every_shared_vllm_field_has_a_value_and_a_version() -> None:
    assert set(ASKS) == set(COMPLETIONS_EXTRAS_SINCE)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(ASKS))
async def test_every_field_is_sent_or_refused_by_name(gateway: Gateway, kind: str, name: str) -> None:
    for upstream in gateway.upstreams.values():
        upstream.requests.clear()
    value, needs = ASKS[name]
    status, body = await post(gateway, {"model": f"m-{kind}", "prompt": "Hi", **needs, name: value})
    table = gateway.app[STATE].backends[f"b-{kind}"].capabilities
    if name not in HONOURED.get(kind, set()):
        assert status == 400, body
        assert (body["error"]["code"], body["error"]["param"]) == ("unsupported_parameter", name), body
        assert name in body["error"]["message"], body
        assert all(not u.requests for u in gateway.upstreams.values()), "refused, yet sent"
        assert table.level(name) is Level.UNSUPPORTED
        return
    assert status == 200, body
    assert table.level(name) is Level.NATIVE
    (sent,) = gateway.upstreams[kind].requests
    assert sent[name] == value, sent


@pytest.mark.parametrize("kind", ["vllm", "vllm-multi"])
async def test_what_the_fields_ask_for_comes_back(gateway: Gateway, kind: str) -> None:
    fields = {"model": f"m-{kind}", "prompt": "Hi"}
    status, plain = await post(gateway, fields)
    assert status == 200 and "kv_transfer_params" not in plain and "routed_experts" not in plain["choices"][0]
    asked = {
        "kv_transfer_params": {"do_remote_decode": True},
        "ec_transfer_params": {},
        "routed_experts_prompt_start": 0,
    }
    status, body = await post(gateway, {**fields, **asked})
    assert status == 200, body
    assert body["kv_transfer_params"] == {"remote_block_ids": [77]}  # what the decode step needs
    assert "ec_transfer_params" in body and body["ec_transfer_params"] is None
    assert body["choices"][0]["routed_experts"] == "RE77"


RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "properties": {
    "n": {"type": "integer"}}, "required": ["n"]}}}  # fmt: skip


@pytest.mark.parametrize("kind", ["openai", *VERSIONS, "mock"])
async def test_response_format_is_applied_or_refused_by_name(gateway: Gateway, kind: str) -> None:
    """vLLM from 0.12 takes it as sent (the native types translate it: tests/backends/native); OpenAI's
    completions has none, an unknown vLLM may ignore it (0.11 does); the mock writes JSON of the schema."""
    for upstream in gateway.upstreams.values():
        upstream.requests.clear()
    status, body = await post(
        gateway, {"model": f"m-{kind}", "prompt": "Hi", "max_tokens": 64, "response_format": RESPONSE_FORMAT}
    )
    if kind in ("openai", "vllm-unknown"):
        assert status == 400 and body["error"]["param"] == "response_format", body
        assert body["error"]["code"] == "unsupported_parameter"
        assert all(not u.requests for u in gateway.upstreams.values())
        return
    assert status == 200, body
    if kind == "mock":
        assert isinstance(orjson.loads(body["choices"][0]["text"])["n"], int)
        return
    (sent,) = gateway.upstreams[kind].requests
    assert sent["response_format"] == RESPONSE_FORMAT


async def test_the_rules_shared_with_chat_hold_on_completions(gateway: Gateway) -> None:
    gateway.upstreams["vllm"].requests.clear()
    cases = [
        ({"logprob_token_ids": [1]}, "logprob_token_ids"),  # needs logprobs
        ({"logprob_token_ids": [1], "logprobs": 1, "use_beam_search": True}, "logprob_token_ids"),
        ({"routed_experts_prompt_start": 1, "stream": True}, "routed_experts_prompt_start"),
        ({"cache_salt": "x" * 1025}, "cache_salt"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"stream_interval": 0}, "stream_interval"),
        ({"vllm_xargs": {"k": 2**63}}, "vllm_xargs"),
        ({"repetition_detection": {"max_pattern_size": 3, "min_count": 1}}, "repetition_detection"),
        ({"bad_words": [""]}, "bad_words"),
    ]
    for extra, param in cases:
        status, body = await post(gateway, {"model": "m-vllm", "prompt": "Hi", **extra})
        assert status == 400 and body["error"]["param"].startswith(param), (extra, body)
    assert not gateway.upstreams["vllm"].requests
