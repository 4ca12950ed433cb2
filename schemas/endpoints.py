"""The APIs the gateway serves: one name per endpoint, used by config, routing, metrics and backends."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ENDPOINT_ALIASES", "ENDPOINT_PATHS", "POOLING_ENDPOINTS", "TOKENIZER_ENDPOINTS", "Endpoint"]


class Endpoint(StrEnum):
    COMPLETIONS = "completions"  # POST /v1/completions (legacy text completions)
    CHAT = "chat"  # POST /v1/chat/completions
    EMBEDDINGS = "embeddings"  # POST /v1/embeddings
    RERANK = "rerank"  # POST /v1/rerank (Jina/Cohere shape; also /v2/rerank and /rerank)
    RESPONSES = "responses"  # POST /v1/responses
    TOKENIZE = "tokenize"  # POST /tokenize (vLLM's API)
    DETOKENIZE = "detokenize"  # POST /detokenize (vLLM's API)


ENDPOINT_PATHS: dict[Endpoint, str] = {
    Endpoint.COMPLETIONS: "/v1/completions",
    Endpoint.CHAT: "/v1/chat/completions",
    Endpoint.EMBEDDINGS: "/v1/embeddings",
    Endpoint.RERANK: "/v1/rerank",
    Endpoint.RESPONSES: "/v1/responses",
    Endpoint.TOKENIZE: "/tokenize",
    Endpoint.DETOKENIZE: "/detokenize",
}

# More paths of the same endpoint (vLLM serves rerank on all three; Cohere's v2 SDK posts to /v2/rerank).
ENDPOINT_ALIASES: dict[Endpoint, tuple[str, ...]] = {Endpoint.RERANK: ("/v2/rerank", "/rerank")}

# Endpoints of pooling models (no generation). A model is served on them only when its
# ``endpoints`` lists them, or when its backends serve nothing else (tei, a pooling vllm-pool):
# an embedding model never defaults onto completions or chat, nor a generation model onto these.
POOLING_ENDPOINTS: frozenset[Endpoint] = frozenset({Endpoint.EMBEDDINGS, Endpoint.RERANK})

# The model's tokenizer (vLLM's API): nothing is generated, so a model is served on them by every
# route whose backend has them, whatever its ``endpoints`` lists.
TOKENIZER_ENDPOINTS: frozenset[Endpoint] = frozenset({Endpoint.TOKENIZE, Endpoint.DETOKENIZE})
