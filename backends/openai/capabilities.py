"""What the ``openai`` family (OpenAI-compatible APIs) honours, one table per endpoint.

Everything OpenAI documents is forwarded as sent (native); vLLM's extra fields are not
OpenAI's and are refused by name (a backend entry's ``capabilities:`` may say otherwise).
"""

from __future__ import annotations

from backends.capabilities import Capabilities, Level
from backends.chat_capabilities import VLLM_CHAT_EXTRAS, ChatCapabilities
from backends.pooling_capabilities import BINARY_REASON, PoolingRule, embedding_table, rerank_table
from backends.responses.capabilities import VLLM_RESPONSES_EXTRAS, ResponsesCapabilities
from schemas.completions import VLLM_EXTRA_FIELDS
from schemas.embeddings import VLLM_EMBEDDING_EXTRAS, EmbeddingRequest
from schemas.rerank import VLLM_RERANK_EXTRAS

__all__ = [
    "OPENAI_CAPABILITIES",
    "OPENAI_CHAT",
    "OPENAI_EMBEDDINGS",
    "OPENAI_MAX_REQUEST_TOKENS",
    "OPENAI_MAX_TOKENS_PER_INPUT",
    "OPENAI_RERANK",
    "OPENAI_RESPONSES",
    "OPENAI_RESPONSES_UPSTREAM_STORE",
    "UPSTREAM_STATE_FIELDS",
]

N, T, U = Level.NATIVE, Level.TRANSLATED, Level.UNSUPPORTED

# --- completions: OpenAI's own bound, logprobs 0..5 -----------------------------------------

OPENAI_CAPABILITIES = (
    Capabilities.of(N, **dict.fromkeys(VLLM_EXTRA_FIELDS, U))
    .with_limits({"logprobs": 5})
    .with_reasons(
        {
            "response_format": "OpenAI's completions has no response_format (a chat field)",
            "prompt_embeds": "OpenAI's completions has no prompt_embeds (a vLLM field)",
        }
    )
)

# --- chat: everything OpenAI documents; vLLM's extras are not OpenAI's ------------------------

OPENAI_CHAT = ChatCapabilities.build(
    N, dict.fromkeys(VLLM_CHAT_EXTRAS, U), {"stream_options=continuous_usage_stats": U}
)

# --- responses: OpenAI's own endpoint, everything forwarded (built-in tools included); the
# vLLM extras that vLLM's Responses request shares with chat are not OpenAI's -----------------

_VLLM_EXTRA = "a vLLM extra; OpenAI's Responses API has no such field"
# What only an upstream that keeps Responses can serve: refused while the gateway sends
# ``store: false`` (``backends[].upstream_store``, off by default: the gateway's store is the only copy).
UPSTREAM_STATE_FIELDS = frozenset({"background", "conversation"})
_NO_UPSTREAM_STORE = (
    "it needs the upstream to keep the response, and this backend's upstream store is off "
    "(backends[].upstream_store: true turns it on)"
)

OPENAI_RESPONSES = ResponsesCapabilities.native(
    VLLM_RESPONSES_EXTRAS | UPSTREAM_STATE_FIELDS,
    {**dict.fromkeys(VLLM_RESPONSES_EXTRAS, _VLLM_EXTRA), **dict.fromkeys(UPSTREAM_STATE_FIELDS, _NO_UPSTREAM_STORE)},
)
# ``upstream_store: true``: the upstream keeps its copy, so its stateful fields are forwarded too.
OPENAI_RESPONSES_UPSTREAM_STORE = ResponsesCapabilities.native(
    VLLM_RESPONSES_EXTRAS, dict.fromkeys(VLLM_RESPONSES_EXTRAS, _VLLM_EXTRA)
)

# --- embeddings (backends.openai.pooling): OpenAI's limits on token-id input; no vLLM extras ---

OPENAI_MAX_TOKENS_PER_INPUT = 8192  # OpenAI's embedding models
OPENAI_MAX_REQUEST_TOKENS = 300_000  # OpenAI: tokens summed over a request's inputs


def _longest_ids(request: EmbeddingRequest) -> int:
    return max(len(ids) for ids in request.inputs) if request.token_ids else 0


def _total_ids(request: EmbeddingRequest) -> int:
    return sum(len(ids) for ids in request.inputs) if request.token_ids else 0


OPENAI_EMBEDDINGS = embedding_table(
    N,
    dict.fromkeys(VLLM_EMBEDDING_EXTRAS, U),
    {"input=token_ids": N, "encoding_format=base64": N, "encoding_format=bytes": U, "encoding_format=bytes_only": U},
    reasons={"encoding_format=bytes": BINARY_REASON, "encoding_format=bytes_only": BINARY_REASON},
    rules=(
        PoolingRule(
            "input",
            f"at most {OPENAI_MAX_TOKENS_PER_INPUT} tokens per input on OpenAI's API",
            lambda r: _longest_ids(r) > OPENAI_MAX_TOKENS_PER_INPUT,
        ),
        PoolingRule(
            "input",
            f"at most {OPENAI_MAX_REQUEST_TOKENS} tokens per request on OpenAI's API",
            lambda r: _total_ids(r) > OPENAI_MAX_REQUEST_TOKENS,
        ),
    ),
)

# --- rerank: an OpenAI-compatible server's (Jina's shape): query, documents, top_n; the rest is ours

OPENAI_RERANK = rerank_table(
    N,
    {**dict.fromkeys(VLLM_RERANK_EXTRAS, U), "return_documents": T, "max_tokens_per_doc": U, "user": U},
    {"documents=object": T},
    reasons={"max_tokens_per_doc": "Cohere's v2 field; OpenAI-compatible rerank servers have no such field"},
)
