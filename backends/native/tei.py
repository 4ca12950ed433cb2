"""Hugging Face text-embeddings-inference (TEI): embeddings and rerank, no generation.

- embeddings: ``POST /v1/embeddings`` (TEI's OpenAI-shaped route: text or token ids,
  ``encoding_format`` float or base64, ``dimensions`` for matryoshka models, ``usage``), the batch
  cut at ``embeddings.max_inputs_per_call`` (TEI's ``--max-client-batch-size``, 32 by default: a
  larger call is refused with 413), parts sent concurrently and joined in order;
- rerank: native ``POST /rerank`` ``{"query", "texts", "return_text": false, "raw_scores": false}``
  -> ``[{"index", "score"}]`` sorted by score; cut the same way, scores joined and sorted again.
  Usage from TEI's ``x-compute-tokens`` header, else the gateway's estimate.

Errors are ``{"error", "error_type"}`` with the HTTP status (``backends.errors`` reads them).
Its tables: ``backends.native.tei_capabilities``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import orjson

from backends.base import Backend, Call, CompletionResult, EmbeddingCall, RerankCall, TokenUsage
from backends.capabilities import Capabilities, Level
from backends.emulation.rerank import rerank_answer, upstream_scores
from backends.emulation.vectors import gather
from backends.errors import UpstreamProtocolError, error_from_upstream_body
from backends.native.common import count
from backends.native.pooling import PartVectors, embed_in_parts, openai_shaped_vectors
from backends.native.tei_capabilities import TEI_EMBEDDINGS, TEI_RERANK
from backends.openai.pooling import pooling_usage
from backends.pooling_capabilities import PoolingCapabilities
from backends.transport import make_transport
from backends.transport.base import HTTPTransport, get_ok, send_ok
from schemas.config import TEIBackendConfig
from schemas.endpoints import POOLING_ENDPOINTS, Endpoint

__all__ = ["TEIBackend"]

# No completions: a table that refuses every field, for the parts of the gateway that read one.
_NO_COMPLETIONS = Capabilities.of(Level.UNSUPPORTED)


class TEIBackend(Backend):
    kind: ClassVar[str] = "tei"
    endpoints: frozenset[Endpoint] = POOLING_ENDPOINTS
    embedding_capabilities: PoolingCapabilities | None = TEI_EMBEDDINGS
    rerank_capabilities: PoolingCapabilities | None = TEI_RERANK

    def __init__(self, config: TEIBackendConfig, transport: HTTPTransport | None = None) -> None:
        super().__init__(config.name, _NO_COMPLETIONS)
        self.config = config
        self.base_url = str(config.base_url).rstrip("/")
        self._transport = transport if transport is not None else make_transport(config)
        headers = {name: value.get_secret_value() for name, value in config.headers.items()}
        headers["Content-Type"] = "application/json"
        if config.api_key is not None:
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        self._headers = headers

    async def _post(self, path: str, payload: dict[str, Any], call: Call[Any]) -> tuple[Any, str | None]:
        """POST ``payload``: the parsed answer and its ``x-compute-tokens`` header; raises on another status."""
        headers = call.headers(self._headers)

        def status_error(status: int, data: bytes, retry_after: str | None) -> Any:
            return error_from_upstream_body(status, data, retry_after, self.name)

        resp = await send_ok(
            self._transport, self.base_url + path, orjson.dumps(payload), headers, stream=False,
            status_error=status_error,
        )  # fmt: skip
        try:
            data = await resp.read()
        finally:
            resp.release()
        try:
            return orjson.loads(data), resp.header("x-compute-tokens")
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError("the upstream sent a body that is not JSON", backend=self.name) from None

    def _check(self, table: PoolingCapabilities | None, request: Any) -> None:
        error = None if table is None else table.refusal(request, self.name, self.kind)
        if error is not None:
            raise error

    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        request = call.request
        self._check(self.embedding_capabilities, request)

        async def send(part: Sequence[Any]) -> PartVectors:
            payload: dict[str, Any] = {"model": call.upstream_model, "input": list(part)}
            if request.encoding_format is not None:
                payload["encoding_format"] = request.encoding_format
            if request.dimensions is not None:
                payload["dimensions"] = request.dimensions
            if request.user is not None:
                payload["user"] = request.user
            obj, _ = await self._post("/v1/embeddings", payload, call)
            return openai_shaped_vectors(obj, len(part), self.name), pooling_usage(obj.get("usage"))

        return await embed_in_parts(call, self.config.embeddings, send, self.name)

    async def rerank(self, call: RerankCall) -> CompletionResult:
        request = call.request
        self._check(self.rerank_capabilities, request)
        texts = request.texts
        size = self.config.embeddings.max_inputs_per_call
        starts = list(range(0, len(texts), size))

        async def send(start: int) -> tuple[list[tuple[int, float]], int | None]:
            part = texts[start : start + size]
            payload = {"query": request.query, "texts": part, "return_text": False, "raw_scores": False}
            obj, tokens = await self._post("/rerank", payload, call)
            scores = upstream_scores(obj, len(part), self.name)
            return [(start + i, score) for i, score in scores], count(_int(tokens))

        answers = await gather(starts, send, self.config.embeddings.max_parallel_calls)
        scores = [pair for part_scores, _ in answers for pair in part_scores]
        tokens = [t for _, t in answers]
        prompt = sum(t for t in tokens if t is not None) if None not in tokens else request.prompt_estimate()
        return rerank_answer(scores, request, call.public_model, f"rerank-{call.request_id}", TokenUsage(prompt, 0))

    async def health(self) -> bool:
        headers = {k: v for k, v in self._headers.items() if k != "Content-Type"}
        return await get_ok(self._transport, self.base_url + "/health", headers) is not None

    async def close(self) -> None:
        await self._transport.close()


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isascii() and text.isdigit() and len(text) < 12 else None
