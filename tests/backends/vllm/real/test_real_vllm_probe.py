"""``gateway check-config --probe`` and a request against a real vLLM whose ``base_url`` was written
without ``/v1`` (the mistake issue 24 names: it passes every config check, then each request failed
as "model not found"): the probe names it with the URL to write and a misspelt served model with the
nearest one; a request is a 502 ``upstream_misconfigured`` naming the path, and a model vLLM does not
serve stays ``upstream_model_not_found``. Uses the session's vLLM server: no start of its own."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.probe import probe
from tests.backends.vllm.real.conftest import SERVED, VLLMServer
from tests.conftest import serve_app

pytestmark = pytest.mark.vllm


def _config(server: VLLMServer) -> str:
    return f"""
backends:
  - {{name: no-v1, type: vllm, base_url: "{server.url}"}}
  - {{name: right, type: vllm, base_url: "{server.url}/v1"}}
models:
  - {{name: lost, routes: [{{backend: no-v1, model: {SERVED}}}]}}
  - {{name: typo, routes: [{{backend: right, model: {SERVED}y}}]}}
  - {{name: fine, routes: [{{backend: right, model: {SERVED}}}]}}
"""


async def test_the_probe_and_a_request_name_a_base_url_without_v1(vllm_server: VLLMServer) -> None:
    config = parse_config(_config(vllm_server), env={})
    found = [(f.backend, f.kind, f.message) for f in await probe(config)]
    url = vllm_server.url
    assert found == [
        (
            "no-v1",
            "base_url",
            f"base_url {url} answers 404 on /models but {url}/v1/models answers: set base_url to {url}/v1 "
            "(every request would fail as not found)",
        ),
        (
            "right",
            "model",
            f"models[1].routes[0].model: '{SERVED}y' is not listed by {url}/v1/models; did you mean '{SERVED}'? "
            f"(listed: {SERVED})",
        ),
    ]
    runner, gateway = await serve_app(create_app(config))
    try:
        async with aiohttp.ClientSession() as session:
            answers = {}
            for model in ("lost", "typo", "fine"):
                body = {"model": model, "prompt": "hi", "max_tokens": 2}
                async with session.post(gateway + "/v1/completions", json=body) as resp:
                    answers[model] = resp.status, await resp.json()
    finally:
        await runner.cleanup()
    status, answer = answers["lost"]
    assert status == 502 and answer["error"]["code"] == "upstream_misconfigured", answer
    assert "answered 404 for POST /completions (the path, not the model)" in answer["error"]["message"]
    status, answer = answers["typo"]
    assert status == 502 and answer["error"]["code"] == "upstream_model_not_found", answer
    assert answers["fine"][0] == 200, answers["fine"]
