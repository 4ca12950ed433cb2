"""Adapter for OpenAI-compatible HTTP APIs (OpenAI, Together, Fireworks, ...): completions and chat.

The request is forwarded as the client sent it (fields the client set, nulls
dropped), with ``model`` mapped to the route's upstream id. vLLM's extra
sampling fields are unsupported here unless the backend entry overrides its
capabilities; a field set to its neutral value is simply not forwarded.
Chat (``POST {base_url}/chat/completions``) is translated by ``backends.openai.chat``
against the chat table :data:`~backends.openai.capabilities.OPENAI_CHAT`; embeddings and rerank
by ``backends.openai.pooling``; Responses (``POST {base_url}/responses``, built-in tools included)
is relayed by ``backends.responses.native``. The HTTP side (URLs, headers, POSTs, the stream
relay's set-up) is the OpenAI wire every OpenAI-speaking family shares: ``backends.openai.wire``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from backends.base import (
    Backend,
    ChatCall,
    CompletionResult,
    CompletionStream,
    EmbeddingCall,
    RerankCall,
    ResponsesCall,
    ResponsesTable,
    UpstreamCall,
)
from backends.capabilities import Capabilities
from backends.chat_capabilities import ChatCapabilities
from backends.errors import UpstreamError, error_from_upstream_body
from backends.openai.body import relay_completion_body
from backends.openai.capabilities import (
    OPENAI_CAPABILITIES,
    OPENAI_CHAT,
    OPENAI_EMBEDDINGS,
    OPENAI_RERANK,
    OPENAI_RESPONSES,
    OPENAI_RESPONSES_UPSTREAM_STORE,
)
from backends.openai.chat import ChatStreamRelay, MaxTokensField, chat_payload, relay_chat_body
from backends.openai.pooling import (
    embedding_payload,
    relay_embeddings,
    rerank_payload,
    rerank_result,
)
from backends.openai.relay import OpenAIStreamRelay
from backends.openai.wire import OpenAIWire, client_usage
from backends.pooling_capabilities import PoolingCapabilities
from backends.responses.native import NativeResponseEvents, native_payload, relay_response_body
from backends.transport import HTTPTransport
from schemas.config import OpenAIBackendConfig
from schemas.endpoints import Endpoint

__all__ = ["OpenAIBackend", "client_usage"]


class OpenAIBackend(Backend):
    kind: ClassVar[str] = "openai"
    default_capabilities: ClassVar[Capabilities] = OPENAI_CAPABILITIES
    health_path: ClassVar[str] = "/models"  # relative to base_url
    endpoints: frozenset[Endpoint] = frozenset(
        {Endpoint.COMPLETIONS, Endpoint.CHAT, Endpoint.EMBEDDINGS, Endpoint.RERANK, Endpoint.RESPONSES}
    )
    chat_capabilities: ChatCapabilities | None = OPENAI_CHAT
    embedding_capabilities: PoolingCapabilities | None = OPENAI_EMBEDDINGS
    rerank_capabilities: PoolingCapabilities | None = OPENAI_RERANK
    # Responses: OpenAI's own endpoint, relayed (backends.responses.native).
    responses_capabilities: ResponsesTable | None = OPENAI_RESPONSES
    responses_native: ClassVar[bool] = True

    def __init__(self, config: OpenAIBackendConfig, transport: HTTPTransport | None = None) -> None:
        super().__init__(config.name, self.default_capabilities.with_overrides(config.capabilities))
        self.config = config
        self._wire = OpenAIWire(config, transport)
        self.base_url = self._wire.base_url
        self._chat_max_tokens: MaxTokensField | None = config.chat_max_tokens_field
        self._status_error = self.status_error  # bound once: passed on every call
        self._upstream_store = config.upstream_store
        if config.upstream_store:  # the upstream keeps Responses: its stateful fields are served too
            self.responses_capabilities = OPENAI_RESPONSES_UPSTREAM_STORE

    # --- request ----------------------------------------------------------------------
    def chat_payload(self, call: ChatCall) -> dict[str, Any]:
        """The upstream JSON body for a chat call (before serialisation)."""
        assert self.chat_capabilities is not None
        return chat_payload(
            call, self.chat_capabilities, max_tokens_field=self._chat_max_tokens, stream_usage=self._wire.stream_usage
        )

    def status_error(self, status: int, data: bytes, retry_after: str | None) -> UpstreamError:
        """A non-200 answer as our error (``backends.errors``)."""
        return error_from_upstream_body(status, data, retry_after, self.name)

    # --- protocol ----------------------------------------------------------------------
    async def complete(self, call: UpstreamCall) -> CompletionResult:
        wire = self._wire
        fields = wire.completion_fields(call, self.capabilities)
        data = await wire.post_read(wire.completions_url, fields, call, self._status_error)
        return relay_completion_body(data, call, self.name)

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        wire = self._wire
        fields = wire.completion_fields(call, self.capabilities)
        resp = await wire.post(wire.completions_url, fields, call, self._status_error, stream=True)
        return wire.relay(OpenAIStreamRelay, resp, call)

    async def chat(self, call: ChatCall) -> CompletionResult:
        wire = self._wire
        data = await wire.post_read(wire.chat_url, self.chat_payload(call), call, self._status_error)
        return relay_chat_body(data, call, self.name)

    async def chat_stream(self, call: ChatCall) -> CompletionStream:
        wire = self._wire
        resp = await wire.post(wire.chat_url, self.chat_payload(call), call, self._status_error, stream=True)
        return wire.relay(ChatStreamRelay, resp, call)

    # --- embeddings and rerank (translator: backends.openai.pooling) -----------------------
    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        assert self.embedding_capabilities is not None
        fields = embedding_payload(call, self.embedding_capabilities)
        data = await self._wire.post_read(self._wire.embeddings_url, fields, call, self._status_error)
        return relay_embeddings(data, call, self.name)

    async def rerank(self, call: RerankCall) -> CompletionResult:
        assert self.rerank_capabilities is not None
        fields = rerank_payload(call, self.rerank_capabilities)
        data = await self._wire.post_read(self._wire.rerank_url, fields, call, self._status_error)
        return rerank_result(data, call, self.name)

    # --- responses (translator: backends.responses.native) ---------------------------------
    async def responses(self, call: ResponsesCall) -> CompletionResult:
        data = await self._wire.post_read(
            self._wire.responses_url,
            native_payload(call, upstream_store=self._upstream_store),
            call,
            self._status_error,
        )
        return relay_response_body(data, call, self.name)

    async def responses_stream(self, call: ResponsesCall) -> CompletionStream:
        wire = self._wire
        resp = await wire.post(
            wire.responses_url,
            native_payload(call, upstream_store=self._upstream_store),
            call,
            self._status_error,
            stream=True,
        )
        return NativeResponseEvents(resp, call, self.name, max_event=wire.max_event)

    async def health(self) -> bool:
        return await self._wire.healthy(self.base_url + self.health_path)

    async def close(self) -> None:
        await self._wire.close()
