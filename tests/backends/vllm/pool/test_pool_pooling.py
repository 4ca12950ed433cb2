"""A ``vllm-pool`` whose workers run a pooling model (``--runner pooling``), with stand-in workers.

The pool serves what a pooling vLLM serves (embeddings, rerank, the tokenizer) and a model on it
defaults to those, never to completions or chat; requests spread over the workers; the model object
carries the workers' ``max_model_len``. The same holds for the pool's clients in ``gateway serve
--workers N`` (``VLLMPoolClient``), which take the endpoints from the same config property.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from yarl import URL

from backends.vllm.pool.client import VLLMPoolClient
from backends.vllm.pool.pool import pool_endpoints
from schemas.endpoints import POOLING_ENDPOINTS, TOKENIZER_ENDPOINTS, Endpoint
from tests.backends.vllm.pool.conftest import MakePoolGateway, PoolGateway, pool_config, wait_for

POOLING_ARGS = ("--runner", "pooling", "--max-model-len", "1024")


@pytest.fixture
async def gateway(make_pool_gateway: MakePoolGateway) -> PoolGateway:
    gw = await make_pool_gateway(workers=2, extra_args=POOLING_ARGS)
    await wait_for(lambda: sum(ep.available for ep in gw.pool.dispatcher.endpoints) == 2, 20, "two ready workers")
    return gw


@pytest.fixture
async def client(gateway: PoolGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
        yield c


async def test_pooling_pool_serves_embeddings_rerank_and_tokenizer(
    gateway: PoolGateway, client: openai.AsyncOpenAI
) -> None:
    ports = set()
    for _ in range(8):  # least-load routing over two idle workers: both answer sooner or later
        answer = await client.embeddings.create(model="m", input=["one two", "three"], encoding_format="float")
        assert [d.embedding[1] for d in answer.data] == [2.0, 1.0]
        assert answer.usage.prompt_tokens == 3 and answer.model == "m"
        ports.add(int(answer.data[0].embedding[0]))
    assert ports == {URL(ep.url).port for ep in gateway.pool.dispatcher.endpoints}
    async with aiohttp.ClientSession() as s:
        body = {"model": "m", "query": "red fox", "documents": ["a dog", "the red fox"], "top_n": 1}
        async with s.post(gateway.url + "/v1/rerank", json=body) as r:
            assert r.status == 200
            assert [(x["index"], x["document"]["text"]) for x in (await r.json())["results"]] == [(1, "the red fox")]
        async with s.post(gateway.url + "/tokenize", json={"model": "m", "prompt": "ab cde"}) as r:
            assert r.status == 200 and (await r.json())["tokens"] == [2, 3]


async def test_pooling_model_defaults_to_the_pooling_endpoints(
    gateway: PoolGateway, client: openai.AsyncOpenAI
) -> None:
    model = (await client.models.retrieve("m")).model_dump()
    assert model["endpoints"] == ["embeddings", "rerank", "tokenize", "detokenize"]
    assert model["max_model_len"] == 1024  # what the workers' GET /v1/models says
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    body = missing.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_supported_on_endpoint"
    assert "v1/embeddings" in body["message"]


def test_pool_endpoints_from_the_config(tag: str, tmp_path: Path) -> None:
    pooling = pool_config(tag, tmp_path, extra_args=POOLING_ARGS)
    generating = pool_config(tag, tmp_path)
    assert pool_endpoints(pooling) == POOLING_ENDPOINTS | TOKENIZER_ENDPOINTS
    assert {Endpoint.COMPLETIONS, Endpoint.CHAT} <= pool_endpoints(generating)
    # --workers N: each gateway worker's client of the control process's pool serves the same.
    assert VLLMPoolClient(pooling, row=0).endpoints == pool_endpoints(pooling)
    assert VLLMPoolClient(generating, row=0).endpoints == pool_endpoints(generating)
