"""The 400 for a field a backend cannot honour names field, backend and type once, on every endpoint.

Before, a refusal without a specific reason read "'top_k' is not supported by backend 'sim'
(type mock): backend type mock does not support it" (the type twice).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import MOCK_MODEL, MakeGateway

CHAT = [{"role": "user", "content": "hi"}]

REQUESTS = [
    ("completions", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "top_k": 4}, "top_k"),
    ("chat", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "top_k": 4}, "top_k"),
    ("responses", "/v1/responses", {"input": "hi", "max_output_tokens": 16, "top_k": 4}, "top_k"),
    ("embeddings", "/v1/embeddings", {"model": "embed", "input": "hi", "truncate_prompt_tokens": 3},
     "truncate_prompt_tokens"),
    ("rerank", "/v1/rerank", {"model": "embed", "query": "q", "documents": ["a"], "truncate_prompt_tokens": 3},
     "truncate_prompt_tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "field"), [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS])
async def test_unsupported_parameter_says_it_once(
    make_gateway: MakeGateway, path: str, body: dict[str, Any], field: str
) -> None:
    embed = "  - {name: embed, endpoints: [embeddings, rerank], routes: [{backend: sim, model: e}]}\n"
    gateway = await make_gateway(extra_models=embed)
    async with aiohttp.ClientSession() as session:
        async with session.post(gateway.url + path, json={"model": MOCK_MODEL, **body}) as resp:
            error = (await resp.json())["error"]
            assert resp.status == 400, error
    assert error["code"] == "unsupported_parameter"
    assert error["param"] == field
    assert error["message"] == f"'{field}' is not supported by backend 'sim' (type mock)"
