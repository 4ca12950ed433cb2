"""Adapter for OpenAI-compatible HTTP APIs (OpenAI, Together, Fireworks, ...): completions and chat.

The request is forwarded as the client sent it (fields the client set, nulls
dropped), with ``model`` mapped to the route's upstream id. vLLM's extra
sampling fields are unsupported here unless the backend entry overrides its
capabilities; a field set to its neutral value is simply not forwarded.
Chat (``POST {base_url}/chat/completions``) is translated by ``backends.openai.chat``
against the chat table :data:`~backends.openai.capabilities.OPENAI_CHAT`; embeddings and rerank
by ``backends.openai.pooling``; Responses (``POST {base_url}/responses``, built-in tools included)
is relayed by ``backends.responses.native``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from backends.base import (
    Backend,
    Call,
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
from backends.openai.capabilities import OPENAI_CAPABILITIES, OPENAI_CHAT, OPENAI_RESPONSES
from backends.openai.chat import ChatStreamRelay, MaxTokensField, ask_stream_usage, chat_payload, relay_chat_body
from backends.openai.pooling import (
    OPENAI_EMBEDDINGS,
    OPENAI_RERANK,
    embedding_payload,
    relay_embeddings,
    rerank_payload,
    rerank_result,
)
from backends.openai.relay import OpenAIStreamRelay, relay_completion_body
from backends.pooling_capabilities import PoolingCapabilities
from backends.responses.native import NativeResponseEvents, native_payload, relay_response_body
from backends.transport import HTTPTransport, get_ok, make_transport
from backends.transport.base import UpstreamResponse, refuse_status
from schemas.config import OpenAIBackendConfig, VLLMBackendConfig
from schemas.endpoints import Endpoint

__all__ = ["OpenAIBackend", "client_usage"]

_JSON = "application/json"


def client_usage(call: Call[Any]) -> tuple[bool, bool]:
    """(a usage chunk, usage in every chunk): what the client asked for, whatever the gateway asked upstream.

    Per-chunk usage needs ``include_usage`` too, as on vLLM itself.
    """
    options = call.request.stream_options
    wants_usage = bool(options and options.include_usage)
    return wants_usage, wants_usage and bool(options and options.continuous_usage_stats)


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

    def __init__(self, config: OpenAIBackendConfig | VLLMBackendConfig, transport: HTTPTransport | None = None) -> None:
        super().__init__(config.name, self.default_capabilities.with_overrides(config.capabilities))
        self.config = config
        self.base_url = str(config.base_url).rstrip("/")
        self._url = self.base_url + "/completions"
        self._chat_url = self.base_url + "/chat/completions"
        self._embeddings_url = self.base_url + "/embeddings"
        self._rerank_url = self.base_url + "/rerank"
        self._responses_url = self.base_url + "/responses"
        # vLLM keeps the client's name (its dialect renames per version: backends.vllm.chat).
        self._chat_max_tokens: MaxTokensField | None = (
            config.chat_max_tokens_field if isinstance(config, OpenAIBackendConfig) else None
        )
        self._transport = transport if transport is not None else make_transport(config)
        headers = {name: value.get_secret_value() for name, value in config.headers.items()}
        headers["Content-Type"] = _JSON
        if config.api_key is not None:
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        self._headers = headers
        self._stream_usage = config.stream_usage
        self._max_event = config.limits.max_event_bytes

    # --- request ----------------------------------------------------------------------
    def payload(self, call: UpstreamCall) -> dict[str, Any]:
        """The upstream JSON body for this call (before serialisation)."""
        fields = call.request.upstream_fields()
        # Only neutral values of unsupported fields can get here (the capability check ran).
        self.capabilities.strip_unsupported(fields)
        fields["model"] = call.upstream_model
        if fields.get("stream") and self._stream_usage:
            ask_stream_usage(fields)
        return fields

    def chat_payload(self, call: ChatCall) -> dict[str, Any]:
        """The upstream JSON body for a chat call (before serialisation)."""
        assert self.chat_capabilities is not None
        return chat_payload(
            call, self.chat_capabilities, max_tokens_field=self._chat_max_tokens, stream_usage=self._stream_usage
        )

    def status_error(self, status: int, data: bytes, retry_after: str | None) -> UpstreamError:
        """A non-200 answer as our error (``backends.errors``)."""
        return error_from_upstream_body(status, data, retry_after, self.name)

    def _request_headers(self, call: Call[Any]) -> dict[str, str]:
        return call.headers(self._headers)

    # Both send through the transport themselves, not through send_ok: one coroutine less per
    # request on the hot path; any status but 200 takes the one shared path (refuse_status).
    async def _post(self, url: str, fields: dict[str, Any], call: Call[Any], *, stream: bool) -> UpstreamResponse:
        """POST one body; a non-200 answer raises (``status_error``). Both endpoints' streams send through here."""
        resp = await self._transport.send(
            "POST", url, body=orjson.dumps(fields), headers=self._request_headers(call), stream=stream
        )
        if resp.status != 200:
            await refuse_status(resp, self.status_error)
        return resp

    async def _post_read(self, url: str, fields: dict[str, Any], call: Call[Any]) -> bytes:
        """POST one body and read the whole answer (non-streamed calls); a non-200 answer raises."""
        resp = await self._transport.send(
            "POST", url, body=orjson.dumps(fields), headers=self._request_headers(call), stream=False
        )
        if resp.status != 200:
            await refuse_status(resp, self.status_error)
        try:
            return await resp.read()
        finally:
            resp.release()

    # --- protocol ----------------------------------------------------------------------
    async def complete(self, call: UpstreamCall) -> CompletionResult:
        return self.translate_body(await self._post_read(self._url, self.payload(call), call), call)

    def translate_body(self, data: bytes, call: UpstreamCall) -> CompletionResult:
        return relay_completion_body(data, call, self.name)

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        resp = await self._post(self._url, self.payload(call), call, stream=True)
        return self._relay(OpenAIStreamRelay, resp, call)

    async def chat(self, call: ChatCall) -> CompletionResult:
        return relay_chat_body(await self._post_read(self._chat_url, self.chat_payload(call), call), call, self.name)

    async def chat_stream(self, call: ChatCall) -> CompletionStream:
        resp = await self._post(self._chat_url, self.chat_payload(call), call, stream=True)
        return self._relay(ChatStreamRelay, resp, call)

    # --- embeddings and rerank (translator: backends.openai.pooling) -----------------------
    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        assert self.embedding_capabilities is not None
        fields = embedding_payload(call, self.embedding_capabilities)
        return relay_embeddings(await self._post_read(self._embeddings_url, fields, call), call, self.name)

    async def rerank(self, call: RerankCall) -> CompletionResult:
        assert self.rerank_capabilities is not None
        fields = rerank_payload(call, self.rerank_capabilities)
        return rerank_result(await self._post_read(self._rerank_url, fields, call), call, self.name)

    async def responses(self, call: ResponsesCall) -> CompletionResult:
        data = await self._post_read(self._responses_url, native_payload(call), call)
        return relay_response_body(data, call, self.name)

    async def responses_stream(self, call: ResponsesCall) -> CompletionStream:
        resp = await self._post(self._responses_url, native_payload(call), call, stream=True)
        return NativeResponseEvents(resp, call, self.name, max_event=self._max_event)

    def _relay(self, relay: type[OpenAIStreamRelay], resp: UpstreamResponse, call: Call[Any]) -> OpenAIStreamRelay:
        wants_usage, wants_continuous = client_usage(call)
        return relay(
            resp,
            call,
            self.name,
            client_wants_usage=wants_usage,
            client_wants_continuous_usage=wants_continuous,
            max_event=self._max_event,
        )

    async def health(self) -> bool:
        headers = {k: v for k, v in self._headers.items() if k != "Content-Type"}
        return await get_ok(self._transport, self.health_url(), headers) is not None

    def health_url(self) -> str:
        return self.base_url + self.health_path

    async def close(self) -> None:
        await self._transport.close()
