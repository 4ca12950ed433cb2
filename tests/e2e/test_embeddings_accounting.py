"""Keys, per-key token limits, metrics (``endpoint`` label) and the audit line cover embeddings and rerank."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.pooling_gateway import MakePooling
from tests.gateway.security.conftest import Lines, audit_lines

__all__ = ["audit_lines"]  # the fixture

KEY = "sk-embed-test-key-0123456789abcdef"
AUTH = f"auth:\n  keys:\n    - {{name: team, key: {KEY}, tpm: 1000, models: ['emb-*']}}\n"
HEADERS = {"Authorization": f"Bearer {KEY}"}


async def test_embedding_tokens_count_against_the_key(make_pooling: MakePooling, audit_lines: Lines) -> None:
    gateway = await make_pooling(auth=AUTH, server="audit_log: true")
    async with aiohttp.ClientSession(headers=HEADERS) as s:
        body = {"model": "emb-vllm", "input": ["one two three", "four five"]}  # the fake counts 5 tokens
        async with s.post(f"{gateway.url}/v1/embeddings", json=body) as r:
            assert r.status == 200
            assert (await r.json())["usage"]["prompt_tokens"] == 5
        async with s.post(f"{gateway.url}/v1/embeddings", json={"model": "emb-vllm", "input": "x"}) as r:
            # the first request settled at its usage: 5 tokens gone; this one's estimate (1) reserved
            assert 1000 - 5 - 1 <= int(r.headers["x-ratelimit-remaining-tokens"]) <= 1000 - 5
        async with s.post(f"{gateway.url}/v1/embeddings", json={"model": "gen", "input": "x"}) as r:
            assert r.status == 403  # the key may use emb-* only
        async with s.post(
            f"{gateway.url}/v1/rerank", json={"model": "emb-vllm", "query": "q", "documents": ["a b"]}
        ) as r:
            assert r.status == 200
        async with s.get(f"{gateway.url}/metrics") as r:
            text = await r.text()
    async with aiohttp.ClientSession() as s, s.post(f"{gateway.url}/v1/embeddings", json=body) as r:
        assert r.status == 401
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(name: str, **labels: str) -> float:
        return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())

    ok = {"model": "emb-vllm", "backend": "b-vllm", "status": "200"}
    assert value("gateway_requests_total", **ok, endpoint="embeddings") == 2
    assert value("gateway_requests_total", **ok, endpoint="rerank") == 1
    assert value("gateway_prompt_tokens_total", model="emb-vllm", endpoint="embeddings") == 6
    audit = audit_lines.records
    assert [a["endpoint"] for a in audit if a["status"] == 200] == ["embeddings", "embeddings", "rerank"]
    assert audit[0]["prompt_tokens"] == 5 and audit[0]["key"] == "team"


async def test_a_request_over_the_tpm_is_refused_before_the_upstream(make_pooling: MakePooling) -> None:
    gateway = await make_pooling(auth=AUTH)
    big = ["word " * 400] * 4  # ~2,000 tokens estimated, over the key's 1,000 per minute
    async with aiohttp.ClientSession(headers=HEADERS) as s:
        async with s.post(f"{gateway.url}/v1/embeddings", json={"model": "emb-vllm", "input": big}) as r:
            assert r.status == 429
            assert (await r.json())["error"]["param"] == "input"
    assert gateway.upstream.requests == []
