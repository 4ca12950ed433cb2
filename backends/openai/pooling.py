"""The OpenAI family's embeddings and rerank translator (also under vLLM's: ``backends.vllm.pooling``);
its tables are in ``backends.openai.capabilities``.

Embeddings (``POST {base_url}/embeddings``): the request as the client sent it (fields set,
nulls dropped, neutral values of unsupported fields dropped), ``model`` mapped to the route's;
the answer relayed as the upstream's bytes with only the model swapped (``relay_completion_body``),
its ``usage.prompt_tokens`` read for accounting.

Rerank (``POST {base_url}/rerank``, the Jina/Cohere shape many OpenAI-compatible servers serve):
``query``, ``documents`` as strings (objects sent as their text), ``top_n``; the answer read in
any of the servers' shapes and written in ours (``backends.emulation.rerank``). OpenAI's own API
has no rerank: a model is served on it only when its config lists ``rerank``.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import CompletionResult, EmbeddingCall, RerankCall, TokenUsage
from backends.emulation.rerank import rerank_answer, upstream_scores
from backends.errors import UpstreamProtocolError
from backends.openai.relay import relay_completion_body
from backends.pooling_capabilities import PoolingCapabilities

__all__ = ["embedding_payload", "pooling_usage", "relay_embeddings", "rerank_payload", "rerank_result"]

_MAX_COUNT = 1 << 32


def pooling_usage(obj: Any) -> TokenUsage | None:
    """An embeddings or rerank ``usage``: ``prompt_tokens`` (or only ``total_tokens``, as Jina), a count."""
    if type(obj) is not dict:
        return None
    tokens = obj.get("prompt_tokens", obj.get("total_tokens"))
    if type(tokens) is int and 0 <= tokens < _MAX_COUNT:
        return TokenUsage(tokens, 0)
    return None


def embedding_payload(call: EmbeddingCall, table: PoolingCapabilities) -> dict[str, Any]:
    """The upstream body: the client's fields, ``model`` mapped, neutral values of unsupported fields dropped."""
    fields = call.request.upstream_fields()
    table.strip_neutral(fields)
    fields["model"] = call.upstream_model
    return fields


def relay_embeddings(data: bytes, call: EmbeddingCall, backend: str) -> CompletionResult:
    """The upstream's list object with only the model swapped; its usage read."""
    return relay_completion_body(data, call, backend, "list", items="data", read_usage=pooling_usage)


def rerank_payload(call: RerankCall, table: PoolingCapabilities) -> dict[str, Any]:
    """The upstream body: documents as strings; ``return_documents`` is the gateway's to apply."""
    request = call.request
    fields = request.model_dump(exclude_none=True, exclude_unset=True)
    fields.pop("return_documents", None)
    table.strip_neutral(fields)
    fields["model"] = call.upstream_model
    fields["documents"] = request.texts
    return fields


def rerank_result(data: bytes, call: RerankCall, backend: str) -> CompletionResult:
    """An upstream rerank answer (vLLM, Jina, Cohere shapes) as ours; usage estimated when it has none."""
    request = call.request
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError("the upstream sent a body that is not JSON", backend=backend) from None
    if not isinstance(obj, dict):
        raise UpstreamProtocolError("the upstream sent a rerank answer that is not an object", backend=backend)
    scores = upstream_scores(obj.get("results"), len(request.documents), backend)
    usage = pooling_usage(obj.get("usage")) or TokenUsage(request.prompt_estimate(), 0)
    upstream_id = obj.get("id")
    answer_id = upstream_id if isinstance(upstream_id, str) else f"rerank-{call.request_id}"
    return rerank_answer(scores, request, call.public_model, answer_id, usage)
