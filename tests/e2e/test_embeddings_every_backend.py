"""``POST /v1/embeddings`` with the official openai SDK on every backend type that embeds.

Each ``emb-<type>`` model (``tests.e2e.pooling_gateway``) sits on a fake server speaking that
type's API (``tests.pooling_upstream``): every input form, both encodings (the SDK asks base64 by
default and decodes it), ``dimensions``, usage, refusals by name, the 404 of a generation model.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.e2e.pooling_gateway import (
    EMBEDDERS,
    TOKEN_IDS_OK,
    PoolingGateway,
)
from tests.pooling_upstream import fake_vector, tokens


@pytest.fixture
async def client(pooling: PoolingGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{pooling.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
        yield c


def expected(kind: str, item: str | list[int]) -> list[float]:
    if kind == "mock":
        from backends.mock.pooling import mock_vector

        return mock_vector(item)
    return fake_vector(item)


INPUTS: list[Any] = ["hello world", ["hello world", "second text here"], [5, 6, 7], [[1, 2], [3, 4, 5]]]


@pytest.mark.parametrize("kind", EMBEDDERS)
@pytest.mark.parametrize("encoding", ["float", "base64", None])
@pytest.mark.parametrize("value", INPUTS, ids=["text", "texts", "ids", "id-lists"])
async def test_every_input_form_and_encoding(
    client: openai.AsyncOpenAI, pooling: PoolingGateway, kind: str, encoding: str | None, value: Any
) -> None:
    ids = not isinstance(value, str) and not isinstance(value[0], str)
    extra: dict[str, Any] = {} if encoding is None else {"encoding_format": encoding}
    if ids and kind not in TOKEN_IDS_OK:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.embeddings.create(model=f"emb-{kind}", input=value, **extra)
        assert refused.value.body["param"] == "input"  # type: ignore[index]
        assert refused.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
        assert pooling.upstream.requests == []  # never detokenised, never sent
        return
    resp = await client.embeddings.create(model=f"emb-{kind}", input=value, **extra)
    batch = [value] if isinstance(value, str) or not isinstance(value[0], (str, list)) else value
    assert resp.object == "list" and resp.model == f"emb-{kind}"
    assert [d.index for d in resp.data] == list(range(len(batch)))
    for item, data in zip(batch, resp.data, strict=True):
        assert data.object == "embedding"
        vector: Any = data.embedding
        if encoding == "base64":  # asked explicitly, the SDK hands the string over as it came
            raw = base64.b64decode(vector)
            vector = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        assert vector == expected(kind, item)  # unset: the SDK asked base64 and decoded it itself
    if kind == "mock":
        assert pooling.upstream.requests == []
        return
    assert resp.usage.prompt_tokens == sum(tokens(item) for item in batch)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens
    sent = pooling.upstream.requests[-1].body
    assert sent["model"] == f"up-{kind}"
    if kind == "ollama":
        assert sent == {"model": "up-ollama", "input": batch, "truncate": False}
    elif kind == "llamacpp":
        assert sent["encoding_format"] == "float"  # floats asked; base64 is the gateway's


@pytest.mark.parametrize("kind", ["openai", "vllm", "tei", "mock"])
async def test_base64_is_little_endian_float32_of_the_float_answer(pooling: PoolingGateway, kind: str) -> None:
    async with aiohttp.ClientSession() as s:
        bodies = []
        for encoding in ("float", "base64"):
            payload = {"model": f"emb-{kind}", "input": ["a b", "c"], "encoding_format": encoding}
            async with s.post(f"{pooling.url}/v1/embeddings", json=payload) as r:
                assert r.status == 200, await r.text()
                bodies.append(await r.json())
    floats, encoded = bodies
    for f, b in zip(floats["data"], encoded["data"], strict=True):
        raw = base64.b64decode(b["embedding"])
        assert raw == struct.pack(f"<{len(f['embedding'])}f", *f["embedding"])


@pytest.mark.parametrize("kind", ["ollama", "llamacpp"])
async def test_base64_written_by_the_gateway_where_the_server_answers_floats(
    pooling: PoolingGateway, kind: str
) -> None:
    async with aiohttp.ClientSession() as s:
        payload = {"model": f"emb-{kind}", "input": "a b", "encoding_format": "base64"}
        async with s.post(f"{pooling.url}/v1/embeddings", json=payload) as r:
            body = await r.json()
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert raw == struct.pack("<8f", *fake_vector("a b"))
    assert pooling.upstream.requests[-1].body.get("encoding_format") in (None, "float")


@pytest.mark.parametrize("kind", ["openai", "vllm", "ollama", "tei", "mock"])
async def test_dimensions_where_honoured(client: openai.AsyncOpenAI, kind: str) -> None:
    resp = await client.embeddings.create(model=f"emb-{kind}", input="a b c", dimensions=4, encoding_format="float")
    assert len(resp.data[0].embedding) == 4


async def test_dimensions_refused_by_name_on_llamacpp(client: openai.AsyncOpenAI, pooling: PoolingGateway) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.embeddings.create(model="emb-llamacpp", input="a", dimensions=4)
    assert refused.value.body["param"] == "dimensions"  # type: ignore[index]
    assert "llama.cpp" in refused.value.body["message"]  # type: ignore[index]
    assert pooling.upstream.requests == []


@pytest.mark.parametrize("kind", ["openai", "ollama", "llamacpp", "tei", "mock"])
@pytest.mark.parametrize(
    "field", [{"truncate_prompt_tokens": 4}, {"embed_dtype": "float16"}, {"use_activation": False}]
)
async def test_vllm_extras_refused_by_name_elsewhere(
    client: openai.AsyncOpenAI, pooling: PoolingGateway, kind: str, field: dict[str, Any]
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.embeddings.create(model=f"emb-{kind}", input="a", extra_body=field)
    assert refused.value.body["param"] == next(iter(field))  # type: ignore[index]
    assert refused.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    assert pooling.upstream.requests == []


async def test_vllm_extras_forwarded_on_vllm(client: openai.AsyncOpenAI, pooling: PoolingGateway) -> None:
    extras = {"truncate_prompt_tokens": 4, "use_activation": False, "add_special_tokens": False, "priority": 0}
    await client.embeddings.create(model="emb-vllm", input="a", extra_body=extras)
    sent = pooling.upstream.requests[-1].body
    assert {k: sent[k] for k in extras} == extras


async def test_normalize_refused_on_vllm_0_32_with_the_reason(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.embeddings.create(model="emb-vllm", input="a", extra_body={"normalize": True})
    assert refused.value.body["param"] == "normalize"  # type: ignore[index]
    assert "use_activation" in refused.value.body["message"]  # type: ignore[index]


async def test_unknown_field_refused_by_name(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.embeddings.create(model="emb-vllm", input="a", extra_body={"nonsense": 1})
    assert refused.value.body["param"] == "nonsense"  # type: ignore[index]
    assert refused.value.body["code"] == "unknown_parameter"  # type: ignore[index]


@pytest.mark.parametrize(
    ("value", "why"),
    [("", "empty string"), ([], "empty array"), ([[]], "empty ids"), (["x"] * 2049, "over 2048"), ([1, "a"], "mixed")],
)
async def test_bad_input_named(client: openai.AsyncOpenAI, value: Any, why: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.embeddings.create(model="emb-mock", input=value)
    assert refused.value.body["param"] == "input", why  # type: ignore[index]


async def test_generation_model_gets_the_404_naming_where_it_is_served(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await client.embeddings.create(model="gen", input="a")
    body: Any = missing.value.body
    assert body["code"] == "model_not_supported_on_endpoint"
    assert "v1/chat/completions" in body["message"]


async def test_embedding_model_is_not_served_on_chat(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="emb-vllm", messages=[{"role": "user", "content": "x"}])
    body: Any = missing.value.body
    assert body["code"] == "model_not_supported_on_endpoint"
    assert "v1/embeddings" in body["message"]


async def test_upstream_error_relayed_with_its_status(client: openai.AsyncOpenAI) -> None:
    from tests.pooling_upstream import FAIL

    with pytest.raises(openai.InternalServerError):
        await client.embeddings.create(model="emb-openai", input=["a", FAIL])
