"""The rerank answer every family returns, built from scores: one shape whatever the upstream's.

``{"id", "model", "usage", "results": [{"index", "relevance_score", "document"?}]}`` — vLLM's and
Jina's shape (``document`` as ``{"text"}``), which Cohere's SDK also reads. Results are sorted by
relevance (ties keep request order), cut to ``top_n``, and carry the request's own document texts
when ``return_documents`` is not false. :func:`upstream_scores` reads an upstream's results in any
of the shapes the servers use (vLLM, Jina, Cohere: ``relevance_score``; TEI: ``score``).
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import CompletionResult, TokenUsage
from backends.errors import UpstreamProtocolError
from schemas.rerank import RerankRequest

__all__ = ["rerank_answer", "upstream_scores"]


def upstream_scores(results: Any, count: int, backend: str) -> list[tuple[int, float]]:
    """``(index, score)`` per upstream result; an ``UpstreamProtocolError`` for a broken answer."""
    if not isinstance(results, list):
        raise UpstreamProtocolError("the upstream sent a rerank answer without results", backend=backend)
    scores: list[tuple[int, float]] = []
    seen: set[int] = set()
    for item in results:
        index = item.get("index") if isinstance(item, dict) else None
        score = item.get("relevance_score", item.get("score")) if isinstance(item, dict) else None
        if type(index) is not int or not 0 <= index < count or index in seen:
            raise UpstreamProtocolError("the upstream sent a rerank result with a bad index", backend=backend)
        if not isinstance(score, int | float) or isinstance(score, bool):
            raise UpstreamProtocolError("the upstream sent a rerank result without a score", backend=backend)
        seen.add(index)
        scores.append((index, float(score)))
    return scores


def rerank_answer(
    scores: list[tuple[int, float]], request: RerankRequest, model: str, answer_id: str, usage: TokenUsage
) -> CompletionResult:
    """The client's answer: ``scores`` sorted by relevance, cut to ``top_n``, documents as asked."""
    ranked = sorted(scores, key=lambda pair: -pair[1])[: request.top]
    texts = request.texts if request.wants_documents else None
    results: list[dict[str, Any]] = []
    for index, score in ranked:
        result: dict[str, Any] = {"index": index, "relevance_score": score}
        if texts is not None:
            result["document"] = {"text": texts[index]}
        results.append(result)
    tokens = usage.prompt_tokens
    body = {
        "id": answer_id,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }
    return CompletionResult(orjson.dumps(body), usage)
