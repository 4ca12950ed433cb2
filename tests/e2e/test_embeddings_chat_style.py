"""vLLM's chat-style embeddings (``messages`` instead of ``input``) through the gateway.

On a ``vllm`` route the conversation (or, from vLLM 0.32, a batch of them) and the chat
template's options reach the server as sent; a version without one of them refuses it by name,
as does every other backend type (vLLM ignores fields it does not know: nothing may be dropped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import serve_app
from tests.e2e.pooling_gateway import EMBEDDERS, PoolingGateway
from tests.pooling_upstream import PoolingUpstream, fake_vector

CONVERSATION = [
    {"role": "system", "content": "You embed."},
    {"role": "user", "content": "The cat sat on the mat."},
    {"role": "assistant", "content": "A feline rested"},
]


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/embeddings", json=body) as r:
        return r.status, await r.json()


async def test_one_conversation_reaches_vllm_as_sent(pooling: PoolingGateway) -> None:
    options = {"add_generation_prompt": True, "chat_template": "{{ messages }}", "chat_template_kwargs": {"x": 1}}
    status, answer = await post(pooling.url, {"model": "emb-vllm", "messages": CONVERSATION, **options})
    assert status == 200, answer
    sent = pooling.upstream.requests[-1].body
    assert sent["messages"] == CONVERSATION and "input" not in sent
    assert {k: sent[k] for k in options} == options
    assert answer["model"] == "emb-vllm"
    assert answer["data"][0]["embedding"] == fake_vector("You embed.\nThe cat sat on the mat.\nA feline rested")


async def test_a_batch_of_conversations_on_vllm_0_32(pooling: PoolingGateway) -> None:
    batch = [CONVERSATION, CONVERSATION[:2]]
    status, answer = await post(pooling.url, {"model": "emb-vllm", "messages": batch, "continue_final_message": True})
    assert status == 400 and answer["error"]["param"] == "continue_final_message"  # the 2nd ends with the user's
    status, answer = await post(pooling.url, {"model": "emb-vllm", "messages": batch, "encoding_format": "base64"})
    assert status == 200, answer
    assert pooling.upstream.requests[-1].body["messages"] == batch
    assert [d["index"] for d in answer["data"]] == [0, 1]


async def test_options_set_to_null_are_the_default(pooling: PoolingGateway) -> None:
    # Found by the schema fuzzer: a null option without messages was a 500 (StopIteration).
    body = {"model": "emb-mock", "input": "x", "chat_template": None, "add_generation_prompt": None}
    status, answer = await post(pooling.url, body)
    assert status == 200, answer


@pytest.mark.parametrize("kind", [k for k in EMBEDDERS if k != "vllm"])
async def test_refused_by_name_on_every_other_backend(pooling: PoolingGateway, kind: str) -> None:
    status, answer = await post(pooling.url, {"model": f"emb-{kind}", "messages": CONVERSATION})
    assert status == 400, answer
    assert answer["error"]["param"] == "messages"
    assert answer["error"]["code"] == "unsupported_parameter"
    assert pooling.upstream.requests == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": "x", "messages": CONVERSATION}, "messages"),
        ({"input": "x", "add_generation_prompt": True}, "add_generation_prompt"),
        ({"input": "x", "chat_template_kwargs": {}}, "chat_template_kwargs"),
        ({"messages": CONVERSATION, "add_generation_prompt": True, "continue_final_message": True},
         "continue_final_message"),
        ({"messages": []}, "messages"),
        ({"messages": [[]]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x", "nonsense": 1}]}, "messages[0].nonsense"),
    ],
)  # fmt: skip
async def test_bad_requests_named(pooling: PoolingGateway, body: dict[str, Any], param: str) -> None:
    status, answer = await post(pooling.url, {"model": "emb-vllm", **body})
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer
    assert pooling.upstream.requests == []


@pytest.fixture
async def old_vllm(pooling_upstream: PoolingUpstream) -> AsyncIterator[str]:
    config = f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - {{name: v, type: vllm, base_url: {pooling_upstream.url}/v1, version: 0.11.0}}
models:
  - {{name: e, routes: [{{backend: v, model: up}}], endpoints: [embeddings]}}
"""
    runner, url = await serve_app(create_app(parse_config(config, "<test>", env={})))
    try:
        yield url
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("extra", "param", "why"),
    [
        ({"messages": [CONVERSATION, CONVERSATION]}, "messages", "no a batch of conversations in messages"),
        ({"messages": CONVERSATION, "continue_final_message": True}, "continue_final_message", "first in 0.32.0"),
        ({"messages": CONVERSATION, "chat_template_kwargs": {"a": 1}}, "chat_template_kwargs", "first in 0.32.0"),
    ],
)
async def test_refused_on_a_vllm_without_it(
    old_vllm: str, pooling_upstream: PoolingUpstream, extra: dict[str, Any], param: str, why: str
) -> None:
    status, answer = await post(old_vllm, {"model": "e", **extra})
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert why in answer["error"]["message"] and "vLLM 0.11.0" in answer["error"]["message"]
    assert pooling_upstream.requests == []
    status, answer = await post(old_vllm, {"model": "e", "messages": CONVERSATION, "add_generation_prompt": True})
    assert status == 200, answer  # 0.11.0 has these
