"""Rerank on every backend that serves it (with the cohere SDK too), big embedding batches split for
servers that take fewer inputs per call, and the recorded answers of Ollama, llama.cpp and TEI."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import cohere
import pytest

from tests.e2e.pooling_gateway import (
    RERANKERS,
    MakePooling,
    PoolingGateway,
)
from tests.pooling_upstream import FAIL, FIXTURES, PoolingUpstream, fake_vector

DOCS = ["the quick brown fox", "a lazy dog sleeps", "quick quick fox jumps"]


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as r:
        return r.status, await r.json()


# --- rerank ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", RERANKERS)
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank", "/rerank"])
async def test_rerank_sorted_with_original_index(pooling: PoolingGateway, kind: str, path: str) -> None:
    status, body = await post(pooling.url, path, {"model": f"emb-{kind}", "query": "quick fox", "documents": DOCS})
    assert status == 200, body
    assert body["model"] == f"emb-{kind}"
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert sorted(r["index"] for r in body["results"]) == [0, 1, 2]
    assert all(r["document"]["text"] == DOCS[r["index"]] for r in body["results"])
    assert body["usage"]["prompt_tokens"] > 0
    if kind != "mock":
        assert body["results"][0]["index"] in (0, 2)  # the fake's word overlap: the fox documents first
        assert body["results"][-1]["index"] == 1


@pytest.mark.parametrize("kind", RERANKERS)
async def test_rerank_top_n_and_no_documents(pooling: PoolingGateway, kind: str) -> None:
    docs: list[Any] = [{"text": d} for d in DOCS]
    request = {"model": f"emb-{kind}", "query": "quick fox", "documents": docs, "top_n": 2, "return_documents": False}
    status, body = await post(pooling.url, "/v1/rerank", request)
    assert status == 200, body
    assert len(body["results"]) == 2
    assert all("document" not in r for r in body["results"])
    if kind == "vllm":
        sent = pooling.upstream.requests[-1].body
        assert sent["documents"] == DOCS and sent["top_n"] == 2 and "return_documents" not in sent


@pytest.mark.parametrize("kind", ["ollama", "llamacpp"])
async def test_rerank_where_not_served_is_refused_at_config_load(pooling_upstream: PoolingUpstream, kind: str) -> None:
    from gateway.app import create_app
    from gateway.configfile import ConfigError, parse_config
    from tests.e2e.pooling_gateway import pooling_config

    text = pooling_config(pooling_upstream.url).replace(
        f"routes: [{{backend: b-{kind}, model: up-{kind}}}], endpoints: [embeddings]",
        f"routes: [{{backend: b-{kind}, model: up-{kind}}}], endpoints: [embeddings, rerank]",
    )
    with pytest.raises(ConfigError, match="rerank"):
        create_app(parse_config(text, "<t>", env={}))


async def test_rerank_vllm_extras_refused_by_name_on_tei(pooling: PoolingGateway) -> None:
    status, body = await post(
        pooling.url, "/v1/rerank", {"model": "emb-tei", "query": "q", "documents": ["a"], "truncate_prompt_tokens": 3}
    )
    assert status == 400 and body["error"]["param"] == "truncate_prompt_tokens"


@pytest.mark.parametrize("kind", ["vllm", "tei", "mock"])
async def test_cohere_sdk_rerank(pooling: PoolingGateway, kind: str) -> None:
    def run() -> tuple[Any, Any]:
        v2 = cohere.ClientV2(base_url=pooling.url, api_key="x")
        v1 = cohere.Client(base_url=pooling.url, api_key="x")
        return (
            v2.rerank(model=f"emb-{kind}", query="quick fox", documents=DOCS, top_n=2),
            v1.rerank(model=f"emb-{kind}", query="quick fox", documents=DOCS, top_n=3, return_documents=True),
        )

    second, first = await asyncio.to_thread(run)
    assert len(second.results) == 2
    assert second.results[0].relevance_score >= second.results[1].relevance_score
    assert [r.document.text for r in first.results] == [DOCS[r.index] for r in first.results]  # type: ignore[union-attr]


# --- large batches -----------------------------------------------------------------------------


async def test_2048_inputs_split_for_tei_joined_in_order(pooling: PoolingGateway) -> None:
    up = pooling.upstream
    up.max_batch, up.delay = 32, 0.01
    inputs = [f"text number {i}" for i in range(2048)]
    status, body = await post(pooling.url, "/v1/embeddings", {"model": "emb-tei", "input": inputs})
    assert status == 200, body
    assert [d["index"] for d in body["data"]] == list(range(2048))
    assert all(d["embedding"] == fake_vector(t) for d, t in zip(body["data"], inputs, strict=True))
    assert body["usage"]["prompt_tokens"] == 3 * 2048  # each part's usage summed
    assert len(up.requests) == 64 and all(len(r.body["input"]) == 32 for r in up.requests)
    assert 1 < up.most_in_flight <= 4  # concurrent, bounded by max_parallel_calls


async def test_2048_token_id_inputs_relayed_in_one_call_to_vllm(pooling: PoolingGateway) -> None:
    inputs = [[i, i + 1, i + 2] for i in range(2048)]
    status, body = await post(pooling.url, "/v1/embeddings", {"model": "emb-vllm", "input": inputs})
    assert status == 200
    assert len(body["data"]) == 2048 and len(pooling.upstream.requests) == 1


async def test_tei_without_splitting_would_be_refused(make_pooling: MakePooling) -> None:
    gateway = await make_pooling(tei_batch=64)
    gateway.upstream.max_batch = 32
    status, body = await post(gateway.url, "/v1/embeddings", {"model": "emb-tei", "input": ["a"] * 40})
    assert status == 413  # TEI's own refusal, relayed: the config must match --max-client-batch-size
    assert "maximum allowed batch size" in body["error"]["message"]


@pytest.mark.parametrize("kind", ["tei", "ollama"])
async def test_one_failed_part_fails_the_request(pooling: PoolingGateway, kind: str) -> None:
    inputs = [f"t{i}" for i in range(300)]
    inputs[200] = FAIL
    status, body = await post(pooling.url, "/v1/embeddings", {"model": f"emb-{kind}", "input": inputs})
    assert status == 502  # the upstream's failure (its 500), nothing half-returned
    assert "data" not in body and body["error"]["code"] == "upstream_error"


async def test_tei_rerank_split_and_sorted_across_parts(pooling: PoolingGateway) -> None:
    pooling.upstream.max_batch = 32
    docs = [f"doc {i}" + (" quick fox" if i % 7 == 0 else "") for i in range(100)]
    status, body = await post(pooling.url, "/v1/rerank", {"model": "emb-tei", "query": "quick fox", "documents": docs})
    assert status == 200, body
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 100
    assert {r["index"] for r in body["results"][:15]} == {i for i in range(100) if i % 7 == 0}


# --- recorded answers of the native servers --------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "path", "fixture"),
    [
        ("ollama", "/api/embed", "ollama_embed.json"),
        ("llamacpp", "/v1/embeddings", "llamacpp_embeddings.json"),
        ("tei", "/v1/embeddings", "tei_embeddings.json"),
    ],
)
async def test_recorded_embedding_answers(pooling: PoolingGateway, kind: str, path: str, fixture: str) -> None:
    pooling.upstream.golden[path] = (FIXTURES / fixture).read_bytes()
    status, body = await post(pooling.url, "/v1/embeddings", {"model": f"emb-{kind}", "input": ["a", "b"]})
    assert status == 200, body
    assert body == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.010071029, -0.0017594862, 0.05007221, 0.04692972]},
            {"object": "embedding", "index": 1, "embedding": [-0.0098027075, 0.06042469, 0.025257962, -0.006364387]},
        ],
        "model": f"emb-{kind}",
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    }


async def test_recorded_tei_rerank(pooling: PoolingGateway) -> None:
    pooling.upstream.golden["/rerank"] = (FIXTURES / "tei_rerank.json").read_bytes()
    status, body = await post(pooling.url, "/v1/rerank", {"model": "emb-tei", "query": "q", "documents": ["x", "y"]})
    assert status == 200
    assert body["results"] == [
        {"index": 1, "relevance_score": 0.9987, "document": {"text": "y"}},
        {"index": 0, "relevance_score": 0.0213, "document": {"text": "x"}},
    ]
    assert body["usage"] == {"prompt_tokens": 21, "total_tokens": 21}  # TEI's x-compute-tokens
