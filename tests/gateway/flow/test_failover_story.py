"""A request that fails on every route says what each route did, in the error and in the log line,
not only the last route's failure."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest

from tests.conftest import MakeGateway, free_port
from tests.fakes import Behaviour

DEAD = free_port()  # nothing listens there: connection refused
BACKENDS = f"""  - name: vllm-local
    type: vllm
    base_url: http://127.0.0.1:{DEAD}/v1
    timeout: {{connect: 2, first_byte: 5, total: 10}}
"""
MODELS = """  - name: story
    routes:
      - {backend: vllm-local, model: upstream-llama}
      - {backend: up-openai, model: upstream-gpt}
  - name: story-both
    routes:
      - {backend: vllm-local, model: upstream-llama}
      - {backend: up-vllm, model: upstream-llama}
"""


async def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=body) as resp:
            return resp.status, await resp.json()


async def test_every_route_failed(make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture) -> None:
    gw = await make_gateway(extra_backends=BACKENDS, extra_models=MODELS)
    gw.upstream.script.append(Behaviour(kind="status", status=500, body={"error": {"message": "engine died"}}))
    with caplog.at_level(logging.WARNING, logger="gateway"):
        status, body = await post(gw.url, {"model": "story-both", "prompt": "x", "max_tokens": 2})
    assert status == 502
    message = body["error"]["message"]
    assert message.startswith("No route of model 'story-both' could answer: vllm-local: ")
    assert "Connection refused" in message or "connect" in message.lower()
    assert message.endswith("; up-vllm: the upstream failed (500).")
    assert body["error"]["code"] == "upstream_error"  # the last failure's kind
    assert any(message in r.getMessage() for r in caplog.records)  # the log line says the same


async def test_a_route_that_cannot_honour_the_request_is_named(make_gateway: MakeGateway) -> None:
    """The OpenAI route cannot honour ``top_k``, so only the dead vLLM route is tried: both are named."""
    gw = await make_gateway(extra_backends=BACKENDS, extra_models=MODELS)
    status, body = await post(gw.url, {"model": "story", "prompt": "x", "max_tokens": 2, "top_k": 5})
    assert status == 502
    message = body["error"]["message"]
    assert message.startswith("No route of model 'story' could answer: vllm-local: ")
    assert message.endswith("; up-openai: skipped, cannot honour `top_k`.")


async def test_one_route_one_failure_keeps_its_own_message(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    gw.upstream.script.append(Behaviour(kind="status", status=500, body={"error": {"message": "engine died"}}))
    status, body = await post(gw.url, {"model": "llama-test", "prompt": "x", "max_tokens": 2})
    assert (status, body["error"]["message"]) == (502, "the upstream failed (500)")
