"""vLLM's embeddings and rerank: the OpenAI family's translator plus vLLM's pooling extras; and its tokenizer API.

vLLM serves ``/v1/embeddings`` and ``/v1/rerank`` for pooling models (``--runner pooling``).
Which extras a version honours is its tables' (``backends.vllm.capabilities.vllm_pooling_tables``).

Binary answers (``encoding_format: "bytes"`` / ``"bytes_only"``): the body is relayed as sent
(``application/octet-stream``); ``bytes`` carries its metadata (with the model, and usage) in
a ``metadata`` header, whose model is swapped to the client's name.

:class:`VLLMPoolingCalls` is ``VLLMBackend``'s embeddings, rerank and tokenizer calls (``POST
/tokenize``, ``/detokenize`` on the server's root: vLLM's answer as written, nothing counted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from backends.base import (
    Call,
    CompletionResult,
    DetokenizeCall,
    EmbeddingCall,
    RerankCall,
    TokenizeCall,
    TokenUsage,
)
from backends.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    error_from_upstream_body,
)
from backends.openai.pooling import embedding_payload, pooling_usage, relay_embeddings, rerank_payload, rerank_result
from backends.openai.wire import OpenAIWire
from backends.pooling_capabilities import PoolingCapabilities
from schemas.errors import UnsupportedParameterError

__all__ = ["VLLMPoolingCalls", "binary_embeddings", "vllm_pooling_error"]

_POOLING_PARAMS = {"input_tokens": "input", "prompt": "input"}


def vllm_pooling_error(status: int, body: bytes, retry_after: str | None, backend: str) -> UpstreamStatusError:
    """Our error for a vLLM pooling error answer, with vLLM's names for fields made ours."""
    return error_from_upstream_body(status, body, retry_after, backend, rename=lambda p: _POOLING_PARAMS.get(p, p))


def binary_embeddings(data: bytes, metadata: str | None, public_model: str, estimate: int) -> CompletionResult:
    """vLLM's binary answer relayed: the bytes as sent, the ``metadata`` header with the client's model.

    Usage is the metadata's; ``bytes_only`` has none, so the gateway's ``estimate`` is accounted.
    """
    usage: TokenUsage | None = TokenUsage(estimate, 0)
    headers: dict[str, str] | None = None
    if metadata is not None:
        try:
            meta: Any = orjson.loads(metadata)
        except orjson.JSONDecodeError:
            meta = None
        if isinstance(meta, dict):
            meta["model"] = public_model
            usage = pooling_usage(meta.get("usage")) or usage
            headers = {"metadata": orjson.dumps(meta).decode()}
        else:
            headers = {"metadata": metadata}
    return CompletionResult(data, usage, content_type="application/octet-stream", headers=headers)


class VLLMPoolingCalls:
    """``VLLMBackend``'s embeddings, rerank and tokenizer calls (a mixin: the adapter holds this state)."""

    name: str
    kind: ClassVar[str]
    _wire: OpenAIWire
    _root: str
    _stale: bool
    embedding_capabilities: PoolingCapabilities | None
    rerank_capabilities: PoolingCapabilities | None

    if TYPE_CHECKING:

        async def _refresh(self) -> None: ...  # backends.vllm.server: re-read the version when stale

    async def _send_pooling(self, url: str, fields: dict[str, Any], call: Call[Any]) -> tuple[bytes, Any]:
        """POST a pooling request; the body and the response (for its headers). A non-200 raises."""

        def status_error(status: int, data: bytes, retry_after: str | None) -> UpstreamError:
            return vllm_pooling_error(status, data, retry_after, self.name)

        if self._stale:
            await self._refresh()
        try:
            resp = await self._wire.post(url, fields, call, status_error, stream=False)
        except UpstreamConnectError:
            self._stale = True  # the next contact is a reconnect: re-read the version first
            raise
        try:
            return await resp.read(), resp
        finally:
            resp.release()

    def _refuse(self, error: UnsupportedParameterError | None) -> None:
        if error is not None:  # the table of *now*: the version may have changed since routing
            raise error

    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        table = self.embedding_capabilities
        assert table is not None
        self._refuse(table.refusal(call.request, self.name, self.kind))
        data, resp = await self._send_pooling(self._wire.embeddings_url, embedding_payload(call, table), call)
        if call.request.encoding_format in ("bytes", "bytes_only"):
            estimate = call.request.prompt_estimate()
            return binary_embeddings(data, resp.header("metadata"), call.public_model, estimate)
        return relay_embeddings(data, call, self.name)

    async def rerank(self, call: RerankCall) -> CompletionResult:
        table = self.rerank_capabilities
        assert table is not None
        self._refuse(table.refusal(call.request, self.name, self.kind))
        data, _ = await self._send_pooling(self._wire.rerank_url, rerank_payload(call, table), call)
        return rerank_result(data, call, self.name)

    # --- vLLM's tokenizer API: POST /tokenize, /detokenize on the server's root ---------------------
    async def tokenize(self, call: TokenizeCall) -> CompletionResult:
        return await self._tokenizer("/tokenize", call)

    async def detokenize(self, call: DetokenizeCall) -> CompletionResult:
        return await self._tokenizer("/detokenize", call)

    async def _tokenizer(self, path: str, call: TokenizeCall | DetokenizeCall) -> CompletionResult:
        """The answer as vLLM wrote it (it names no model); nothing generated, no tokens counted."""
        fields = call.request.upstream_fields()
        fields["model"] = call.upstream_model
        data, _ = await self._send_pooling(self._root + path, fields, call)
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise UpstreamProtocolError(f"the upstream's {path} answer is not a JSON object", backend=self.name)
        return CompletionResult(data, None)
