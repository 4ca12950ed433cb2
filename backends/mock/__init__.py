"""The built-in ``mock`` backend: SIMULATORS of every endpoint, no model anywhere.

One backend, one translator per endpoint, as for every family:

- ``completions`` (:mod:`backends.mock.completions`): deterministic text from a small
  vocabulary, ``n``/``best_of``/``echo``/``logprobs``/prompt batches, the legacy shapes;
- ``chat`` (:mod:`backends.mock.chat`): deterministic ``chat.completion`` answers: text,
  tool calls with arguments valid against each function's schema, JSON replies valid against
  a ``response_format`` schema (:mod:`backends.mock.json_schema`), chat logprobs, OpenAI's
  stream shape. Its capability tables are in :mod:`backends.mock.capabilities`;
- ``embeddings`` and ``rerank`` (:mod:`backends.mock.pooling`): deterministic vectors (words hashed
  into buckets, so texts sharing words are similar) and cosine scores.

Both pace streams by the entry's ``first_token_delay_ms`` / ``token_delay_ms``.
"""

from __future__ import annotations

from typing import ClassVar

from backends.base import (
    Backend,
    ChatCall,
    CompletionResult,
    CompletionStream,
    EmbeddingCall,
    RerankCall,
    ResponsesTable,
    UpstreamCall,
)
from backends.chat_capabilities import ChatCapabilities
from backends.mock.capabilities import MOCK_CAPABILITIES, MOCK_CHAT, MOCK_EMBEDDINGS, MOCK_RERANK, MOCK_RESPONSES
from backends.mock.chat import chat_result, chat_stream
from backends.mock.completions import FINGERPRINT, MOCK_CONTEXT_LENGTH, MockStream, complete_text, stream_text
from backends.mock.pooling import mock_embed, mock_rerank
from backends.pooling_capabilities import PoolingCapabilities
from schemas.config import MockBackendConfig
from schemas.endpoints import TOKENIZER_ENDPOINTS, Endpoint

__all__ = ["FINGERPRINT", "MOCK_CAPABILITIES", "MOCK_CONTEXT_LENGTH", "MockBackend", "MockStream"]


class MockBackend(Backend):
    kind: ClassVar[str] = "mock"
    endpoints: frozenset[Endpoint] = frozenset(Endpoint) - TOKENIZER_ENDPOINTS  # the mock has no tokenizer
    chat_capabilities: ChatCapabilities | None = MOCK_CHAT
    embedding_capabilities: PoolingCapabilities | None = MOCK_EMBEDDINGS
    rerank_capabilities: PoolingCapabilities | None = MOCK_RERANK
    responses_capabilities: ResponsesTable | None = MOCK_RESPONSES  # through the chat simulator

    def __init__(self, config: MockBackendConfig) -> None:
        super().__init__(config.name, MOCK_CAPABILITIES.with_overrides(config.capabilities))
        self.config = config
        self._delays = (config.first_token_delay_ms / 1000, config.token_delay_ms / 1000)

    def context_length(self, upstream_model: str) -> int | None:
        return MOCK_CONTEXT_LENGTH

    async def complete(self, call: UpstreamCall) -> CompletionResult:
        return complete_text(call)

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        return stream_text(call, *self._delays)

    async def chat(self, call: ChatCall) -> CompletionResult:
        return chat_result(call)

    async def chat_stream(self, call: ChatCall) -> CompletionStream:
        return chat_stream(call, *self._delays)

    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        return mock_embed(call)

    async def rerank(self, call: RerankCall) -> CompletionResult:
        return mock_rerank(call)
