"""What the ``mock`` simulator honours, one table per endpoint.

It accepts OpenAI's fields (sampling hints that change no simulated text included) and refuses
vLLM's extras and what it cannot simulate (audio, predictions, custom tools) by name.
"""

from __future__ import annotations

from backends.capabilities import Capabilities, Level
from backends.chat_capabilities import VLLM_CHAT_EXTRAS, ChatCapabilities
from backends.responses.capabilities import ResponsesCapabilities
from schemas.completions import VLLM_EXTRA_FIELDS

__all__ = ["MOCK_CAPABILITIES", "MOCK_CHAT", "MOCK_RESPONSES"]

N, U = Level.NATIVE, Level.UNSUPPORTED

# --- completions (backends.mock.completions) ------------------------------------------------

MOCK_CAPABILITIES = Capabilities.of(N, **dict.fromkeys(VLLM_EXTRA_FIELDS, U), suffix=U).with_limits(
    {"logprobs": 5}  # OpenAI's bound, which the mock imitates
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
