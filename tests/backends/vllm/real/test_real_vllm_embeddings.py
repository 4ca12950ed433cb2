"""A real vLLM 0.32 pooling server (the tiny model, ``--runner pooling --convert embed``) behind the gateway.

The server and the gateway in front of it (model ``emb``) are ``pooling_server.py``'s fixtures:
one server for the session, shared with ``test_vllm_own_pooling_tests.py`` (it is the worker of the
session's ``vllm-pool`` that ``test_real_vllm_pool_pooling.py`` tests).

Each answer through the gateway is compared with the same request sent to vLLM directly: float
and base64 vectors identical, token-id input, ``truncate_prompt_tokens``, usage equal, vLLM's
encoding extras (``embed_dtype``, ``endianness``, the ``bytes`` answer), rerank, and vLLM's own
refusals (``dimensions`` on a model without matryoshka) reaching the client with the field named.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
import pytest

from tests.backends.vllm.real.conftest import _model_dir

pytestmark = pytest.mark.vllm

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world"]


async def both(gateway: str, direct: str, path: str, body: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The same request through the gateway (model ``emb``) and straight to vLLM (``tiny-embed``)."""
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway + path, json={**body, "model": "emb"}) as r:
            through = (r.status, await r.read(), dict(r.headers))
        async with s.post(direct + path, json={**body, "model": "tiny-embed"}) as r:
            straight = (r.status, await r.read(), dict(r.headers))
    return through, straight, None


def same_answer(through: Any, straight: Any) -> dict[str, Any]:
    assert through[0] == straight[0] == 200, (through[1][:500], straight[1][:500])
    mine, theirs = orjson.loads(through[1]), orjson.loads(straight[1])
    assert mine["model"] == "emb"
    assert mine["data"] == theirs["data"]  # vectors identical, bit for bit as JSON
    assert mine["usage"] == theirs["usage"]
    return dict(mine)


@pytest.mark.parametrize("encoding", ["float", "base64"])
@pytest.mark.parametrize("value", [TEXTS[0], TEXTS, [5, 6, 7, 8], [[5, 6], [7, 8, 9]]])
async def test_embeddings_identical_to_direct(gateway_url: str, pooling_server: str, encoding: str, value: Any) -> None:
    through, straight, _ = await both(
        gateway_url, pooling_server, "/v1/embeddings", {"input": value, "encoding_format": encoding}
    )
    same_answer(through, straight)


async def test_truncate_prompt_tokens_and_usage(gateway_url: str, pooling_server: str) -> None:
    through, straight, _ = await both(
        gateway_url, pooling_server, "/v1/embeddings", {"input": TEXTS[0], "truncate_prompt_tokens": 3}
    )
    assert same_answer(through, straight)["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("endianness", ["big", "little"])
async def test_vllm_encoding_extras(gateway_url: str, pooling_server: str, dtype: str, endianness: str) -> None:
    body = {"input": TEXTS, "encoding_format": "base64", "embed_dtype": dtype, "endianness": endianness}
    through, straight, _ = await both(gateway_url, pooling_server, "/v1/embeddings", body)
    same_answer(through, straight)


@pytest.mark.parametrize("encoding", ["bytes", "bytes_only"])
async def test_binary_answer_relayed(gateway_url: str, pooling_server: str, encoding: str) -> None:
    body = {"input": TEXTS, "encoding_format": encoding, "embed_dtype": "float16"}
    through, straight, _ = await both(gateway_url, pooling_server, "/v1/embeddings", body)
    assert through[0] == straight[0] == 200
    assert through[1] == straight[1]  # the bytes as vLLM sent them
    assert through[2]["Content-Type"] == "application/octet-stream"
    if encoding == "bytes":
        mine, theirs = orjson.loads(through[2]["metadata"]), orjson.loads(straight[2]["metadata"])
        assert mine["model"] == "emb" and mine["data"] == theirs["data"] and mine["usage"] == theirs["usage"]
    else:
        assert "metadata" not in through[2]


async def test_openai_sdk_default_base64_decodes_to_the_float_answer(gateway_url: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="x", max_retries=0) as client:
        default = await client.embeddings.create(model="emb", input=TEXTS)  # the SDK asks base64, decodes it
        floats = await client.embeddings.create(model="emb", input=TEXTS, encoding_format="float")
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]


async def test_rerank_like_direct(gateway_url: str, pooling_server: str) -> None:
    body = {"query": "quick fox", "documents": ["the quick brown fox", "hello world", "lazy dog"], "top_n": 2}
    through, straight, _ = await both(gateway_url, pooling_server, "/v1/rerank", body)
    assert through[0] == straight[0] == 200, through[1]
    mine, theirs = orjson.loads(through[1]), orjson.loads(straight[1])
    assert [(r["index"], r["relevance_score"]) for r in mine["results"]] == [
        (r["index"], r["relevance_score"]) for r in theirs["results"]
    ]
    assert [r["document"]["text"] for r in mine["results"]] == [r["document"]["text"] for r in theirs["results"]]
    assert mine["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]


CONVERSATION = [{"role": "user", "content": "The cat sat on the mat."}, {"role": "assistant", "content": "A cat"}]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": CONVERSATION},
        {"messages": CONVERSATION, "add_generation_prompt": True},
        {"messages": CONVERSATION, "continue_final_message": True, "add_special_tokens": True},
        {"messages": [CONVERSATION, CONVERSATION[:1]], "encoding_format": "base64"},
    ],
    ids=["one", "generation-prompt", "continue", "batch"],
)
async def test_chat_style_embeddings_like_direct(gateway_url: str, pooling_server: str, body: dict[str, Any]) -> None:
    through, straight, _ = await both(gateway_url, pooling_server, "/v1/embeddings", body)
    same_answer(through, straight)


async def test_vllm_refusals_reach_the_client_named(gateway_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway_url + "/v1/embeddings", json={"model": "emb", "input": "x", "dimensions": 8}) as r:
            assert r.status == 400
            error = (await r.json())["error"]
        body = {"model": "emb", "input": "x", "truncate_prompt_tokens": 100_000}
        async with s.post(gateway_url + "/v1/embeddings", json=body) as r:
            assert r.status == 400
    assert "dimension" in error["message"].lower() or "matryoshka" in error["message"].lower()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"prompt": TEXTS[0], "return_token_strs": True}),
        ("/tokenize", {"prompt": TEXTS[1], "add_special_tokens": False}),
        ("/tokenize", {"messages": CONVERSATION, "add_generation_prompt": True}),
        ("/detokenize", {"tokens": [5, 6, 7, 8]}),
    ],
    ids=["prompt", "no-special", "messages", "detokenize"],
)
async def test_tokenizer_like_direct(gateway_url: str, pooling_server: str, path: str, body: dict[str, Any]) -> None:
    through, straight, _ = await both(gateway_url, pooling_server, path, body)
    assert through[0] == straight[0] == 200, through[1]
    assert orjson.loads(through[1]) == orjson.loads(straight[1])


async def test_models_carry_the_servers_max_model_len(gateway_url: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="x", max_retries=0) as client:
        model = (await client.models.retrieve("emb")).model_dump()
    assert model["max_model_len"] == 512  # --max-model-len, as the server's GET /v1/models says
    assert model["root"] == str(_model_dir())
    assert model["endpoints"] == ["embeddings", "rerank", "tokenize", "detokenize"]
