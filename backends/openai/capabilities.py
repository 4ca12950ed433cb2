"""What the ``openai`` family (OpenAI-compatible APIs) honours, one table per endpoint.

Everything OpenAI documents is forwarded as sent (native); vLLM's extra fields are not
OpenAI's and are refused by name (a backend entry's ``capabilities:`` may say otherwise).
"""

from __future__ import annotations

from backends.capabilities import Capabilities, Level
from backends.chat_capabilities import VLLM_CHAT_EXTRAS, ChatCapabilities
from backends.responses.capabilities import VLLM_RESPONSES_EXTRAS, ResponsesCapabilities
from schemas.completions import VLLM_EXTRA_FIELDS

__all__ = ["OPENAI_CAPABILITIES", "OPENAI_CHAT", "OPENAI_RESPONSES"]

N, U = Level.NATIVE, Level.UNSUPPORTED

# --- completions: OpenAI's own bound, logprobs 0..5 -----------------------------------------

OPENAI_CAPABILITIES = Capabilities.of(N, **dict.fromkeys(VLLM_EXTRA_FIELDS, U)).with_limits({"logprobs": 5})

# --- chat: everything OpenAI documents; vLLM's extras are not OpenAI's ------------------------

OPENAI_CHAT = ChatCapabilities.build(
    N, dict.fromkeys(VLLM_CHAT_EXTRAS, U), {"stream_options=continuous_usage_stats": U}
)

# --- responses: OpenAI's own endpoint, everything forwarded (built-in tools included); the
# vLLM extras that vLLM's Responses request shares with chat are not OpenAI's -----------------

OPENAI_RESPONSES = ResponsesCapabilities.native(
    VLLM_RESPONSES_EXTRAS,
    dict.fromkeys(VLLM_RESPONSES_EXTRAS, "a vLLM extra; OpenAI's Responses API has no such field"),
)
