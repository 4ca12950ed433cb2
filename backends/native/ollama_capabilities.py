"""What Ollama honours (native ``/api/generate`` and ``/api/chat``), one table per endpoint."""

from __future__ import annotations

from backends.capabilities import AUDIT_USER_NOTE, Level
from backends.chat_capabilities import ChatCapabilities
from backends.emulation.fanout_plan import FANOUT_RULES
from backends.native.common import (
    ECHO_LOGPROBS_RULE,
    STRUCTURAL_TAG_RULE,
    TOKEN_PROMPT_RULE,
    NativeCapabilities,
    empty_prompt_rule,
)
from backends.pooling_capabilities import BINARY_REASON, embedding_table
from backends.responses.capabilities import ResponsesCapabilities
from schemas.embeddings import VLLM_EMBEDDING_EXTRAS

__all__ = ["OLLAMA_CAPABILITIES", "OLLAMA_CHAT", "OLLAMA_EMBEDDINGS", "OLLAMA_RESPONSES"]

N, T, E, U = Level.NATIVE, Level.TRANSLATED, Level.EMULATED, Level.UNSUPPORTED

# --- completions: unlisted fields are unsupported (a native API does only what its translator maps)

_EMPTY_PROMPT_RULE = empty_prompt_rule('Ollama reads it as "load the model" and generates nothing (done_reason "load")')
OLLAMA_CAPABILITIES = NativeCapabilities.build(
    {
        "model": T, "prompt": T, "best_of": E, "echo": E, "frequency_penalty": T, "logprobs": T,
        "max_tokens": T, "n": E, "presence_penalty": T, "seed": T, "stop": T, "stream": T,
        "stream_options": E, "suffix": T, "temperature": T, "top_p": T, "user": E, "top_k": T,
        "min_p": T, "repetition_penalty": T, "guided_json": T, "response_format": T,
    },
    rules=(TOKEN_PROMPT_RULE, _EMPTY_PROMPT_RULE, ECHO_LOGPROBS_RULE, STRUCTURAL_TAG_RULE, *FANOUT_RULES),
    limits={"logprobs": 20},
).with_notes({"user": AUDIT_USER_NOTE})  # fmt: skip

# --- Ollama native /api/chat: options{}, format, images[]; unlisted fields are unsupported ------

OLLAMA_CHAT = ChatCapabilities.build(
    U,
    {
        "messages": T, "model": T, "reasoning_effort": T, "max_completion_tokens": T, "frequency_penalty": T,
        "presence_penalty": T, "top_logprobs": T, "response_format": T, "stream": T, "stop": T, "logprobs": T,
        "max_tokens": T, "n": E, "seed": T, "stream_options": E, "temperature": T, "top_p": T, "tools": T,
        "tool_choice": T, "parallel_tool_calls": N, "user": E, "top_k": T, "min_p": T, "repetition_penalty": T,
    },
    {
        "messages=remote_image_url": U, "messages=input_audio": U, "messages=file": U, "tools=custom": U,
        # Ollama has no tool_choice: "auto" is its only behaviour, "none" drops the tools.
        "tool_choice=required": U, "tool_choice=function": U, "tool_choice=custom": U,
        "tool_choice=allowed_tools": U, "parallel_tool_calls=false": U,
        "stream_options=continuous_usage_stats": U, "stream_options=include_obfuscation": U,
        # Its tool schema has no strict; a template-rendered model (the default) is parsed from free text.
        "tools=strict": U,
    },
    reasons={
        "messages=remote_image_url": "Ollama takes images only as data: URLs (base64)",
        "tool_choice=required": "Ollama cannot force a tool call (it has no tool_choice)",
        "tool_choice=function": "Ollama cannot force a tool call (it has no tool_choice)",
        "parallel_tool_calls=false": "Ollama cannot limit a reply to one tool call",
        "tools=strict": (
            "Ollama renders tools into the prompt and parses calls from the model's text: nothing holds "
            "the arguments to the function's parameters"
        ),
    },
    notes={"user": AUDIT_USER_NOTE},
)  # fmt: skip

# --- responses: through the chat translator (Ollama's /api/chat), so derived from the chat table ---------

OLLAMA_RESPONSES = ResponsesCapabilities.bridged(OLLAMA_CHAT)

# --- embeddings (native /api/embed: backends.native.ollama_embed): text only, floats only ----

_TEXT_ONLY = "the server embeds text only; token ids are never detokenised by the gateway (send the text)"

OLLAMA_EMBEDDINGS = embedding_table(
    T,
    {**dict.fromkeys(VLLM_EMBEDDING_EXTRAS, U), "user": E, "encoding_format": T},
    {"input=token_ids": U, "encoding_format=base64": E, "encoding_format=bytes": U, "encoding_format=bytes_only": U},
    reasons={
        "input=token_ids": _TEXT_ONLY,
        "encoding_format=bytes": BINARY_REASON,
        "encoding_format=bytes_only": BINARY_REASON,
    },
    notes={"user": AUDIT_USER_NOTE, "encoding_format=base64": "the gateway encodes the server's floats"},
)
