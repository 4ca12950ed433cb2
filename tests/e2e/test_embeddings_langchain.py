"""LangChain's ``OpenAIEmbeddings`` through the gateway, with its default ``check_embedding_ctx_length=True``.

With that default LangChain tokenises with tiktoken and sends arrays of token ids. tiktoken
downloads its BPE files at first use, which these machines cannot (no internet): the tests give
tiktoken a local byte-level encoding (one id per UTF-8 byte) through its public ``Encoding``
constructor, so LangChain's own code path runs unchanged. The ids reach a backend that takes ids
exactly as sent, and are refused by name (``input``) where a backend embeds text only: never
detokenised, never vectors of another text.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import tiktoken
from langchain_openai import OpenAIEmbeddings

from tests.e2e.pooling_gateway import PoolingGateway
from tests.pooling_upstream import fake_vector


@pytest.fixture
def local_tiktoken(monkeypatch: pytest.MonkeyPatch) -> Iterator[tiktoken.Encoding]:
    encoding = tiktoken.Encoding(
        name="local-bytes", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={}
    )
    monkeypatch.setattr(tiktoken, "encoding_for_model", lambda model: encoding)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)
    yield encoding


def embeddings(gateway: PoolingGateway, model: str, **options: object) -> OpenAIEmbeddings:
    return OpenAIEmbeddings(model=model, base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["vllm", "openai", "tei", "llamacpp"])
async def test_token_ids_from_tiktoken_reach_backends_that_take_ids(
    pooling: PoolingGateway, local_tiktoken: tiktoken.Encoding, kind: str
) -> None:
    docs = ["first document", "second one"]
    vectors = await embeddings(pooling, f"emb-{kind}").aembed_documents(docs)
    sent = pooling.upstream.requests[-1].body["input"]
    assert sent == [local_tiktoken.encode(d) for d in docs]  # LangChain's ids, relayed as they came
    assert len(vectors) == 2
    for doc, got in zip(docs, vectors, strict=True):  # one chunk each: the vector of exactly those ids
        assert got == pytest.approx(fake_vector(local_tiktoken.encode(doc)))


async def test_token_ids_refused_by_name_where_the_backend_takes_text_only(
    pooling: PoolingGateway, local_tiktoken: tiktoken.Encoding
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await embeddings(pooling, "emb-ollama").aembed_query("a query")
    assert refused.value.body["param"] == "input"  # type: ignore[index]
    assert "token ids" in refused.value.body["message"]  # type: ignore[index]
    assert pooling.upstream.requests == []


async def test_text_with_check_embedding_ctx_length_off(pooling: PoolingGateway) -> None:
    vector = await embeddings(pooling, "emb-ollama", check_embedding_ctx_length=False).aembed_query("a query")
    assert pooling.upstream.requests[-1].body["input"] == ["a query"]
    assert vector == pytest.approx(fake_vector("a query"))
