"""What the ``mock`` simulator honours, one table per endpoint.

It accepts OpenAI's fields (sampling hints that change no simulated text included) and refuses
vLLM's extras and what it cannot simulate (audio, predictions, custom tools) by name.
"""

from __future__ import annotations

from backends.capabilities import Capabilities, Level, Rule
from backends.chat_capabilities import VLLM_CHAT_EXTRAS, ChatCapabilities
from backends.pooling_capabilities import BINARY_REASON, PoolingRule, embedding_table, rerank_table
from backends.responses.capabilities import ResponsesCapabilities
from schemas.completions import VLLM_EXTRA_FIELDS
from schemas.embeddings import VLLM_EMBEDDING_EXTRAS
from schemas.rerank import VLLM_RERANK_EXTRAS

__all__ = ["MOCK_CAPABILITIES", "MOCK_CHAT", "MOCK_DIMENSIONS", "MOCK_EMBEDDINGS", "MOCK_RERANK", "MOCK_RESPONSES"]

N, T, U = Level.NATIVE, Level.TRANSLATED, Level.UNSUPPORTED

# --- completions (backends.mock.completions) ------------------------------------------------

MOCK_CAPABILITIES = (
    Capabilities.of(N, **{**dict.fromkeys(VLLM_EXTRA_FIELDS, U), "response_format": N}, suffix=U)
    .with_limits({"logprobs": 5})  # OpenAI's bound, which the mock imitates
    .with_rules(
        (
            Rule(
                "response_format",
                "the simulator writes JSON (json_object, json_schema), not structural tags",
                lambda r: r.response_format is not None and r.response_format.type == "structural_tag",
            ),
        )
    )
)

# --- chat (backends.mock.chat): hints that change no simulated text are accepted --------------

MOCK_CHAT = ChatCapabilities.build(
    N,
    {
        **dict.fromkeys(VLLM_CHAT_EXTRAS - {"min_tokens", "ignore_eos"}, U),
        "modalities": U, "audio": U, "prediction": U, "web_search_options": U, "functions": U, "function_call": U,
    },
    {
        "tools=custom": U, "tool_choice=custom": U, "stream_options=continuous_usage_stats": U,
        "stream_options=include_obfuscation": U,
    },
)  # fmt: skip

# --- responses: through the chat translator (the chat simulator), so derived from the chat table ---------

MOCK_RESPONSES = ResponsesCapabilities.bridged(MOCK_CHAT)

# --- embeddings and rerank (backends.mock.pooling): deterministic vectors, no vLLM extras ----

MOCK_DIMENSIONS = 256  # the mock's vector size

MOCK_EMBEDDINGS = embedding_table(
    N,
    dict.fromkeys(VLLM_EMBEDDING_EXTRAS, U),
    {"input=token_ids": N, "encoding_format=base64": N, "encoding_format=bytes": U, "encoding_format=bytes_only": U},
    reasons={"encoding_format=bytes": BINARY_REASON, "encoding_format=bytes_only": BINARY_REASON},
    rules=(
        PoolingRule(
            "dimensions",
            f"at most {MOCK_DIMENSIONS} (the mock's vector size)",
            lambda r: r.dimensions is not None and r.dimensions > MOCK_DIMENSIONS,
        ),
    ),
)
MOCK_RERANK = rerank_table(N, dict.fromkeys(VLLM_RERANK_EXTRAS, U), {"documents=object": T})
