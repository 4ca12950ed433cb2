"""``GET /v1/models``, ``GET /v1/models/{id}`` and ``GET /version``, with the openai SDK where it has a call.

Model objects carry OpenAI's fields, the endpoints each model is served on, and, for models on vLLM
routes, ``max_model_len`` and ``root`` as the server's own ``/v1/models`` reported them at start-up.
With auth on, a model the key may not use is the same 404 as one that does not exist.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import metadata
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli import main
from gateway.version import PYTHON_VERSION, gateway_version
from tests.e2e.pooling_gateway import MakePooling, PoolingGateway
from tests.pooling_upstream import MAX_MODEL_LEN

KEY = "sk-models-test-key-0123456789abcdef"
AUTH = f"auth:\n  keys:\n    - {{name: team, key: {KEY}, models: ['emb-*']}}\n"


@pytest.fixture
async def client(pooling: PoolingGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{pooling.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
        yield c


async def test_sdk_lists_and_retrieves_every_model(client: openai.AsyncOpenAI) -> None:
    listed = [m async for m in client.models.list()]
    assert [m.id for m in listed][:2] == ["gen", "emb-openai"]
    for model in listed:
        retrieved = await client.models.retrieve(model.id)
        assert retrieved.model_dump() == model.model_dump()
        assert retrieved.object == "model" and retrieved.owned_by == "gateway" and retrieved.created > 0
    by_id: dict[str, Any] = {m.id: m.model_dump() for m in listed}
    assert by_id["gen"]["endpoints"] == ["completions", "chat", "responses"]
    assert by_id["emb-vllm"]["endpoints"] == ["embeddings", "rerank", "tokenize", "detokenize"]
    assert by_id["emb-tei"]["endpoints"] == ["embeddings", "rerank"]
    assert by_id["emb-ollama"]["endpoints"] == ["embeddings"]
    # Learnt from the vLLM server's GET /v1/models when the backend started, never per request.
    assert by_id["emb-vllm"]["max_model_len"] == MAX_MODEL_LEN
    assert by_id["emb-vllm"]["root"] == "/models/up-vllm"
    assert "max_model_len" not in by_id["emb-openai"] and "root" not in by_id["gen"]


async def test_unknown_model_is_openais_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("no-such/model")
    body: Any = missing.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert "no-such/model" in body["message"]


async def test_a_model_the_key_may_not_use_is_the_same_404(make_pooling: MakePooling) -> None:
    gateway = await make_pooling(auth=AUTH)
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0) as client:
        kinds = ("openai", "vllm", "ollama", "llamacpp", "tei", "mock")
        assert {m.id async for m in client.models.list()} == {f"emb-{k}" for k in kinds}
        assert (await client.models.retrieve("emb-vllm")).id == "emb-vllm"
        answers = []
        for name in ("gen", "nothing-here"):
            with pytest.raises(openai.NotFoundError) as missing:
                await client.models.retrieve(name)
            body: Any = missing.value.body
            answers.append({**body, "message": body["message"].replace(name, "X")})
        assert answers[0] == answers[1]  # nothing tells a forbidden model from a missing one
    async with aiohttp.ClientSession() as s:
        for path in ("/v1/models", "/v1/models/emb-vllm", "/version"):
            async with s.get(gateway.url + path) as r:
                assert r.status == 401, path


async def test_version_endpoint_metric_and_cli(pooling: PoolingGateway) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(pooling.url + "/version") as r:
            assert r.status == 200 and await r.json() == {"version": gateway_version()}
        async with s.get(pooling.url + "/metrics") as r:
            text = await r.text()
    (info,) = [f for f in text_string_to_metric_families(text) if f.name == "gateway_build_info"]
    assert [(s.labels, s.value) for s in info.samples] == [
        ({"version": gateway_version(), "python": PYTHON_VERSION}, 1)
    ]


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"gateway {gateway_version()}"
    assert gateway_version() == metadata.version("completions-gateway")  # installed: pip install -e
