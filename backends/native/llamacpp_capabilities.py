"""What llama.cpp's server honours (``/completion`` and ``/v1/chat/completions``), one table per endpoint."""

from __future__ import annotations

from backends.capabilities import AUDIT_USER_NOTE, Level
from backends.chat_capabilities import ChatCapabilities, Exclusive
from backends.emulation.fanout_plan import FANOUT_RULES
from backends.native.common import ECHO_LOGPROBS_RULE, STRUCTURAL_TAG_RULE, NativeCapabilities
from backends.pooling_capabilities import BINARY_REASON, embedding_table
from backends.responses.capabilities import ResponsesCapabilities
from schemas.embeddings import VLLM_EMBEDDING_EXTRAS

__all__ = ["LLAMACPP_CAPABILITIES", "LLAMACPP_CHAT", "LLAMACPP_EMBEDDINGS", "LLAMACPP_RESPONSES"]

N, T, E, U = Level.NATIVE, Level.TRANSLATED, Level.EMULATED, Level.UNSUPPORTED

# --- completions: unlisted fields are unsupported (a native API does only what its translator maps)

LLAMACPP_CAPABILITIES = NativeCapabilities.build(
    {
        "model": T, "prompt": T, "best_of": E, "echo": E, "frequency_penalty": T, "logit_bias": T,
        "logprobs": T, "max_tokens": T, "n": E, "presence_penalty": T, "seed": T, "stop": T,
        "stream": T, "stream_options": E, "temperature": T, "top_p": T, "user": E, "top_k": T,
        "min_p": T, "repetition_penalty": T, "include_stop_str_in_output": E, "ignore_eos": T,
        "guided_json": T, "guided_choice": T, "guided_grammar": T, "response_format": T,
    },
    rules=(ECHO_LOGPROBS_RULE, STRUCTURAL_TAG_RULE, *FANOUT_RULES),
    limits={"logprobs": 5},
).with_notes({"user": AUDIT_USER_NOTE})  # fmt: skip

# --- llama.cpp server /v1/chat/completions ----------------------------------------------------

LLAMACPP_CHAT = ChatCapabilities.build(
    U,
    {
        "messages": N, "model": T, "max_completion_tokens": T, "frequency_penalty": N, "presence_penalty": N,
        "top_logprobs": N, "response_format": N, "stream": N, "stop": N, "logit_bias": N, "logprobs": N,
        "max_tokens": N, "n": E, "seed": N, "stream_options": N, "temperature": N, "top_p": N, "tools": N,
        "tool_choice": N, "parallel_tool_calls": N, "user": E, "top_k": N, "min_p": N, "repetition_penalty": T,
        "ignore_eos": N,
    },
    {
        "messages=file": U, "tools=custom": U, "tools=strict": N,
        # llama.cpp reads tool_choice as a string: an object silently falls back to "auto".
        "tool_choice=function": U, "tool_choice=custom": U, "tool_choice=allowed_tools": U,
        "stream_options=continuous_usage_stats": U, "stream_options=include_obfuscation": U,
    },
    exclusive=(
        Exclusive(("logprobs", "tools", "stream"), "llama.cpp cannot stream logprobs together with tools"),
    ),
    reasons={
        "tool_choice=function": "llama.cpp reads tool_choice as a string and would downgrade a named choice to auto",
    },
    # common/chat.cpp: each function's parameters become a grammar rule (resolve_refs + the JSON-schema
    # grammar), applied from the tool-call trigger on (from the start with "required"); strict is not read.
    notes={
        "user": AUDIT_USER_NOTE,
        "tools=strict": (
            "llama.cpp (--jinja) generates every tool call under a grammar built from the function's parameters "
            "schema, strict or not"
        ),
    },
)  # fmt: skip

# --- responses: through the chat translator (llama.cpp's chat endpoint), so derived from the chat table ---------

LLAMACPP_RESPONSES = ResponsesCapabilities.bridged(LLAMACPP_CHAT)

# --- embeddings (llama-server --embedding: backends.native.llamacpp_embed): floats only --------

LLAMACPP_EMBEDDINGS = embedding_table(
    N,
    {**dict.fromkeys(VLLM_EMBEDDING_EXTRAS, U), "user": E, "dimensions": U},
    {"input=token_ids": N, "encoding_format=base64": E, "encoding_format=bytes": U, "encoding_format=bytes_only": U},
    reasons={
        "dimensions": "llama.cpp's server cannot shorten embeddings",
        "encoding_format=bytes": BINARY_REASON,
        "encoding_format=bytes_only": BINARY_REASON,
    },
    notes={"user": AUDIT_USER_NOTE, "encoding_format=base64": "the gateway encodes the server's floats"},
)
