"""What Hugging Face TGI honours (``/generate`` for completions, the Messages API for chat), one table per endpoint."""

from __future__ import annotations

from backends.capabilities import AUDIT_USER_NOTE, Level
from backends.chat_capabilities import ChatCapabilities, Exclusive
from backends.emulation.fanout_plan import FANOUT_RULES
from backends.native.common import (
    ECHO_LOGPROBS_RULE,
    STRUCTURAL_TAG_RULE,
    TOKEN_PROMPT_RULE,
    NativeCapabilities,
    empty_prompt_rule,
)
from backends.responses.capabilities import ResponsesCapabilities

__all__ = ["TGI_CAPABILITIES", "TGI_CHAT", "TGI_RESPONSES"]

N, T, E, U = Level.NATIVE, Level.TRANSLATED, Level.EMULATED, Level.UNSUPPORTED

# --- completions: unlisted fields are unsupported (a native API does only what its translator maps)

_EMPTY_PROMPT_RULE = empty_prompt_rule('TGI refuses empty `inputs` (422 "`inputs` cannot be empty")')
TGI_CAPABILITIES = NativeCapabilities.build(
    {
        "model": T, "prompt": T, "best_of": E, "echo": E, "frequency_penalty": T, "logprobs": T,
        "max_tokens": T, "n": E, "seed": T, "stop": E, "stream": T, "stream_options": E,
        "temperature": T, "top_p": T, "user": E, "top_k": T, "repetition_penalty": T,
        "include_stop_str_in_output": E, "guided_json": T, "guided_regex": T, "guided_choice": T, "response_format": T,
    },
    rules=(TOKEN_PROMPT_RULE, _EMPTY_PROMPT_RULE, ECHO_LOGPROBS_RULE, STRUCTURAL_TAG_RULE, *FANOUT_RULES),
    limits={"logprobs": 5},
).with_notes({"user": AUDIT_USER_NOTE})  # fmt: skip

# --- TGI Messages API (v3.3.7): unlisted fields are unsupported -------------------------------

# router/src/infer/tool_grammar.rs: every call is generated under a JSON grammar built from the
# function's properties and required (additionalProperties false), whatever strict says; TGI's
# FunctionDefinition has no strict key. What that grammar drops is refused in backends.native.tgi_chat.
TGI_STRICT_NOTE = (
    "TGI's tool grammar always holds a call's arguments to the function's properties and required "
    "(no extra keys), so strict is not sent; a strict tool whose parameters need more at the top "
    "(`$defs`, `anyOf`, ...) is refused"
)

TGI_CHAT = ChatCapabilities.build(
    U,
    {
        "messages": N, "model": T, "max_completion_tokens": T, "frequency_penalty": N, "top_logprobs": N,
        "response_format": T, "stream": N, "stop": N, "logprobs": N, "max_tokens": N, "n": E, "seed": N,
        "stream_options": N, "temperature": N, "top_p": N, "tools": N, "tool_choice": N,
        "parallel_tool_calls": N, "user": E,
    },
    {
        "messages=input_audio": U, "messages=file": U, "tools=custom": U, "tool_choice=custom": U,
        "tool_choice=allowed_tools": U, "stream_options=continuous_usage_stats": U,
        "stream_options=include_obfuscation": U, "tools=strict": N,
    },
    limits={"top_logprobs": 5},
    exclusive=(Exclusive(("tools", "response_format"), "TGI refuses a grammar and tools together"),),
    reasons={
        "presence_penalty": "TGI turns presence_penalty into repetition_penalty = presence_penalty + 2",
        "logit_bias": "TGI accepts logit_bias but does not apply it",
        "top_logprobs>5": "TGI returns at most max_top_n_tokens (default 5) alternatives",
    },
    notes={"user": AUDIT_USER_NOTE, "tools=strict": TGI_STRICT_NOTE},
)  # fmt: skip

# --- responses: through the chat translator (TGI's Messages API), so derived from the chat table ---------

TGI_RESPONSES = ResponsesCapabilities.bridged(TGI_CHAT)
