"""vLLM server versions: parsing, and what each version does with our fields (both endpoints).

Why this exists: vLLM changed its Completions API under our users (see
``shared/spec/completions-protocol.md`` section 6). From 0.10.1 unknown fields
are *ignored*, so a field a version dropped fails open with HTTP 200: ``guided_*``
from 0.12 (output comes back unconstrained), ``best_of`` from 0.12 (refused by
V1 from 0.10), ``early_stopping`` since the beam-search rewrite, and no V1
structured-output backend applies a per-request whitespace pattern. Each field
is therefore forwarded, translated, emulated or refused *by version*.

:class:`VLLMFeatures` states the behaviour of one version as booleans, with the
version boundaries in one table (:data:`BOUNDARIES`) so they can be read and
tested in one place; :class:`VLLMChatFeatures` adds chat's boundaries
(:data:`CHAT_BOUNDARIES`) and the server's tool parser. ``backends.vllm.capabilities``
turns features into the frozen capability tables the router checks per request.

An unknown version (no ``GET /version`` answer and no ``version:`` pin) gets the
features that cannot fail open: structured output refused, best_of and greedy
``n`` emulated (both work on every version).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "BOUNDARIES",
    "CHAT_BOUNDARIES",
    "COMPLETIONS_EXTRAS_SINCE",
    "VLLM_MAX_LOGPROBS",
    "VLLMChatFeatures",
    "VLLMFeatures",
    "VLLMVersion",
    "parse_version",
]


class VLLMVersion(NamedTuple):
    major: int
    minor: int
    patch: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> VLLMVersion | None:
    """``"0.32.0"``, ``"0.6.3.post1"``, ``"0.11.1rc2.dev5+gabc"`` -> (major, minor, patch); else None.

    A pre-release of x.y.z is treated as x.y.z: vLLM's protocol changes land
    before the release, so the pre-release already has the new behaviour.
    """
    match = _VERSION.match(text)
    if match is None:
        return None
    return VLLMVersion(int(match[1]), int(match[2]), int(match[3] or 0))


# First version with each behaviour (sources: spec section 6 and the 0.32.0 wheel).
BOUNDARIES: dict[str, VLLMVersion] = {
    # V1 became the default engine; it applies no per-request whitespace pattern.
    "v1_engine": VLLMVersion(0, 8, 0),
    # V1 answers 400 "vLLM V1 does not yet support best_of" (0.10.1.1, 0.11); removed (ignored) in 0.12.
    "no_native_best_of": VLLMVersion(0, 10, 0),
    # ``structured_outputs`` accepted; guided_* deprecated but still honoured in 0.11.
    "structured_outputs": VLLMVersion(0, 11, 0),
    # guided_* removed: ignored with a log line, output unconstrained.
    "no_guided_fields": VLLMVersion(0, 12, 0),
    # "n must be 1 when using greedy sampling".
    "no_greedy_n": VLLMVersion(0, 12, 0),
    # Beam search moved to its own parameters (BeamSearchParams) without early_stopping.
    "no_early_stopping": VLLMVersion(0, 6, 3),
    # ``return_token_ids`` (token_ids / prompt_token_ids in the answer).
    "return_token_ids": VLLMVersion(0, 11, 0),
    # ``truncation_side``: first seen in the 0.32.0 wheel (not in 0.12.0).
    "truncation_side": VLLMVersion(0, 32, 0),
    # /v1/completions' ``response_format`` (checked in the 0.6.3, 0.7.3, 0.10.1.1, 0.11.0 and 0.12.0 wheels):
    # every version validates json_object, json_schema (and from 0.10.1 structural_tag), but before
    # 0.12 applies json_object alone (as guided_json_object; 0.11 only next to another structured
    # output) and ignores the others with HTTP 200. From 0.12 all three become structured_outputs.
    "response_format": VLLMVersion(0, 12, 0),
}

# vLLM's ModelConfig default for --max-logprobs (it bounds logprobs and prompt_logprobs).
VLLM_MAX_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class VLLMFeatures:
    """What one vLLM version does with the fields whose handling changed."""

    version: VLLMVersion | None  # None: unknown
    structured_outputs: bool  # send guided_* as ``structured_outputs`` (>= 0.11)
    guided_fields: bool  # top-level guided_* honoured (< 0.12)
    native_best_of: bool  # best_of > n honoured server-side (< 0.10)
    greedy_n: bool  # n > 1 with temperature 0 accepted (< 0.12)
    whitespace_pattern: bool  # guided_whitespace_pattern applied (V0 engine, < 0.8)
    per_request_backend: bool  # guided_decoding_backend has somewhere to go (< 0.11)
    early_stopping: bool  # beam search honours early_stopping (< 0.6.3)
    return_token_ids: bool = False  # token ids in the answer when asked (>= 0.11)
    truncation_side: bool = False  # truncation_side honoured (>= 0.32)

    @classmethod
    def of(cls, version: VLLMVersion | None) -> VLLMFeatures:
        if version is None:
            # Nothing that could come back unconstrained or silently different.
            return cls(None, False, False, False, False, False, False, False, False, False)
        return cls(
            version=version,
            structured_outputs=version >= BOUNDARIES["structured_outputs"],
            guided_fields=version < BOUNDARIES["no_guided_fields"],
            native_best_of=version < BOUNDARIES["no_native_best_of"],
            greedy_n=version < BOUNDARIES["no_greedy_n"],
            whitespace_pattern=version < BOUNDARIES["v1_engine"],
            per_request_backend=version < BOUNDARIES["structured_outputs"],
            early_stopping=version < BOUNDARIES["no_early_stopping"],
            return_token_ids=version >= BOUNDARIES["return_token_ids"],
            truncation_side=version >= BOUNDARIES["truncation_side"],
        )

    @property
    def structured_output(self) -> bool:
        """Whether guided_* constraints can be sent in a form this version applies."""
        return self.structured_outputs or self.guided_fields

    @property
    def label(self) -> str:
        return str(self.version) if self.version is not None else "unknown"


# First version with each chat behaviour (spec "vLLM ChatCompletionRequest by version").
CHAT_BOUNDARIES: dict[str, VLLMVersion] = {
    "continue_final_message": VLLMVersion(0, 6, 3),  # and priority
    "max_completion_tokens": VLLMVersion(0, 6, 4),  # and request_id; translated to max_tokens before
    "tool_choice_none": VLLMVersion(0, 6, 4),  # PR #10000; 400 before
    "tool_choice_required": VLLMVersion(0, 8, 3),
    "mm_processor_kwargs": VLLMVersion(0, 7, 3),  # in chat (spec: 0.7.0 -> 0.7.3)
    "cache_salt": VLLMVersion(0, 9, 0),  # and kv_transfer_params (0.8.5 has neither)
    "allowed_token_ids": VLLMVersion(0, 9, 2),  # in chat (completions: every version); 0.9.0 has none
    "bad_words": VLLMVersion(0, 9, 2),  # and vllm_xargs
    "reasoning_effort": VLLMVersion(0, 10, 1),
    "parallel_tool_calls_false": VLLMVersion(0, 12, 0),  # keeps the first call; ignored before
    "forced_tools_need_parser": VLLMVersion(0, 14, 0),  # PR #30613: named/required need a parser
    # A function tool's strict: true constrains its arguments (PRs #45003, #45600; checked in the
    # 0.23.0 / 0.24.0 wheels). Before: ignored with HTTP 200 (0.6.5+) or 400 extra_forbidden.
    "tools_strict": VLLMVersion(0, 24, 0),
    "repetition_detection": VLLMVersion(0, 18, 0),
    "watermarking": VLLMVersion(0, 30, 0),  # vLLM issue #58191 reports it new in 0.30.0
    # First seen in the 0.32.0 wheel (0.12.0 has none of them): logprob_token_ids, session_id,
    # thinking_token_budget, stream_interval, media_io_kwargs (PR #34778, March 2026),
    # ec_transfer_params, routed_experts_prompt_start. An earlier server may have some; the gateway
    # refuses what it cannot show a server honours (from 0.6.5 an unknown key is ignored with HTTP 200).
    "vllm_0_32_extras": VLLMVersion(0, 32, 0),
}


# First version whose /v1/completions honours each of vLLM's own fields that chat takes too
# (schemas.vllm_extras). Before it a server refuses the key (extra=forbid) or drops it with HTTP 200
# (extra=allow, spec section 6.1): the gateway refuses it by name, and on an unknown version too.
COMPLETIONS_EXTRAS_SINCE: dict[str, VLLMVersion] = {
    "priority": CHAT_BOUNDARIES["continue_final_message"],  # with priority scheduling (0.6.3)
    "request_id": VLLMVersion(0, 10, 1),  # spec section 2 (chat: 0.6.4)
    "cache_salt": CHAT_BOUNDARIES["cache_salt"],
    "kv_transfer_params": CHAT_BOUNDARIES["cache_salt"],
    "vllm_xargs": CHAT_BOUNDARIES["bad_words"],  # added to both endpoints at once (0.9.2)
    "repetition_detection": CHAT_BOUNDARIES["repetition_detection"],
    "watermarking": CHAT_BOUNDARIES["watermarking"],
    # prompt_embeds (in the 0.10.1.1 wheel's CompletionRequest; spec section 2); each server also
    # needs --enable-prompt-embeds, without which it answers 400 naming the field.
    "prompt_embeds": VLLMVersion(0, 10, 1),
    # Not in the 0.12.0 wheel's CompletionRequest (chat had bad_words from 0.9.2); in 0.32.0's.
    **dict.fromkeys(
        (
            "bad_words", "logprob_token_ids", "session_id", "thinking_token_budget", "stream_interval",
            "ec_transfer_params", "routed_experts_prompt_start",
        ),
        CHAT_BOUNDARIES["vllm_0_32_extras"],
    ),
}  # fmt: skip


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
