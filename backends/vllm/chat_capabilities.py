"""vLLM's chat table, per server version and tool parser (spec "vLLM ChatCompletionRequest by version").

Built on the shared chat capability type (``backends.chat_capabilities``) and on the
completions feature set of the same version (``backends.vllm.versions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from backends.capabilities import Level
from backends.chat_capabilities import CHAT_FIELDS, OPENAI_ONLY_FIELDS, ChatCapabilities
from backends.vllm.versions import VLLMFeatures, VLLMVersion, refusal_reasons

__all__ = ["CHAT_BOUNDARIES", "VLLMChatFeatures", "vllm_chat_capabilities"]

N, T, E, U = Level.NATIVE, Level.TRANSLATED, Level.EMULATED, Level.UNSUPPORTED

# First version with each chat behaviour (spec "vLLM ChatCompletionRequest by version").
CHAT_BOUNDARIES: dict[str, VLLMVersion] = {
    "continue_final_message": VLLMVersion(0, 6, 3),  # and priority
    "max_completion_tokens": VLLMVersion(0, 6, 4),  # and request_id; translated to max_tokens before
    "tool_choice_none": VLLMVersion(0, 6, 4),  # PR #10000; 400 before
    "tool_choice_required": VLLMVersion(0, 8, 3),
    "reasoning_effort": VLLMVersion(0, 10, 1),
    "parallel_tool_calls_false": VLLMVersion(0, 12, 0),  # keeps the first call; ignored before
    "forced_tools_need_parser": VLLMVersion(0, 14, 0),  # PR #30613: named/required need a parser
    # A function tool's strict: true constrains its arguments (PRs #45003, #45600; checked in the
    # 0.23.0 / 0.24.0 wheels). Before: ignored with HTTP 200 (0.6.5+) or 400 extra_forbidden.
    "tools_strict": VLLMVersion(0, 24, 0),
}


@dataclass(frozen=True, slots=True)
class VLLMChatFeatures:
    """What one vLLM server (version and tool parser) does with the chat fields whose handling changed."""

    base: VLLMFeatures
    tool_parser: str | None  # the server's --tool-call-parser (backend key ``tool_parser``)

    @classmethod
    def of(cls, version: VLLMVersion | None, tool_parser: str | None = None) -> VLLMChatFeatures:
        return cls(VLLMFeatures.of(version), tool_parser)

    def since(self, boundary: str) -> bool | None:
        """Whether the version has the behaviour; None when the version is unknown."""
        version = self.base.version
        return None if version is None else version >= CHAT_BOUNDARIES[boundary]


@lru_cache(maxsize=64)
def vllm_chat_capabilities(features: VLLMChatFeatures) -> ChatCapabilities:
    """The chat table of one vLLM server (cached: computed once per feature set)."""
    v = features.base.label
    unknown = "the vLLM server's version is unknown (no GET /version answer and no `version:` pin)"
    levels: dict[str, Level] = dict.fromkeys(OPENAI_ONLY_FIELDS, U)
    forms: dict[str, Level] = {"messages=file": U, "tools=custom": U, "tool_choice=custom": U}
    forms["tool_choice=allowed_tools"] = U
    forms["stream_options=include_obfuscation"] = U
    reasons = {k: w for k, w in refusal_reasons(features.base).items() if k in CHAT_FIELDS}
    # vLLM >= 0.6.5 ignores unknown keys with HTTP 200: forwarding these would drop them silently.
    reasons |= dict.fromkeys(OPENAI_ONLY_FIELDS, "an OpenAI-only field that vLLM ignores")
    levels |= dict.fromkeys(reasons, U)
    if features.base.structured_outputs:
        levels |= dict.fromkeys(("guided_json", "guided_regex", "guided_choice", "guided_grammar"), T)
    else:
        levels["structured_outputs"] = U
        reasons["structured_outputs"] = f"vLLM {v} has no structured_outputs field (from 0.11)"
    if not features.base.greedy_n:
        levels["n"] = E  # n > 1 with temperature 0: replicated greedy choice

    def gate(key: str, boundary: str, level_before: Level = U) -> None:
        has = features.since(boundary)
        if has:
            return
        target = forms if "=" in key else levels
        target[key] = level_before
        if level_before is U:
            since = CHAT_BOUNDARIES[boundary]
            reasons[key] = unknown if has is None else f"vLLM {v} does not honour {key} (from {since})"

    gate("max_completion_tokens", "max_completion_tokens", T)  # sent as max_tokens
    # Older servers refuse these with 400 (extra=forbid through 0.6.4), so only a known-old
    # version needs the gateway to refuse them; an unknown one answers for itself.
    if features.since("max_completion_tokens") is False:
        gate("request_id", "max_completion_tokens")
    if features.since("continue_final_message") is False:
        gate("continue_final_message", "continue_final_message")
        gate("priority", "continue_final_message")
    gate("reasoning_effort", "reasoning_effort")
    gate("parallel_tool_calls=false", "parallel_tool_calls_false")
    gate("tools=strict", "tools_strict")  # an older server would hand back unconstrained arguments
    if features.since("tools_strict") is False:
        since = CHAT_BOUNDARIES["tools_strict"]
        reasons["tools=strict"] = f"vLLM {v} cannot enforce a function tool's strict: true (from {since})"
    if features.since("tool_choice_none") is False:
        gate("tool_choice=none", "tool_choice_none")
    if features.since("tool_choice_required") is False:
        gate("tool_choice=required", "tool_choice_required")
    if features.tool_parser is None:
        no_parser = "the vLLM server runs no tool parser (set the backend's `tool_parser:`)"
        forms["tool_choice=auto"] = U
        reasons["tool_choice=auto"] = no_parser
        needs = features.since("forced_tools_need_parser")
        for form in ("required", "function"):
            if needs is not False and forms.get(f"tool_choice={form}") is not U:
                forms[f"tool_choice={form}"] = U
                reasons[f"tool_choice={form}"] = no_parser if needs else f"{no_parser}; {unknown}"
    return ChatCapabilities.build(N, levels, forms, reasons=reasons)
